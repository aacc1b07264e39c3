#!/usr/bin/env python3
"""Chat with a running tireless-serve over Cap'n Proto RPC and print tokens as they arrive.

    python3 examples/python/client.py --port 7433 --key sk-premium-demo "Name three primary colors."

Uses pycapnp (pip install pycapnp) and the schema in protocol/. Exits 0 when the answer
completed, 1 otherwise (the outcome is printed either way).
"""
import argparse
import asyncio
import os
import sys

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOCOL = os.path.join(HERE, "..", "..", "protocol")
# "/capnp/c++.capnp" resolves against the folder holding the capnp package (pycapnp ships it).
tireless = capnp.load(os.path.join(PROTOCOL, "tireless.capnp"),
                      imports=[PROTOCOL] + [os.path.dirname(p) for p in capnp.__path__])


class Sink(tireless.TokenSink.Server):
    """Receives the streamed tokens and the final outcome."""

    def __init__(self, out):
        self.out = out
        self.text = []
        self.outcome = asyncio.get_running_loop().create_future()

    async def tokens(self, chunk, **kwargs):
        self.text.append(chunk.text)
        self.out.write(chunk.text)
        self.out.flush()

    async def sync(self, **kwargs):
        pass  # every earlier tokens() call has returned by now: the server may send more

    async def done(self, outcome, **kwargs):
        if not self.outcome.done():
            self.outcome.set_result(outcome.as_builder())


def describe(outcome):
    which = outcome.which()
    detail = getattr(outcome, which)
    reason = detail.reason if hasattr(detail, "reason") else ""
    parts = [f"{which}", f"{reason}"]
    if which == "rejected":
        parts.append(f"{detail.message!r}, retry after {detail.retryAfterMs} ms")
    if which == "failed":
        parts.append(detail.message)
    u, t = outcome.usage, outcome.timings
    parts.append(f"{u.promptTokens} prompt + {u.completionTokens} completion tokens")
    parts.append(f"first token {t.timeToFirstTokenMs:.0f} ms, total {t.totalMs:.0f} ms, "
                 f"longest pause {t.longestPauseMs:.0f} ms")
    for d in outcome.degradations:
        parts.append(f"degraded: {d}")
    return "; ".join(str(p) for p in parts if p != "")


async def chat(host, port, key, message, max_tokens, system=None, out=sys.stdout):
    connection = await capnp.AsyncIoStream.create_connection(host=host, port=port)
    client = capnp.TwoPartyClient(connection)
    inference = client.bootstrap().cast_as(tireless.Inference)
    request = tireless.GenerateRequest.new_message()
    request.apiKey = key
    messages = ([("system", system)] if system else []) + [("user", message)]
    msgs = request.input.init("messages", len(messages))
    for i, (role, content) in enumerate(messages):
        msgs[i].role = role
        msgs[i].content = content
    request.maxTokens = max_tokens
    sink = Sink(out)
    result = await inference.generate(request, sink)
    generation = result.generation  # keep it: dropping the Generation cancels the request
    outcome = await sink.outcome
    del generation
    return "".join(sink.text), outcome


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7433)
    parser.add_argument("--key", default="sk-premium-demo")
    parser.add_argument("--system")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    _, outcome = await chat(args.host, args.port, args.key, args.message, args.max_tokens, args.system)
    print()
    print(f"[{describe(outcome)}]")
    return 0 if outcome.which() == "completed" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(capnp.run(main())))
