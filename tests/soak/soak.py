#!/usr/bin/env python3
"""The soak: the real tireless-serve (real model) at 2x its capacity, with faults mixed in, for
as long as asked; at the end a report, and a non-zero exit when the server lost anything.

    soak.py --server build/tools/tireless-serve --config config/tireless.toml --minutes 30
            --out bench/results/soak.txt [--clients 3] [--load 2.0]

Faults: the server's shard crashes mid-step and has slow spells ([faults] in its config); its
KV pool is small, so long documents exhaust it (preemption, refusals); clients disconnect
mid-stream, stop reading, cancel, drop their Generation, hit deadlines, send bad input, unknown
keys, malformed frames and silent connections; at the end SIGTERM arrives under load.

Asserted (each a line of the report, PASS or FAIL): no request without its one outcome (client
side: every client counts done() per request; server side: its stats), server RSS growth after
warm-up under 5%, every KV block back in the pool, every actor's largest mailbox under its bound,
refusals carry retry hints and clients honour them, shutdown under load gives every request its
outcome and exits 0.
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))

import capnp  # noqa: E402

import harness as h  # noqa: E402

SAMPLE_S = 5.0


def soak_overrides(handshake_ms):
    return {
        ("server", "log_level"): "warn",
        ("server", "max_connections_per_peer"): 200,  # every soak client is 127.0.0.1
        ("server", "handshake_timeout_ms"): handshake_ms,
        ("server", "idle_timeout_ms"): 30000,
        ("kv", "blocks"): 320,           # ~5k tokens: a few long documents fill it
        ("backend", "max_context"): 2048,
        ("backend", "max_shard_restarts"): 20,
        ("faults", "shard_crash_per_step"): 0.003,
        ("faults", "shard_slow_per_step"): 0.004,
        ("faults", "shard_slow_ms"): 2000,
        ("faults", "shard_slow_factor"): 3.0,
        ("faults", "seed"): 7,
    }


def with_faults_section(text):
    return text if "\n[faults]" in text else text + "\n[faults]\n"


QUOTA_KEYS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")


def lift_quotas(text, keys):
    """The [[tenants]] that hold any of `keys` get no quotas (0 = unlimited): their load reaches
    the engine, which is what is driven at 2x; the other tenants keep theirs, so quota
    refusals and their retry hints stay in the mix."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.strip().startswith("[") and current:
            blocks.append(current)
            current = []
        current.append(line)
    blocks.append(current)
    out = []
    for block in blocks:
        lifted = block[0].strip() == "[[tenants]]" and any(k in line for line in block for k in keys)
        for line in block:
            name = line.split("=")[0].strip()
            out.append(f"{name} = 0  # soak: lifted" if lifted and name in QUOTA_KEYS else line)
    return "\n".join(out) + "\n"


async def stats_and_health(port):
    client, inf = await h.connect(port)
    s = (await asyncio.wait_for(inf.stats(""), 20)).stats
    hl = (await asyncio.wait_for(inf.health(), 20)).health
    out = {
        "received": s.serverReceived, "completed": s.serverCompleted, "rejected": s.serverRejected,
        "cancelled": s.serverCancelled, "failed": s.serverFailed, "open": s.serverOpen,
        "shard_restarts": s.shardRestarts, "mailbox_bound": s.mailboxBound,
        "mailboxes": {m.actor: m.maxSize for m in s.mailboxes},
        "kv_free": hl.kvFreeBlocks, "kv_total": hl.kvTotalBlocks, "running": hl.running, "queued": hl.queued,
        "connections": hl.connections, "open_streams": hl.openStreams,
    }
    client.close()
    return out


async def fill_the_pool(port, n=8, attempts=12):
    """Long documents at once, more than the KV pool holds (8 of ~900 tokens; the pool's 320
    blocks of 16 hold ~5k): every block is written (and its pages touched) before RSS is watched,
    as the pool hands out a block never used before evicting a cached one.
    They are premium, whose first token is due within its start bound: the server admits what it
    can start in time and refuses the rest with a hint (a fresh server's forecast rests on the
    step costs it probed at start). Each refused document comes back after its hint with its
    retry token, as a client that honours hints does, until it completes: (outcomes, retries)."""
    words = "river stone lantern orchard signal harbor meadow copper violet engine".split()
    half = " ".join(words[i % len(words)] + str(i) for i in range(140))  # ~450 tokens
    doc = half + " " + half
    retries = 0

    async def one(i):
        nonlocal retries
        token = 0
        for _ in range(attempts):
            # A connection each try: one idle through a long hint is closed (idle_timeout_ms).
            client, inf = await h.connect(port)
            try:
                r = h.new_request(h.PREMIUM, text=f"{i}: {doc}", max_tokens=24, retryToken=token)
                outcome = await (await h.start(inf, r)).wait(timeout=300)
            finally:
                client.close()
            hint = outcome.rejected.retryAfterMs if outcome.which() == "rejected" else -1
            if hint < 0:
                return outcome
            retries += 1
            token = outcome.rejected.retryToken
            await asyncio.sleep(hint / 1000)
        return outcome

    outcomes = await asyncio.gather(*(one(i) for i in range(n)))
    return outcomes, retries


async def measure_capacity(port, seconds=20.0, concurrency=6):
    """Completed premium chats per second at saturation (closed loop)."""
    conns = [await h.connect(port) for _ in range(concurrency)]
    done = 0
    until = time.monotonic() + seconds

    async def worker(inf, i):
        nonlocal done
        while time.monotonic() < until:
            r = h.new_request(h.PREMIUM, f"Name {i % 5 + 2} animals.", max_tokens=24)
            _, outcome = await h.generate(inf, r, timeout=120)
            if outcome.which() == "completed":
                done += 1

    await asyncio.gather(*(worker(inf, i) for i, (_, inf) in enumerate(conns)))
    for c, _ in conns:
        c.close()
    return done / seconds


async def shutdown_under_load(server):
    """SIGTERM while long generations stream: each ends completed or cancelled/shutdown."""
    conns = [await h.connect(server.port) for _ in range(4)]
    calls = []
    for _, inf in conns:
        calls.append(await h.start(inf, h.new_request(h.PREMIUM, text=h.LONG_TEXT, max_tokens=600)))
    await asyncio.wait_for(asyncio.gather(*(asyncio.shield(c.sink.first_token) for c in calls)), 120)
    server.terminate()
    outcomes = []
    for c in calls:
        outcomes.append(await c.wait(timeout=60))
    await asyncio.sleep(0.5)
    problems = []
    for i, (c, o) in enumerate(zip(calls, outcomes)):
        ok = o.which() == "completed" or (o.which() == "cancelled" and str(o.cancelled.reason) == "shutdown")
        if not ok:
            problems.append(f"stream {i}: {h.describe(o)}")
        if c.sink.done_count != 1:
            problems.append(f"stream {i}: done() {c.sink.done_count} times")
    code = await h.wait_exit(server, 30)
    if code != 0:
        problems.append(f"the server exited {code}")
    return problems, [h.describe(o) for o in outcomes]


def median_window(samples, t_from, t_to):
    values = [s["rss_mb"] for s in samples if t_from <= s["t"] <= t_to]
    return statistics.median(values) if values else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--out", required=True, help="the report (a .json beside it holds the data)")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--load", type=float, default=2.0, help="offered load, a multiple of the measured capacity")
    p.add_argument("--warmup-minutes", type=float, default=None, help="default: a fifth of the run, 1 to 5 min")
    args = p.parse_args()

    if skip := h.missing_model(args.config):
        print(skip)
        return 77

    workdir = tempfile.mkdtemp(prefix="tireless-soak-")
    handshake_ms = 3000
    base = os.path.join(workdir, "base.toml")
    with open(args.config) as f, open(base, "w") as g:
        g.write(lift_quotas(with_faults_section(f.read()), (h.PREMIUM, h.STANDARD)))
    # The shipped latency targets (not the e2e tests' stretched ones): shedding is part of it.
    server = h.Server(args.server, base, workdir, overrides=soak_overrides(handshake_ms), name="soak",
                      tier_scale=None)
    t_start = time.monotonic()
    seconds = args.minutes * 60
    warmup = args.warmup_minutes * 60 if args.warmup_minutes is not None else min(max(seconds / 5, 60), 300)
    lines, checks = [], []

    def check(name, ok, detail):
        checks.append((name, ok, detail))

    try:
        filled, fill_retries = asyncio.run(capnp.run(fill_the_pool(server.port)))
        lines.append("pool filled first: " + ", ".join(h.describe(o) for o in filled))
        fill_preemptions = sum(o.usage.preemptions for o in filled)
        check("the KV pool was filled before RSS was watched",
              all(o.which() == "completed" for o in filled),
              f"{sum(o.which() == 'completed' for o in filled)} of {len(filled)} long documents completed, "
              f"{fill_retries} retries after a hint, {fill_preemptions} preemptions")
        capacity = asyncio.run(capnp.run(measure_capacity(server.port)))
        rate = args.load * max(capacity, 0.2)
        lines.append(f"capacity (premium chats, closed loop): {capacity:.2f} requests/s; "
                     f"offered {rate:.2f} requests/s ({args.load}x) from {args.clients} client processes")
        before = asyncio.run(capnp.run(stats_and_health(server.port)))

        client_procs = []
        for i in range(args.clients):
            out = os.path.join(workdir, f"client{i}.json")
            cmd = [sys.executable, os.path.join(HERE, "soak_client.py"), "--port", str(server.port),
                   "--rate", f"{rate / args.clients:.4f}", "--seconds", str(seconds), "--seed", str(100 + i),
                   "--out", out, "--handshake-s", str(handshake_ms / 1000)]
            if i == 0:
                cmd.append("--chaos")
            client_procs.append((out, subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                                       stderr=open(out + ".stderr", "w"))))
        samples = []
        t0 = time.monotonic()
        while any(pr.poll() is None for _, pr in client_procs):
            if not server.alive():
                break
            t = time.monotonic() - t0
            try:
                sh = asyncio.run(capnp.run(stats_and_health(server.port)))
            except Exception as e:  # noqa: BLE001
                sh = {"error": str(e)}
            sh.update({"t": round(t, 1), "rss_mb": round(h.rss_mb(server.proc.pid), 1)})
            samples.append(sh)
            time.sleep(SAMPLE_S)
        for _, pr in client_procs:
            pr.wait()
        check("the server stayed up", server.alive(), f"exit {server.proc.returncode}" if not server.alive() else "")

        clients = []
        for out, pr in client_procs:
            try:
                with open(out) as f:
                    clients.append(json.load(f))
            except OSError:
                with open(out + ".stderr") as f:
                    err = f.read()[-2000:]
                check(f"client {out} reported", False, f"exit {pr.returncode}: {err}")

        # Quiet: every block back, nothing open, the server's counts add up.
        deadline = time.monotonic() + 90
        end = None
        while server.alive() and time.monotonic() < deadline:
            end = asyncio.run(capnp.run(stats_and_health(server.port)))
            if end["running"] == 0 and end["queued"] == 0 and end["open"] == 0 and end["kv_free"] == end["kv_total"]:
                break
            time.sleep(1)
        final_rss = h.rss_mb(server.proc.pid) if server.alive() else None
        problems, shutdown_outcomes = (asyncio.run(capnp.run(shutdown_under_load(server)))
                                       if server.alive() else (["the server was not running"], []))
    finally:
        server.stop(timeout=30)
    elapsed = time.monotonic() - t_start

    # --- the report
    outcomes, requests = {}, {}
    lost, duplicates, errors, failures = [], [], {}, {}
    retries = retries_early = hints_missing = preemptions = degraded = 0
    retry_outcomes = {}
    malformed = silent = silent_closed = silent_open = 0
    for c in clients:
        for b, counts in c["outcomes"].items():
            for k, n in counts.items():
                outcomes.setdefault(b, {}).setdefault(k, 0)
                outcomes[b][k] += n
        for b, n in c["requests"].items():
            requests[b] = requests.get(b, 0) + n
        lost += c["lost"]
        duplicates += c["duplicates"]
        for k, n in c["errors"].items():
            errors[k] = errors.get(k, 0) + n
        for k, n in c.get("failures", {}).items():
            failures[k] = failures.get(k, 0) + n
        retries += c["retries"]
        retries_early += c["retries_early"]
        hints_missing += c["hints_missing"]
        preemptions += c["preemptions"]
        degraded += c["degraded"]
        for k, n in c["retry_outcomes"].items():
            retry_outcomes[k] = retry_outcomes.get(k, 0) + n
        malformed += c["malformed_sent"]
        silent += c["silent_opened"]
        silent_closed += c["silent_closed_by_server"]
        silent_open += c["silent_left_open"]

    total_outcomes = sum(sum(v.values()) for v in outcomes.values())
    lines.append(f"ran {seconds / 60:.1f} min of load ({elapsed / 60:.1f} min in all); "
                 f"{sum(requests.values())} requests sent, {total_outcomes} ended as the client saw")
    lines.append("outcomes by behaviour (client side):")
    for b in sorted(outcomes):
        parts = ", ".join(f"{k} {n}" for k, n in sorted(outcomes[b].items(), key=lambda kv: -kv[1]))
        lines.append(f"  {b:<16} {parts}")
    lines.append(f"retries after a hint: {retries} (sooner than the hint: {retries_early}); their outcomes: "
                 + ", ".join(f"{k} {n}" for k, n in sorted(retry_outcomes.items(), key=lambda kv: -kv[1])))
    lines.append(f"preemptions reported on outcomes: {preemptions}; degraded answers: {degraded}")
    lines.append(f"chaos: {malformed} malformed frames; {silent} silent connections, {silent_closed} closed by the "
                 f"server's handshake timeout, {silent_open} left open")
    if errors:
        lines.append("transport errors seen by clients: " + "; ".join(f"{k} x{n}" for k, n in errors.items()))
    if failures:
        lines.append("failed outcomes: " + "; ".join(f"{k!r} x{n}" for k, n in failures.items()))
    if end:
        lines.append(f"server at rest: received {end['received']}, completed {end['completed']}, rejected "
                     f"{end['rejected']}, cancelled {end['cancelled']}, failed {end['failed']}, open {end['open']}; "
                     f"shard restarts {end['shard_restarts']}; KV free {end['kv_free']} of {end['kv_total']}")
        lines.append(f"largest mailboxes: {end['mailboxes']} (bound {end['mailbox_bound']})")
    rss = [s for s in samples if "rss_mb" in s]
    t_last = rss[-1]["t"] if rss else 0
    at_warmup = median_window(rss, warmup - 3 * SAMPLE_S, warmup + 3 * SAMPLE_S)
    at_end = median_window(rss, t_last - 4 * SAMPLE_S, t_last)
    growth = (at_end - at_warmup) / at_warmup if at_warmup and at_end else None
    lines.append("server RSS over time (MB): " + " ".join(f"{s['t']:.0f}s:{s['rss_mb']:.0f}"
                                                          for s in rss[:: max(1, len(rss) // 24)]))
    lines.append(f"RSS after warm-up ({warmup:.0f} s): {at_warmup} MB; at the end: {at_end} MB; "
                 f"growth {growth * 100:.2f}%" if growth is not None else "RSS: too few samples")
    lines.append("shutdown under load: " + "; ".join(shutdown_outcomes))

    check("no request lost (client side)", not lost, "; ".join(lost[:10]))
    check("no request with two outcomes", not duplicates, "; ".join(duplicates[:10]))
    if end:
        summed = end["completed"] + end["rejected"] + end["cancelled"] + end["failed"]
        check("every request the server received ended once (server side)",
              end["open"] == 0 and summed == end["received"],
              f"received {end['received']}, outcomes {summed}, open {end['open']}")
        check("KV blocks all returned", end["kv_free"] == end["kv_total"], f"{end['kv_free']} of {end['kv_total']} free")
        worst = max(end["mailboxes"].values()) if end["mailboxes"] else 0
        check("mailboxes under their bound", worst <= end["mailbox_bound"],
              f"largest {worst}, bound {end['mailbox_bound']}")
        check("faults happened (shard restarts)", end["shard_restarts"] > 0 or seconds < 120,
              f"{end['shard_restarts']} restarts")
    else:
        check("the server answered at the end", False, "no stats")
    check("RSS growth after warm-up under 5%", growth is not None and growth < 0.05,
          f"{growth * 100:.2f}%" if growth is not None else "not measured")
    check("refusals carry retry hints, honoured by clients", hints_missing == 0 and retries_early == 0,
          f"{hints_missing} without a hint, {retries_early} retried early")
    check("silent connections closed by the server", silent_open == 0, f"{silent_open} left open")
    check("shutdown under load: every request its outcome, exit 0", not problems, "; ".join(problems))

    report = [f"# tireless soak, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC",
              f"# command: {' '.join(sys.argv)}", ""] + lines + [""]
    for name, ok, detail in checks:
        report.append(f"{'PASS' if ok else 'FAIL'}  {name}" + (f" ({detail})" if detail else ""))
    text = "\n".join(report) + "\n"
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"samples": samples, "clients": clients, "end": end, "checks": checks}, f, indent=1)
    failed = [c for c in checks if not c[1]]
    if failed:
        print(f"server logs: {workdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
