#!/usr/bin/env python3
"""One soak client process: open-loop Poisson arrivals of a mix of well- and badly-behaved
requests against a tireless-serve, every request followed to its one outcome.

    soak_client.py --port P --rate R --seconds S --seed N --out FILE [--chaos]

Behaviours (each request draws one): chats of four tenants that honour retry hints, long
documents (they exhaust the KV pool), clients that disconnect mid-stream, clients that stop
reading for a while, cancels, dropped Generations, deadlines, bad input, unknown keys. With
--chaos it also sends malformed frames and opens silent connections now and then. Writes a
JSON summary to FILE: for every behaviour its outcomes, and the requests that got no outcome
(lost) or more than one.
"""
import argparse
import asyncio
import collections
import gc
import json
import os
import random
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))

import capnp  # noqa: E402

import harness as h  # noqa: E402

KEYS = [h.PREMIUM, h.STANDARD, h.ALICE, h.BOB]
QUESTIONS = ["Name three primary colors.", "What is the capital of France?", "Say hello in Spanish.",
             "What is 2 + 2?", "Name a fruit that is yellow.", "What do bees make?",
             "Give me a word that rhymes with cat.", "What is the opposite of hot?"]
WORDS = ("river stone lantern orchard signal harbor meadow copper violet engine thunder garden "
         "window marble falcon ribbon candle winter summer forest").split()

# (behaviour, weight)
MIX = [("chat", 50), ("document", 10), ("disconnect", 8), ("slow_reader", 7), ("cancel", 5),
       ("drop_generation", 4), ("deadline", 4), ("bad_input", 6), ("unknown_key", 3), ("text", 3)]

RETRYABLE = ("overloaded", "quotaExceeded")
MAX_ATTEMPTS = 3
REQUEST_TIMEOUT_MS = 90_000  # the server's deadline for each request
WAIT_S = 150                 # what a client waits for an outcome before calling it lost


class Stats:
    def __init__(self):
        self.outcomes = collections.defaultdict(collections.Counter)  # behaviour -> "kind/reason" -> n
        self.lost = []          # requests that expected an outcome and got none
        self.duplicates = []    # requests whose sink saw done() more than once
        self.errors = collections.Counter()  # transport errors by kind
        self.failures = collections.Counter()  # failed outcomes by message
        self.requests = collections.Counter()  # behaviour -> requests started
        self.retries = 0
        self.retries_early = 0  # retried sooner than the hint said (never, by construction)
        self.retry_outcomes = collections.Counter()
        self.hints_missing = 0  # an overloaded/quota refusal without a retry hint
        self.preemptions = 0
        self.degraded = 0
        self.malformed_sent = 0
        self.silent_opened = 0
        self.silent_closed_by_server = 0
        self.silent_left_open = 0

    def to_json(self):
        return {
            "outcomes": {b: dict(c) for b, c in self.outcomes.items()},
            "requests": dict(self.requests),
            "lost": self.lost, "duplicates": self.duplicates, "errors": dict(self.errors),
            "failures": dict(self.failures),
            "retries": self.retries, "retries_early": self.retries_early,
            "retry_outcomes": dict(self.retry_outcomes), "hints_missing": self.hints_missing,
            "preemptions": self.preemptions, "degraded": self.degraded,
            "malformed_sent": self.malformed_sent, "silent_opened": self.silent_opened,
            "silent_closed_by_server": self.silent_closed_by_server, "silent_left_open": self.silent_left_open,
        }


def label(outcome):
    which = outcome.which()
    detail = getattr(outcome, which)
    return f"{which}/{detail.reason}" if hasattr(detail, "reason") else which


class TransportError(Exception):
    """A transport error and the stage of the request it broke."""

    def __init__(self, stage, error):
        super().__init__(f"in {stage}: {type(error).__name__}: {str(error).splitlines()[0][:100]}")


class Client:
    def __init__(self, port, rng, stats):
        self.port = port
        self.rng = rng
        self.stats = stats
        self.pool = []
        self.next_id = 0
        self.until = float("inf")  # the end of the load window

    async def connection(self):
        """A shared connection (a new one is used at once); a broken one is replaced."""
        if len(self.pool) < 4:
            self.pool.append(await h.connect(self.port))
            return self.pool[-1]
        return self.rng.choice(self.pool)

    def drop(self, conn):
        if conn in self.pool:
            self.pool.remove(conn)

    def document(self):
        n = self.rng.randint(350, 900)
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def request_for(self, behaviour):
        rng = self.rng
        key = rng.choice(KEYS)
        if behaviour == "chat":
            return h.new_request(key, rng.choice(QUESTIONS), max_tokens=rng.randint(12, 40),
                                 timeoutMs=REQUEST_TIMEOUT_MS)
        if behaviour == "document":
            return h.new_request(rng.choice([h.PREMIUM, h.ALICE, h.STANDARD]),
                                 "Summarize in one line: " + self.document(), max_tokens=16,
                                 timeoutMs=REQUEST_TIMEOUT_MS)
        if behaviour in ("disconnect", "cancel", "drop_generation", "slow_reader"):
            return h.new_request(h.PREMIUM if rng.random() < 0.5 else key, text=h.LONG_TEXT,
                                 max_tokens=rng.randint(40, 160), timeoutMs=REQUEST_TIMEOUT_MS)
        if behaviour == "deadline":
            return h.new_request(key, text=h.LONG_TEXT, max_tokens=200, timeoutMs=rng.randint(100, 1500))
        if behaviour == "text":
            return h.new_request(key, text=rng.choice(QUESTIONS), max_tokens=16, timeoutMs=REQUEST_TIMEOUT_MS)
        if behaviour == "unknown_key":
            return h.new_request("sk-nobody-" + str(rng.randrange(10**6)), "Hi", max_tokens=4)
        # bad_input
        r = h.new_request(key, "Hi", max_tokens=8)
        choice = rng.randrange(4)
        if choice == 0:
            r.sampling.temperature = float("nan")
        elif choice == 1:
            r.maxTokens = -7
        elif choice == 2:
            m = r.input.init("messages", 1)
            m[0].role, m[0].content = "wizard", "hi"
        else:
            r.sampling.topP = 2.0
        return r

    def record(self, behaviour, rid, sink, expect_outcome):
        if sink.done_count > 1:
            self.stats.duplicates.append(f"{behaviour}#{rid}: done() {sink.done_count} times")
        if sink.outcome is None:
            if expect_outcome:
                self.stats.lost.append(f"{behaviour}#{rid}: no outcome after {WAIT_S} s "
                                       f"({sink.received} tokens received)")
            else:
                self.stats.outcomes[behaviour]["(client went away)"] += 1
            return None
        o = sink.outcome
        self.stats.outcomes[behaviour][label(o)] += 1
        if o.which() == "failed":
            self.stats.failures[o.failed.message[:160]] += 1
        self.stats.preemptions += o.usage.preemptions
        self.stats.degraded += 1 if len(o.degradations) else 0
        return o

    async def wait_done(self, sink, timeout):
        try:
            await asyncio.wait_for(asyncio.shield(sink.finished), timeout)
        except asyncio.TimeoutError:
            pass

    async def run(self, behaviour):
        rid = self.next_id
        self.next_id += 1
        self.stats.requests[behaviour] += 1
        try:
            if behaviour == "disconnect":
                await self.disconnect(rid)
            else:
                await self.through_pool(behaviour, rid)
        except Exception as e:  # noqa: BLE001 - a transport error is counted, the soak goes on
            text = str(e) if isinstance(e, TransportError) else f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
            self.stats.errors[f"{behaviour}: {text}"] += 1

    async def through_pool(self, behaviour, rid):
        attempts = 0
        while True:
            attempts += 1
            conn = await self.connection()
            inf = conn[1]
            request = self.request_for(behaviour)
            sink = SlowSink(self.rng.uniform(1.0, 3.0)) if behaviour == "slow_reader" else h.Sink()
            try:
                result = await asyncio.wait_for(inf.generate(request, sink), 30)
            except Exception as e:
                self.drop(conn)
                raise TransportError("generate() itself", e) from e
            generation = result.generation
            try:
                if behaviour == "cancel":
                    await self.wait_first_token(sink, 30)
                    await generation.cancel()
                elif behaviour == "drop_generation":
                    await self.wait_first_token(sink, 30)
                    del generation, result
                    gc.collect()
            except Exception as e:
                self.drop(conn)
                raise TransportError("a call on the Generation", e) from e
            await self.wait_done(sink, WAIT_S)
            outcome = self.record(behaviour, rid, sink, True)
            if outcome is not None and attempts > 1:
                self.stats.retry_outcomes[label(outcome)] += 1
            if outcome is None or outcome.which() != "rejected":
                return
            reason = str(outcome.rejected.reason)
            if reason not in RETRYABLE:
                return
            hint = outcome.rejected.retryAfterMs
            if hint < 0:
                self.stats.hints_missing += 1
                return
            if attempts >= MAX_ATTEMPTS or behaviour not in ("chat", "document", "text"):
                return
            wait = hint / 1000 + self.rng.uniform(0, 0.5)
            if time.monotonic() + wait > self.until:
                return  # no retries after the load window: the run winds down
            t0 = time.monotonic()
            await asyncio.sleep(wait)
            if (time.monotonic() - t0) * 1000 < hint:
                self.stats.retries_early += 1
            self.stats.retries += 1
            self.stats.requests[behaviour + " (retry)"] += 1

    async def wait_first_token(self, sink, timeout):
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(first_or_done(sink))), timeout)
        except asyncio.TimeoutError:
            pass

    async def disconnect(self, rid):
        client, inf = await h.connect(self.port)
        sink = h.Sink()
        result = await asyncio.wait_for(inf.generate(self.request_for("disconnect"), sink), 30)
        await asyncio.sleep(self.rng.uniform(0.2, 3.0))
        del result, inf
        client.close()  # the server sees the connection go: it cancels the request
        del client
        self.record("disconnect", rid, sink, False)


async def first_or_done(sink):
    done = asyncio.ensure_future(asyncio.shield(sink.finished))
    first = asyncio.ensure_future(asyncio.shield(sink.first_token))
    await asyncio.wait([done, first], return_when=asyncio.FIRST_COMPLETED)


class SlowSink(h.Sink):
    """Stops reading for a while: its first three tokens() calls each take `pause` seconds."""

    def __init__(self, pause):
        super().__init__()
        self.pause = pause
        self.calls = 0

    async def tokens(self, chunk, **kwargs):
        await super().tokens(chunk, **kwargs)
        self.calls += 1
        if self.calls <= 3:
            await asyncio.sleep(self.pause)


def garbage_frames(rng):
    yield bytes(rng.randrange(256) for _ in range(256))
    yield struct.pack("<II", 0, 64) + b"\x00" * 40
    yield struct.pack("<III", 0xFFFFFFF0, 1, 1)
    yield struct.pack("<II", 0, 8) + bytes([0xFF]) * 64


async def send_garbage(port, data):
    """Sends garbage and waits (at most 5 s) for the server to close the connection."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        writer.write(data)
        await writer.drain()
        await asyncio.wait_for(reader.read(), 5)
    except (OSError, asyncio.TimeoutError):
        pass
    finally:
        writer.close()


async def silent_connection_closed(port, wait_s):
    """Opens a connection that never speaks; True when the server closes it within wait_s."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    try:
        return await asyncio.wait_for(reader.read(1), wait_s) == b""
    except ConnectionResetError:
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        writer.close()


async def chaos(port, rng, stats, until, handshake_s):
    # No threads here: a pycapnp object freed by a garbage collection on another thread
    # than the event loop's aborts the process.
    frames = list(garbage_frames(rng))
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(5, 15))
        await send_garbage(port, rng.choice(frames))
        stats.malformed_sent += 1
        stats.silent_opened += 1
        if await silent_connection_closed(port, handshake_s + 10):
            stats.silent_closed_by_server += 1
        else:
            stats.silent_left_open += 1


async def main_async(args):
    rng = random.Random(args.seed)
    stats = Stats()
    client = Client(args.port, rng, stats)
    behaviours = [b for b, _ in MIX]
    weights = [w for _, w in MIX]
    tasks = set()
    until = time.monotonic() + args.seconds
    client.until = until
    background = None
    if args.chaos:
        background = asyncio.ensure_future(chaos(args.port, random.Random(args.seed + 1), stats, until,
                                                 args.handshake_s))
    while time.monotonic() < until:
        await asyncio.sleep(rng.expovariate(args.rate))
        t = asyncio.ensure_future(client.run(rng.choices(behaviours, weights)[0]))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=WAIT_S + 60)
    if background:
        await background
    with open(args.out, "w") as f:
        json.dump(stats.to_json(), f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rate", type=float, required=True, help="requests per second")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--chaos", action="store_true", help="malformed frames and silent connections too")
    p.add_argument("--handshake-s", type=float, default=10.0, help="the server's handshake timeout")
    args = p.parse_args()
    asyncio.run(capnp.run(main_async(args)))


if __name__ == "__main__":
    main()
