#!/usr/bin/env python3
"""Experts in other processes: tireless-shard over Cap'n Proto RPC, checked end to end.

  test_expert_shards.py --build build --model SmolLM2-135M-Instruct.Q4_1.gguf

The MoE is SmolLM2 upcycled by tools/upcycle_moe.py (8 experts, 2 per token, perturbed 0.05,
skewed router), cached under ~/.cache/tireless/models. Greedy text through tireless-generate:

1. through 1, 2 and 4 shard processes on loopback equals the single-process text;
2. f16 activations halve the request bytes and still write text;
3. a shard killed mid-generation (SIGKILL) while replicas hold its experts: the text is the
   same, the failure was seen, the replicas took over;
4. a supervised shard whose child is killed is restarted on the same socket: same text, one
   revival, the recovery time reported;
5. a shard whose supervisor gives up is fenced and its experts move: same text;
6. rebalancing replicates hot experts (same text, replicas made);
7. across two network namespaces joined by a veth pair (root only; skipped otherwise);
8. bad setups get clear errors: a dense model, no shard listening, a shard on another model;
9. tireless-serve with backend.expert_shard_addresses under concurrent HTTP requests, a
   supervised shard's child killed while they run: every request completes, and /metrics shows the
   failure, the revival, the recovery time and the per-expert counts.

Exits 77 (skipped) without the model, numpy or gguf.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
try:
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import upcycle_moe  # noqa: E402
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

failures: list[str] = []
SANITIZED = bool(os.environ.get("TIRELESS_SANITIZED"))


def check(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def moe_model(dense: str) -> str:
    """The upcycled MoE, made once and cached beside the dense model's cache."""
    cache = os.path.join(os.path.expanduser("~"), ".cache", "tireless", "models")
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, "SmolLM2-135M-moe8x2-p0.05-s1.gguf")
    if not os.path.exists(path):
        tmp = path + f".{os.getpid()}.tmp"
        upcycle_moe.upcycle(dense, tmp, 8, 2, 0.05, 1.0, 1)
        os.replace(tmp, path)
    return path


class Shards:
    """tireless-shard processes, stopped on exit."""

    def __init__(self, build: str, model: str, tmp: str):
        self.tool = os.path.join(build, "tools", "tireless-shard")
        self.model, self.tmp, self.procs, self.started = model, tmp, [], 0

    def start(self, *args: str, netns: str | None = None, listen: str = "127.0.0.1:0") -> tuple[subprocess.Popen, str]:
        self.started += 1
        port_file = os.path.join(self.tmp, f"{os.path.basename(self.model)}.{self.started}.port")
        cmd = [self.tool, "-m", self.model, "--listen", listen, "--port-file", port_file, "-t", "1", *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"tireless-shard did not start: {p.stderr.read()}")
            time.sleep(0.02)
        with open(port_file) as f:
            return p, f.read().strip()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []


STATS = re.compile(r"expert shards: (\d+) \((\d+) live, (\d+) fenced\); (\d+) layer calls; (\d+) request \+ (\d+) reply "
                   r"bytes per token row.*?(\d+) failures, (\d+) revivals, (\d+) replicas, last recovery ([\d.]+) ms")


OVERLAP = re.compile(r"expert overlap: \w+, (\d+) of \d+ layer calls overlapped")


def generate(build: str, model: str, prompt: str, n: int, shards: list[str] = (), extra: list[str] = (),
             on_output=None, netns: str | None = None) -> tuple[str, dict]:
    cmd = [os.path.join(build, "tools", "tireless-generate"), "-m", model, "--prompt", prompt, "-n", str(n), "-q",
           "-t", "1", *extra]
    for s in shards:
        cmd += ["--expert-shard", s]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    fired = on_output is None
    while True:
        chunk = p.stdout.read1(4096)
        if not chunk:
            break
        out += chunk
        if not fired and len(out) >= 24:
            fired = True
            on_output()
    err = p.stderr.read().decode()
    if p.wait(timeout=600) != 0:
        raise RuntimeError(f"tireless-generate failed ({p.returncode}): {err.strip()}")
    stats = {}
    if m := STATS.search(err):
        keys = ["shards", "live", "fenced", "calls", "req_bytes", "reply_bytes", "failures", "revivals", "replicas"]
        stats = {k: int(v) for k, v in zip(keys, m.groups()[:9])}
        stats["recovery_ms"] = float(m.group(10))
    elif shards:
        raise RuntimeError(f"no expert stats line in: {err}")
    if m := OVERLAP.search(err):
        stats["overlapped"] = int(m.group(1))
    return out.decode(), stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--server", help="tireless-serve (case 9)")
    ap.add_argument("--config", help="its shipped config (case 9)")
    a = ap.parse_args(argv)
    if not os.path.exists(a.model):
        print(f"skipped: no model at {a.model} (scripts/fetch-model)")
        return 77
    moe = moe_model(a.model)
    prompts = ["<|im_start|>user\nWhat is the capital of France? Answer in two sentences.<|im_end|>\n"
               "<|im_start|>assistant\n", "Once upon a time, in a small village by the sea,"]
    n = 8 if SANITIZED else 64
    with tempfile.TemporaryDirectory(prefix="tireless-shards-") as tmp:
        shards = Shards(a.build, moe, tmp)
        try:
            local = [generate(a.build, moe, p, n)[0] for p in prompts]
            check(all(len(t.strip()) > 0 for t in local), f"single-process text: {local[0][:40]!r}")

            # 1. 1, 2, 4 shard processes, round robin
            for count in ([2] if SANITIZED else [1, 2, 4]):
                addrs = [shards.start("--shard", str(i), "--of", str(count))[1] for i in range(count)]
                for p, want in zip(prompts, local):
                    got, st = generate(a.build, moe, p, n, addrs)
                    check(got == want, f"{count} shard process(es): greedy text equals the single process's "
                                       f"({st['calls']} layer calls, {st['req_bytes']} + {st['reply_bytes']} bytes "
                                       f"per token row)")
                if count == 2:
                    f32_bytes = st["req_bytes"]
                    for p, want in zip(prompts, local):
                        got, st = generate(a.build, moe, p, n, addrs, ["--batch", "3", "--overlap"])
                        check(got == want and st["overlapped"] > 0,
                              f"two micro-batches in ping-pong (3 sequences): same text, {st['overlapped']} of "
                              f"{st['calls']} layer calls overlapped")
                    got, st = generate(a.build, moe, prompts[1], n, addrs, ["--expert-f16"])
                    check(len(got.strip()) > 0 and st["req_bytes"] < 0.6 * f32_bytes,
                          f"f16 activations: {st['req_bytes']} request bytes per row (f32: {f32_bytes}); "
                          f"text {got[:40]!r}")
                    got, st = generate(a.build, moe, prompts[1], n, addrs, ["--expert-int8"])
                    check(len(got.split()) >= n // 4 and st["req_bytes"] < 0.35 * f32_bytes,
                          f"int8 activations: {st['req_bytes']} request bytes per row (f32: {f32_bytes}); "
                          f"text {got[:40]!r}")
                shards.stop()
            if SANITIZED:
                return 1 if failures else 0

            long_n = 160
            want = generate(a.build, moe, prompts[1], long_n)[0]

            # 3. a shard killed while replicas hold its experts
            sets = ["0,1,2,3,4,5", "4,5,6,7,0,1", "2,3,6,7"]  # every expert on two shards
            started = [shards.start("--experts", s) for s in sets]
            victim = started[1][0]
            got, st = generate(a.build, moe, prompts[1], long_n, [s[1] for s in started],
                               on_output=lambda: victim.send_signal(signal.SIGKILL))
            check(got == want and st["failures"] >= 1 and st["live"] == 2,
                  f"shard killed mid-generation, replicas elsewhere: same text, {st['failures']} failure(s), "
                  f"{st['live']} live; recovery {st['recovery_ms']:.1f} ms")
            shards.stop()
            started = [shards.start("--experts", s) for s in sets]
            victim = started[0][0]
            got, st = generate(a.build, moe, prompts[1], long_n, [s[1] for s in started], ["--batch", "3", "--overlap"],
                               on_output=lambda: victim.send_signal(signal.SIGKILL))
            check(got == want and st["failures"] >= 1 and st["live"] == 2 and st["overlapped"] > 0,
                  f"shard killed with two micro-batches in flight: same text, {st['failures']} failure(s), "
                  f"recovery {st['recovery_ms']:.1f} ms")
            shards.stop()

            # 4. a supervised shard restarted on the same socket
            _, a0 = shards.start("--shard", "0", "--of", "2")
            sup, a1 = shards.start("--shard", "1", "--of", "2", "--supervise")
            time.sleep(0.5)
            child = int(subprocess.run(["pgrep", "-P", str(sup.pid)], capture_output=True, text=True).stdout.split()[0])
            got, st = generate(a.build, moe, prompts[1], long_n, [a0, a1],
                               on_output=lambda: os.kill(child, signal.SIGKILL))
            check(got == want and st["failures"] >= 1 and st["revivals"] >= 1 and st["live"] == 2,
                  f"supervised shard killed and restarted: same text, {st['revivals']} revival(s); recovery "
                  f"{st['recovery_ms']:.1f} ms (kill to the layer's completion, model reload included)")
            shards.stop()

            # 5. fenced when its supervisor gives up
            _, a0 = shards.start("--shard", "0", "--of", "2")
            sup, a1 = shards.start("--shard", "1", "--of", "2", "--supervise", "--max-restarts", "0")
            time.sleep(0.5)
            child = int(subprocess.run(["pgrep", "-P", str(sup.pid)], capture_output=True, text=True).stdout.split()[0])
            got, st = generate(a.build, moe, prompts[1], long_n, [a0, a1], ["--revive-wait-ms", "2000"],
                               on_output=lambda: os.kill(child, signal.SIGKILL))
            check(got == want and st["fenced"] == 1 and st["live"] == 1,
                  f"a shard that stays down is fenced and its experts move: same text, {st['fenced']} fenced; "
                  f"recovery {st['recovery_ms']:.1f} ms")
            shards.stop()

            # 6. rebalancing
            addrs = [shards.start("--shard", str(i), "--of", "4")[1] for i in range(4)]
            got, st = generate(a.build, moe, prompts[1], long_n, addrs, ["--rebalance-every", "16", "--replicas", "2"])
            check(got == want and st["replicas"] > 0, f"rebalanced every 16 tokens: same text, {st['replicas']} "
                                                      f"replicas made")
            shards.stop()

            # 7. two network namespaces joined by a veth pair
            ns = netns_pair()
            if ns is None:
                print("skip  network namespaces: needs root and ip netns")
            else:
                try:
                    addrs = [shards.start("--shard", str(i), "--of", "2", netns=ns[1], listen=f"10.77.0.2:{7611 + i}")[1]
                             for i in range(2)]
                    got, st = generate(a.build, moe, prompts[1], n, addrs, netns=ns[0])
                    check(got == local[1], f"shards in another network namespace, over a veth pair ({addrs}): "
                                           f"same text")
                finally:
                    shards.stop()
                    for name in ns:
                        subprocess.run(["ip", "netns", "del", name], capture_output=True)

            # 8. bad setups
            gen = os.path.join(a.build, "tools", "tireless-generate")
            shard_tool = os.path.join(a.build, "tools", "tireless-shard")
            p = subprocess.run([shard_tool, "-m", a.model, "--listen", "127.0.0.1:0"], capture_output=True, text=True)
            check(p.returncode == 2 and "not a mixture of experts" in p.stderr, f"a dense model: {p.stderr.strip()}")
            p = subprocess.run([shard_tool, "-m", moe, "--experts", "9"], capture_output=True, text=True)
            check(p.returncode == 2 and "not in the model" in p.stderr, f"an expert out of range: {p.stderr.strip()}")
            p = subprocess.run([gen, "-m", moe, "--prompt", "hi", "-n", "2", "--expert-shard", "127.0.0.1:1",
                                "--revive-wait-ms", "1000"],
                               capture_output=True, text=True, timeout=120)
            check(p.returncode != 0 and "cannot be reached" in p.stderr, f"no shard listening: {p.stderr.strip()}")
            tiny = os.path.join(a.build, "test-data", "tiny-moe.gguf")
            if os.path.exists(tiny):
                other = Shards(a.build, tiny, tmp)
                try:
                    _, addr = other.start()
                    p = subprocess.run([gen, "-m", moe, "--prompt", "hi", "-n", "2", "--expert-shard", addr],
                                       capture_output=True, text=True, timeout=120)
                    check(p.returncode != 0 and "same GGUF" in p.stderr, f"a shard on another model: "
                                                                          f"{p.stderr.strip()[:160]}")
                finally:
                    other.stop()

            # 9. tireless-serve over shard processes, a shard killed under load
            if a.server and a.config:
                serve_under_load(a, moe, shards, tmp)
        finally:
            shards.stop()
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


def serve_under_load(a, moe: str, shards: Shards, tmp: str) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
    import threading
    import urllib.error
    import urllib.request
    import json
    from harness import Server  # noqa: E402

    _, a0 = shards.start("--shard", "0", "--of", "2")
    sup, a1 = shards.start("--shard", "1", "--of", "2", "--supervise")
    time.sleep(0.5)
    child = int(subprocess.run(["pgrep", "-P", str(sup.pid)], capture_output=True, text=True).stdout.split()[0])
    server = Server(a.server, a.config, tmp, http=True, name="moe-server",
                    overrides={("model", "path"): moe, ("backend", "expert_shard_addresses"): [a0, a1],
                               ("backend", "threads"): 1})
    try:
        results: list = [None] * 6

        def ask(i: int) -> None:
            body = {"model": "smollm2", "max_tokens": 160, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Write a long story about the number {i}."}]}
            req = urllib.request.Request(server.base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": "Bearer sk-premium-demo"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    results[i] = json.load(r)
            except urllib.error.HTTPError as e:
                results[i] = f"HTTP {e.code}: {e.read().decode()[:200]}"
            except Exception as e:  # noqa: BLE001
                results[i] = repr(e)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(results))]
        for t in threads:
            t.start()
        # kill once the shards are working on the requests (the server has dispatched layer calls)
        deadline = time.time() + 120
        while time.time() < deadline:
            with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as r:
                if re.search(r"^tireless_expert_layer_calls_total [1-9]", r.read().decode(), re.M):
                    break
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(child, signal.SIGKILL)
        for t in threads:
            t.join()
        ok = [r for r in results if isinstance(r, dict) and r["choices"][0]["finish_reason"] in ("stop", "length")
              and r["choices"][0]["message"]["content"].strip()]
        check(len(ok) == len(results), f"tireless-serve over 2 shard processes, one killed under load: "
                                       f"{len(ok)} of {len(results)} requests completed "
                                       f"({['ok' if isinstance(r, dict) else r for r in results]})")
        with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as r:
            metrics = r.read().decode()

        def value(name: str) -> float:
            m = re.search(rf"^tireless_{name} ([0-9.e+-]+)$", metrics, re.M)
            return float(m.group(1)) if m else -1.0

        experts = re.findall(r'^tireless_expert_pairs_total\{expert="(\d+)"\} ([0-9.e+]+)$', metrics, re.M)
        check(value("expert_shard_failures_total") >= 1 and value("expert_shard_revivals_total") >= 1
              and value("expert_last_recovery_seconds") > 0 and len(experts) == 8
              and sum(float(v) for _, v in experts) > 0,
              f"/metrics: {value('expert_shard_failures_total'):.0f} failure(s), "
              f"{value('expert_shard_revivals_total'):.0f} revival(s), recovery "
              f"{value('expert_last_recovery_seconds') * 1e3:.0f} ms, pairs per expert "
              f"{[int(float(v)) for _, v in experts]}")
    finally:
        server.stop()
        shards.stop()


def netns_pair() -> tuple[str, str] | None:
    """Two network namespaces joined by a veth pair, 10.77.0.1 <-> 10.77.0.2; None without root."""
    if os.geteuid() != 0:
        return None
    a, b = f"tl-a-{os.getpid()}", f"tl-b-{os.getpid()}"
    va, vb = f"tla{os.getpid() % 100000}", f"tlb{os.getpid() % 100000}"
    steps = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
             ["ip", "link", "add", va, "type", "veth", "peer", "name", vb],
             ["ip", "link", "set", va, "netns", a], ["ip", "link", "set", vb, "netns", b],
             ["ip", "-n", a, "addr", "add", "10.77.0.1/24", "dev", va],
             ["ip", "-n", b, "addr", "add", "10.77.0.2/24", "dev", vb],
             ["ip", "-n", a, "link", "set", va, "up"], ["ip", "-n", b, "link", "set", vb, "up"],
             ["ip", "-n", a, "link", "set", "lo", "up"], ["ip", "-n", b, "link", "set", "lo", "up"]]
    for s in steps:
        if subprocess.run(s, capture_output=True).returncode != 0:
            for name in (a, b):
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            return None
    return a, b


if __name__ == "__main__":
    sys.exit(main())
