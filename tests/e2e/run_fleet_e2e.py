#!/usr/bin/env python3
"""Two real tireless-serve replicas behind Debian's nginx (least_conn, deploy/nginx/tireless-fleet.conf)
serve cpu-smollm2's traffic from the load driver's OpenAI client; one replica is killed (SIGKILL)
mid-run and started again later.

    python3 tests/e2e/run_fleet_e2e.py --server build/tools/tireless-serve \
        --load build/examples/load_driver/tireless-load --config config/tireless.toml \
        [--duration 40] [--keep]

What must hold:
  - every request has exactly one outcome (the load driver's "lost" is 0);
  - before the kill both replicas serve; while one is down, nginx sends every new request to the
    other (none of them fails: each is completed, or refused with a reason and a retry hint, or
    given up by its client at its deadline); nginx answers nothing with a 5xx;
  - the only failures are streams that were running on the killed replica when it died, no more
    than it had in flight, each saying its stream was cut;
  - once the replica is back, nginx sends it requests again and it serves them.
Exit 0: all held; 1: something did not; 77: the model file is missing (scripts/fetch-model).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as h  # noqa: E402

ROOT = h.ROOT
TEMPLATE = os.path.join(ROOT, "deploy", "nginx", "tireless-fleet.conf")
SCENARIO = os.path.join(ROOT, "examples", "load_driver", "scenarios", "openai", "cpu-smollm2.toml")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lift_quotas(text):
    """The demo tenants without their quotas, as cpu-smollm2's runs have them."""
    return re.sub(r"(?m)^(requests_per_minute|tokens_per_minute|max_concurrent)\s*=.*\n", "", text)


def start_replica(args, workdir, name):
    # One core each (two replicas on this 2-core machine, as two machines would each have their
    # own), the shipped tiers' targets (no stretching), quotas lifted.
    return h.Server(args.server, args.config, workdir, name=name, http=True, tier_scale={},
                    overrides={("backend", "threads"): 1}, edit=lift_quotas)


class Nginx:
    def __init__(self, workdir, replica_ports):
        self.workdir = os.path.join(workdir, "nginx")
        os.makedirs(self.workdir, exist_ok=True)
        # Started as root, nginx's workers run as nobody: they must reach their temp folders.
        for d in (workdir, self.workdir):
            os.chmod(d, 0o755)
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.path.exists(binary):
            raise h.TestFailure("nginx is not installed (scripts/setup installs Debian's nginx)")
        self.port = free_port()
        with open(TEMPLATE) as f:
            conf = f.read()
        for key, value in {"WORK": self.workdir, "PORT": self.port, "REPLICA_A": replica_ports[0],
                           "REPLICA_B": replica_ports[1]}.items():
            conf = conf.replace(f"@{key}@", str(value))
        self.conf = os.path.join(self.workdir, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.access_log = os.path.join(self.workdir, "access.log")
        self.error_log = os.path.join(self.workdir, "error.log")
        self.proc = subprocess.Popen([binary, "-p", self.workdir, "-c", self.conf, "-e", self.error_log,
                                      "-g", "daemon off;"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.workdir, "stderr"), "wb"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise h.TestFailure(f"nginx exited {self.proc.returncode}: {self.errors()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise h.TestFailure(f"nginx did not listen on {self.port}: {self.errors()}")

    def errors(self):
        text = ""
        for p in (self.error_log, os.path.join(self.workdir, "stderr")):
            if os.path.exists(p):
                with open(p, errors="replace") as f:
                    text += f.read()
        return text[-2000:]

    def upstream_errors(self, upstream):
        """nginx's [error] lines about one upstream ("127.0.0.1:PORT")."""
        if not os.path.exists(self.error_log):
            return []
        with open(self.error_log, errors="replace") as f:
            return [line.strip() for line in f if "[error]" in line and f'upstream: "http://{upstream}/' in line]

    def requests(self):
        """The access log: (start, end, final status, [(upstream, status)]) per request."""
        out = []
        with open(self.access_log) as f:
            for line in f:
                m = re.match(r'([\d.]+) ([\d.]+) (\d+) \d+ "([^"]*)" "([^"]*)" "([^"]*)"', line)
                if not m or "/v1/chat/completions" not in m.group(6):
                    continue
                end, took, status = float(m.group(1)), float(m.group(2)), int(m.group(3))
                addrs = [a.strip() for a in m.group(4).split(",")]
                statuses = [s.strip() for s in m.group(5).split(",")]
                out.append((end - took, end, status, list(zip(addrs, statuses))))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--duration", type=float, default=40)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    skip = h.missing_model(args.config)
    if skip:
        print(skip)
        return 77
    if h.SANITIZED:
        # Two model servers and nginx at sanitizer speed would take most of an hour; the server's
        # own paths run under the sanitizers in server_end_to_end and server_http_end_to_end.
        print("SKIP: not under sanitizers")
        return 77
    workdir = tempfile.mkdtemp(prefix="tireless-fleet-")
    replicas, nginx, load = [], None, None
    try:
        replicas = [start_replica(args, workdir, "replica-a"), start_replica(args, workdir, "replica-b")]
        ports = [r.http_port for r in replicas]
        nginx = Nginx(workdir, ports)
        base_url = f"http://127.0.0.1:{nginx.port}"
        with open(SCENARIO) as f:
            scenario = f.read()
        scenario = re.sub(r'(?m)^base_url = .*$', f'base_url = "{base_url}"', scenario)
        scenario = re.sub(r'(?m)^config = .*$', f'config = "{replicas[0].config_path}"', scenario)
        scenario_path = os.path.join(workdir, "scenario.toml")
        with open(scenario_path, "w") as f:
            f.write(scenario)
        out = os.path.join(workdir, "load")
        warmup = 6
        cmd = [args.load, scenario_path, "--multiples", "1", "--duration", str(args.duration), "--warmup",
               str(warmup), "--calibration", "15", "--requests", "--out", out]
        print("load:", " ".join(cmd), flush=True)
        load = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started = threading.Event()
        stderr_lines = []

        def read_stderr():
            for line in load.stderr:
                stderr_lines.append(line)
                print("  load:", line.rstrip(), flush=True)
                if line.startswith("capacity:"):
                    started.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        stdout_text = []
        threading.Thread(target=lambda: stdout_text.append(load.stdout.read()), daemon=True).start()
        h.check(started.wait(180), "the load driver did not finish measuring the capacity within 180 s")
        run_started = time.time()
        # The kill: 40% into the measured window; the restart: 70% into it.
        time.sleep(warmup + 0.4 * args.duration)
        victim = replicas[1]
        in_flight = health_in_flight(victim.http_port)
        kill_at = time.time()
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        print(f"killed replica-b (pid {victim.proc.pid}) {kill_at - run_started:.1f} s into the run with "
              f"{in_flight} requests in it", flush=True)
        time.sleep(0.3 * args.duration)
        restart_at = time.time()
        replacement = h.Server(args.server, victim.config_path, workdir, name="replica-b2", http=True, tier_scale={},
                               http_port=victim.http_port)
        replicas.append(replacement)
        back_at = time.time()
        print(f"replica-b started again on the same port after {back_at - restart_at:.1f} s", flush=True)
        try:
            load.wait(timeout=args.duration + 240)
        except subprocess.TimeoutExpired:
            raise h.TestFailure(f"the load driver did not end within {args.duration + 240} s of the restart")
        reader.join(10)
        return check_results(out, nginx, ports, kill_at, restart_at, back_at, in_flight, load.returncode,
                             "".join(stderr_lines))
    except h.TestFailure as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        if load and load.poll() is None:
            load.kill()
        if nginx:
            nginx.stop()
        for r in replicas:
            r.stop()
        if args.keep:
            print("kept:", workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def health_in_flight(port):
    """running + queued of a replica's /health, read just before it is killed."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        body = json.load(r)
    return int(body["running"]) + int(body["queued"])


def check_results(out, nginx, ports, kill_at, restart_at, back_at, in_flight, rc, stderr_text):
    h.check(rc == 0, f"the load driver exited {rc}:\n{stderr_text[-2000:]}")
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    run = results["runs"][0]
    records = run["request_samples"]
    outcomes = {}
    for r in records:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    print(f"load driver: {run['requests']} requests, outcomes {outcomes}, lost {run['lost']}", flush=True)
    h.check(run["lost"] == 0 and "lost" not in outcomes, f"{run['lost']} requests were lost")
    h.check(run["requests"] >= 20, f"only {run['requests']} requests were sent")
    failed = [r for r in records if r["outcome"] == "failed"]
    for r in failed:
        h.check(re.search(r"stream ended|HTTP request failed|connection|disconnect", r.get("message", ""), re.I),
                f"a request failed for another reason than the cut stream: {r}")
    h.check(len(failed) <= in_flight, f"{len(failed)} requests failed, more than the {in_flight} the killed "
                                      f"replica had in flight")

    a, b = (f"127.0.0.1:{p}" for p in ports)
    log = nginx.requests()
    served_by = {a: 0, b: 0}
    before = [r for r in log if r[1] < kill_at]
    for _, _, status, tries in before:
        if status == 200:
            served_by[tries[-1][0]] = served_by.get(tries[-1][0], 0) + 1
    print(f"before the kill: replica-a served {served_by[a]}, replica-b {served_by[b]}", flush=True)
    h.check(served_by[a] > 0 and served_by[b] > 0, f"both replicas should serve before the kill: {served_by}")

    # Sent after the kill and before the replica was back: every one ends at replica-a, with an
    # answer or an honest refusal (429), never an error from nginx.
    down = [r for r in log if kill_at + 0.5 < r[0] < restart_at]
    h.check(len(down) > 0, "no requests arrived while replica-b was down")
    # 400: a prompt refused as too long for its tier under this load; 429: refused, overloaded;
    # 499: the client's own deadline passed and it closed the connection.
    bad = [r for r in down if r[3][-1][0] != a or r[2] not in (200, 400, 429, 499)]
    h.check(not bad, f"requests while replica-b was down that did not end at replica-a with an answer or a "
                     f"refusal: {bad[:5]}")
    rerouted = sum(1 for r in down if len(r[3]) > 1)
    # The replica never killed never fails a request nginx sends it: such an error (a request
    # written onto a keep-alive connection the replica was closing) takes it out for fail_timeout.
    survivor_errors = nginx.upstream_errors(a)
    h.check(not survivor_errors, f"nginx saw {len(survivor_errors)} errors from replica-a, which was never "
                                 f"killed: {survivor_errors[:3]}")
    errors_5xx = [r for r in log if r[2] >= 500]
    h.check(not errors_5xx, f"nginx answered {len(errors_5xx)} requests with a 5xx: {errors_5xx[:5]}")
    after = [r for r in log if r[0] > back_at and r[3][-1][0] == b and r[2] == 200]
    print(f"while replica-b was down: {len(down)} requests, all at replica-a ({rerouted} tried replica-b first); "
          f"after it came back it served {len(after)}", flush=True)
    h.check(len(after) > 0, "replica-b got no requests after it was started again")
    print("fleet end to end: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
