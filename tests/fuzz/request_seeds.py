#!/usr/bin/env python3
"""Writes serialized GenerateRequest messages (seeds for request_fuzz) into the folder given:
each input form (messages, text, tokens), sampling, stops, timeouts and ids, valid ones and a
few that decode_request refuses. Encoded from Cap'n Proto text by the `capnp` tool (package
capnproto), so no Python Cap'n Proto module is needed."""

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SCHEMA = HERE.parent.parent / "protocol" / "tireless.capnp"

SEEDS = {
    "tokens": '(apiKey = "sk-premium-demo", input = (tokens = [101, 102, 103, 104]), maxTokens = 1)',
    "text": '(apiKey = "k", model = "smollm2", input = (text = "Once upon a time"), maxTokens = 16)',
    "chat": '(apiKey = "sk-premium-demo", input = (messages = [(role = "system", content = "Be brief."),'
            ' (role = "user", content = "Name three primary colors."),'
            ' (role = "assistant", content = "Red, blue, yellow."), (role = "user", content = "Why?")]))',
    "sampling": '(apiKey = "k", input = (tokens = [1]), sampling = (temperature = 0.7, topK = 40, topP = 0.9,'
                ' seed = 42), maxTokens = 64, timeoutMs = 5000, clientRequestId = "req-1")',
    "stops": '(apiKey = "k", input = (text = "a b c"), stop = ["\\n\\n", "END", "é"], maxTokens = 8)',
    "utf8": '(apiKey = "k", input = (messages = [(role = "user", content = "héllo wörld ✓ 😀")]))',
    "bad_utf8": '(apiKey = "k", input = (text = "\\xc3\\x28 broken"))',
    "bad_role": '(apiKey = "k", input = (messages = [(role = "robot", content = "hi")]))',
    "bad_model": '(apiKey = "k", model = "gpt-9", input = (tokens = [5]))',
    "bad_sampling": '(apiKey = "k", input = (tokens = [5]), sampling = (temperature = -1, topP = 0))',
    "bad_numbers": '(apiKey = "k", input = (tokens = [5]), maxTokens = 0, timeoutMs = -5)',
    "empty": '()',
}


def encode(text):
    return subprocess.run(["capnp", "encode", "-I/usr/include", str(SCHEMA), "GenerateRequest"],
                          input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build-fuzz/corpus/request")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in SEEDS.items():
        (out / f"seed_{name}").write_bytes(encode(text))
    print(f"request_seeds: {len(SEEDS)} seeds in {out}")


if __name__ == "__main__":
    main()
