"""End-to-end harness: the real tireless-serve on a free port, real pycapnp clients.

    server = Server(binary, base_config, workdir, overrides)  # writes the config, starts it
    ...                                                       # server.port, server.stderr_text()
    server.stop()                                             # always: SIGTERM, then SIGKILL

The client side (connect, a recording TokenSink, one generate call) is asyncio + pycapnp, as
in examples/python/client.py. Run as a script, this module is also a small streaming client
that the disconnect test kills mid-stream (see `main`).
"""
import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PROTOCOL = os.path.join(ROOT, "protocol")
IMPORTS = [PROTOCOL] + [os.path.dirname(p) for p in capnp.__path__]
tireless = capnp.load(os.path.join(PROTOCOL, "tireless.capnp"), imports=IMPORTS)

# A key per tier; the tenants are those of config/tireless.toml.
PREMIUM = "sk-premium-demo"
STANDARD = "sk-standard-demo"
ALICE = "sk-free-alice-demo"
BOB = "sk-free-bob-demo"

# Raw text that the model continues for a long time (no chat template, no early end of turn).
LONG_TEXT = "Once upon a time, in a small village by the sea, there lived"


# Sanitizer builds run the model many times slower: every wait of the tests is stretched by
# TIRELESS_TEST_TIME_SCALE (CMake sets it for them); SANITIZED skips checks of memory use.
TIME_SCALE = float(os.environ.get("TIRELESS_TEST_TIME_SCALE", "1") or 1)
SANITIZED = os.environ.get("TIRELESS_SANITIZED", "") not in ("", "0")


def slack(seconds):
    return seconds * TIME_SCALE


async def wait_for(awaitable, timeout):
    """asyncio.wait_for with the timeout stretched by TIME_SCALE."""
    return await asyncio.wait_for(awaitable, slack(timeout))


class TestFailure(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise TestFailure(message)


# ---------------------------------------------------------------------------------------------
# Configuration


def model_path_of(config_text):
    """The model.path of a config, with ~ and $HOME expanded."""
    section = None
    for line in config_text.splitlines():
        s = line.strip()
        if s.startswith("[") and not s.startswith("[["):
            section = s.strip("[]").strip()
        elif s.startswith("[["):
            section = None
        elif section == "model":
            m = re.match(r'path\s*=\s*"([^"]*)"', s)
            if m:
                return os.path.expandvars(os.path.expanduser(m.group(1)))
    return None


def missing_model(config_path):
    """A line saying the config's model file is missing (the caller skips), or None."""
    with open(config_path) as f:
        model = model_path_of(f.read())
    if not model or not os.path.exists(model):
        return f"SKIP: the model {model} is missing (scripts/fetch-model puts it there)"
    return None


def rss_mb(pid):
    """The resident memory of a process, in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(v)


def edit_config(text, overrides, remove=(), scale_tiers=None):
    """Sets `key = value` in [section] tables of a TOML text: overrides maps (section, key) to a
    value; remove lists (section, key) lines to drop. Only plain [section] tables (not [[arrays]])
    are edited; a key that is not there is added right after its section's header. scale_tiers
    maps a [[tiers]] key (ttft_ms, ...) to a factor applied to its integer value in every tier."""
    lines = text.splitlines()
    out = []
    section = None
    pending = dict(overrides)
    header_index = {}
    for line in lines:
        s = line.strip()
        if s.startswith("[["):
            section = "[[" + s.strip("[]").strip() + "]]"
        elif section == "[[tiers]]" and scale_tiers:
            m = re.match(r"([A-Za-z0-9_]+)\s*=\s*(\d+)", s)
            if m and m.group(1) in scale_tiers:
                value = int(m.group(2)) * scale_tiers[m.group(1)]
                out.append(f"{m.group(1)} = {value}  # e2e test setting: {m.group(2)} x {scale_tiers[m.group(1)]}")
                continue
        elif s.startswith("["):
            section = s.strip("[]").strip()
            header_index[section] = len(out)
        elif section is not None and not section.startswith("[["):
            m = re.match(r"([A-Za-z0-9_]+)\s*=", s)
            if m:
                key = (section, m.group(1))
                if key in remove:
                    continue
                if key in pending:
                    out.append(f"{m.group(1)} = {toml_value(pending.pop(key))}  # e2e test setting")
                    continue
        out.append(line)
    # Keys that were not in the file: after their section's header (highest index first).
    for (section, key), value in sorted(pending.items(), key=lambda kv: -header_index.get(kv[0][0], -1)):
        if section not in header_index:
            raise ValueError(f"config has no [{section}] table for {key}")
        out.insert(header_index[section] + 1, f"{key} = {toml_value(value)}  # e2e test setting")
    return "\n".join(out) + "\n"


# Test-friendly settings on top of config/tireless.toml.
STREAM_WINDOW = 8
SHUTDOWN_GRACE_MS = 2000
KV_BLOCKS = 600
# The tiers' latency targets (and so every pressure-based rung of their ladders) are stretched:
# the shipped targets are calibrated for an idle 2-core machine, and a loaded shared CI machine
# is many times slower, which would make admission shed the lower tiers and the tests flaky.
TIER_SCALE = {"ttft_ms": 20, "tpot_ms": 20}


def test_overrides(model_path):
    return {
        ("server", "listen"): "127.0.0.1:0",
        ("server", "log_level"): "info",
        ("server", "shutdown_grace_ms"): SHUTDOWN_GRACE_MS,
        ("session", "stream_buffer_tokens"): STREAM_WINDOW,
        ("model", "path"): model_path,
        ("kv", "blocks"): KV_BLOCKS,
        # 0 would follow the tightest tier's (stretched) tpot_ms: keep the shipped 150 ms.
        ("engine", "step_time_target_ms"): 150,
        # At least the largest stretched ttft_ms (the config refuses less).
        ("admission", "max_queue_wait_ms"): 180000,
    }


# ---------------------------------------------------------------------------------------------
# The server process


class Server:
    def __init__(self, binary, base_config, workdir, overrides=None, name="server", start_timeout=60,
                 tier_scale=TIER_SCALE, http=False, metrics=False, edit=None, http_port=0):
        self.binary = binary
        self.workdir = workdir
        self.name = name
        with open(base_config) as f:
            text = f.read()
        model = model_path_of(text)
        all_overrides = test_overrides(model)
        all_overrides.update(overrides or {})
        self.config_path = os.path.join(workdir, f"{name}.toml")
        text = edit_config(text, all_overrides, remove={("kv", "memory_mb")}, scale_tiers=tier_scale)
        if edit:
            text = edit(text)  # anything edit_config cannot express ([[tenants]] entries)
        with open(self.config_path, "w") as f:
            f.write(text)
        self.stderr_path = os.path.join(workdir, f"{name}.stderr")
        self.stdout_path = os.path.join(workdir, f"{name}.stdout")
        self._stderr = open(self.stderr_path, "wb")
        # stdout to a file, polled here: no reader thread (see "Without threads" below).
        self._stdout = open(self.stdout_path, "wb")
        args = [binary, "--config", self.config_path, "--port", "0"] + (["--http-port", str(http_port)] if http else []) + (
            ["--metrics-port", "0"] if metrics else [])
        self.proc = subprocess.Popen(args, stdout=self._stdout, stderr=self._stderr, stdin=subprocess.DEVNULL)
        self.port = self.http_port = self.metrics_port = None
        deadline = time.monotonic() + slack(start_timeout)
        m = mh = None
        text = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            with open(self.stdout_path, "rb") as f:
                text = f.read().decode(errors="replace")
            lines = [line for line in text.splitlines(keepends=True) if line.endswith("\n")]
            m = re.match(r"listening on ([0-9.]+):(\d+)", lines[0]) if lines else None
            mh = next((x for x in (re.match(r"http listening on ([0-9.]+):(\d+)", line) for line in lines) if x), None)
            mm = next((x for x in (re.match(r"metrics listening on ([0-9.]+):(\d+)", line) for line in lines) if x), None)
            if m and (mh or not http) and (mm or not metrics):
                break
            time.sleep(0.05)
        if not m or (http and not mh) or (metrics and not mm):
            self.kill()
            raise TestFailure(f"{name} did not print 'listening on' within {start_timeout} s "
                              f"(stdout {text!r}, exit {self.proc.returncode}); stderr:\n{self.stderr_text()}")
        self.host, self.port = m.group(1), int(m.group(2))
        if metrics and mm:
            self.metrics_port = int(mm.group(2))
        if mh:
            self.http_port = int(mh.group(2))
            self.base_url = f"http://{self.host}:{self.http_port}"

    def alive(self):
        return self.proc.poll() is None

    def stderr_text(self, tail=60):
        try:
            if not self._stderr.closed:
                self._stderr.flush()
            with open(self.stderr_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    def terminate(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout=15):
        """SIGTERM, then SIGKILL if it is still there after `timeout`; returns the exit code."""
        self.terminate()
        if self.wait(slack(timeout)) is None:
            self.kill()
        self._stderr.close()
        self._stdout.close()
        return self.proc.returncode


# ---------------------------------------------------------------------------------------------
# Without threads: a test process holds pycapnp objects, and one freed by a garbage collection
# on a thread other than the event loop's aborts the process ("No event loop is running on
# this thread"). So waiting for a process or a raw socket is done on the loop.


async def wait_exit(server, timeout):
    """The server's exit code once it exits, or None after `timeout` seconds."""
    deadline = time.monotonic() + max(0.0, slack(timeout))
    while server.alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return server.proc.poll()


async def closed_by_server(reader, timeout):
    """True when the server ends the connection (EOF or reset) within `timeout` seconds,
    whatever it sends before; False if it is still open then."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not await wait_for(reader.read(4096), left):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except asyncio.TimeoutError:
        return False


# ---------------------------------------------------------------------------------------------
# Clients


async def connect(port, host="127.0.0.1", schema=None):
    """Returns (client, Inference capability)."""
    connection = await capnp.AsyncIoStream.create_connection(host=host, port=port)
    client = capnp.TwoPartyClient(connection)
    inference = client.bootstrap().cast_as((schema or tireless).Inference)
    return client, inference


def make_sink_class(schema):
    class Sink(schema.TokenSink.Server):
        """Records every chunk and every done(); optionally slow per chunk."""

        def __init__(self, delay=0.0):
            self.delay = delay
            self.chunks = []            # (text, ids, monotonic time)
            self.received = 0           # token ids received (counted on arrival)
            self.logprobs = []          # (token, logprob, [(top token, logprob)]) when asked for
            self.done_count = 0
            self.done_before_tokens = None
            self.outcome = None
            self.first_token = asyncio.get_running_loop().create_future()
            self.finished = asyncio.get_running_loop().create_future()

        async def tokens(self, chunk, **kwargs):
            ids = list(chunk.ids)
            self.received += len(ids)
            self.chunks.append((chunk.text, ids, time.monotonic()))
            try:  # a client on an older schema (newer_client.capnp's TokenChunk) has no logprobs
                lps = chunk.logprobs
            except (AttributeError, capnp.KjException):
                lps = []
            self.logprobs.extend((lp.token, lp.logprob, list(zip(lp.topTokens, lp.topLogprobs))) for lp in lps)
            if not self.first_token.done():
                self.first_token.set_result(None)
            if self.delay:
                await asyncio.sleep(self.delay)

        async def sync(self, **kwargs):
            pass

        async def done(self, outcome, **kwargs):
            self.done_count += 1
            if self.outcome is None:
                self.outcome = outcome.as_builder()
                self.done_before_tokens = not self.chunks
            if not self.finished.done():
                self.finished.set_result(None)

        @property
        def text(self):
            return "".join(c[0] for c in self.chunks)

    return Sink


Sink = make_sink_class(tireless)


def new_request(key=PREMIUM, message=None, text=None, max_tokens=16, schema=None, **fields):
    r = (schema or tireless).GenerateRequest.new_message()
    if key is not None:
        r.apiKey = key
    if text is not None:
        r.input.text = text
    else:
        msgs = r.input.init("messages", 1)
        msgs[0].role = "user"
        msgs[0].content = message if message is not None else "Say hello."
        # (callers that need more messages build the request themselves)
    if max_tokens is not None:
        r.maxTokens = max_tokens
    for k, v in fields.items():
        setattr(r, k, v)
    return r


class Call:
    """One generate() call: the sink, the Generation, the outcome."""

    def __init__(self, sink, generation):
        self.sink = sink
        self.generation = generation

    async def wait(self, timeout=60):
        try:
            await wait_for(asyncio.shield(self.sink.finished), timeout)
        except asyncio.TimeoutError:
            raise TestFailure(f"no outcome within {timeout} s ({self.sink.received} tokens received)")
        return self.sink.outcome


async def start(inference, request, delay=0.0, sink_class=None):
    sink = (sink_class or Sink)(delay)
    result = await inference.generate(request, sink)
    return Call(sink, result.generation)


async def finish(call, timeout=60, settle=0.2):
    """Waits for the outcome, checks that there is exactly one (done() once, and
    Generation.outcome() agrees), and returns it."""
    outcome = await call.wait(timeout)
    remote = (await wait_for(call.generation.outcome(), 10)).outcome
    await asyncio.sleep(settle)  # a second done() would arrive now
    check(call.sink.done_count == 1, f"done() was called {call.sink.done_count} times")
    check(remote.which() == outcome.which(),
          f"Generation.outcome() says {remote.which()}, done() said {outcome.which()}")
    check(remote.requestId == outcome.requestId, "Generation.outcome() and done() disagree on requestId")
    return outcome


async def generate(inference, request, timeout=60, delay=0.0):
    call = await start(inference, request, delay)
    outcome = await finish(call, timeout)
    return call, outcome


def describe(outcome):
    if outcome is None:
        return "no outcome"
    which = outcome.which()
    detail = getattr(outcome, which)
    parts = [which]
    if hasattr(detail, "reason"):
        parts.append(str(detail.reason))
    if which in ("rejected", "failed"):
        parts.append(repr(detail.message))
    parts.append(f"{outcome.usage.promptTokens}+{outcome.usage.completionTokens} tokens")
    return " ".join(parts)


def expect(outcome, which, reason=None):
    check(outcome is not None, f"expected {which}/{reason}, got no outcome")
    got = outcome.which()
    detail = getattr(outcome, got)
    ok = got == which and (reason is None or str(detail.reason) == reason)
    check(ok, f"expected {which}/{reason}, got {describe(outcome)}")
    return detail


async def health(inference):
    return (await wait_for(inference.health(), 10)).health


async def wait_kv_free(inference, want_free, timeout=20):
    """Polls health() until kvFreeBlocks == want_free and nothing runs; returns the last health."""
    deadline = time.monotonic() + slack(timeout)
    while True:
        h = await health(inference)
        if h.kvFreeBlocks == want_free and h.running == 0 and h.queued == 0:
            return h
        if time.monotonic() > deadline:
            raise TestFailure(f"KV did not come back within {timeout} s: free {h.kvFreeBlocks} of "
                              f"{h.kvTotalBlocks} (want {want_free}), running {h.running}, queued {h.queued}")
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# As a script: a client that streams a long answer and prints "first-token" once tokens flow;
# the disconnect test kills it there.


async def _stream_forever(port, key, max_tokens):
    client, inference = await connect(port)
    call = await start(inference, new_request(key, text=LONG_TEXT, max_tokens=max_tokens))
    await call.sink.first_token
    print("first-token", flush=True)
    await call.sink.finished
    print("finished", describe(call.sink.outcome), flush=True)


def main():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["stream"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--key", default=PREMIUM)
    p.add_argument("--max-tokens", type=int, default=2000)
    a = p.parse_args()
    asyncio.run(capnp.run(_stream_forever(a.port, a.key, a.max_tokens)))


if __name__ == "__main__":
    main()
