#!/usr/bin/env python3
"""End-to-end tests of tireless-serve's OpenAI-compatible HTTP API with real clients: the
official `openai` package (sync, async, streaming, its exception types and its retries), curl,
requests and raw sockets.

    python3 tests/e2e/run_http_e2e.py --server build/tools/tireless-serve --config config/tireless.toml
                                      [-k SUBSTRING ...] [--keep]

The server runs with the test configuration of harness.test_overrides, HTTP on a free port, and
one more tenant for quota tests (sk-solo-test: standard tier, one request at a time). Every
test_* function below runs in order; the server is restarted if a test stopped it. The last
line says "N passed, N failed". Exit 0: all passed; 1: a failure; 77: the model file is missing.
"""
import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import openai
    import requests
except ImportError as e:
    print(f"FAIL: {e.name} is not installed (scripts/setup installs it)")
    print("0 passed, 1 failed")
    sys.exit(1)

sys.path.insert(0, os.path.join(HERE, "..", "..", "clients", "python"))
import tireless_client as tc  # noqa: E402

import harness as h  # noqa: E402
from harness import LONG_TEXT, PREMIUM, STANDARD, check  # noqa: E402

MODEL = "smollm2"
SOLO = "sk-solo-test"  # standard tier, max_concurrent = 1
SOLO_TENANT = """
[[tenants]]
name = "solo"
keys = ["sk-solo-test"]
tier = "standard"
max_concurrent = 1
"""


def add_solo_tenant(text):
    marker = "[[tenants]]"
    i = text.index(marker)
    return text[:i] + SOLO_TENANT.lstrip() + "\n" + text[i:]


class Context:
    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        self.server = None
        self.starts = 0
        self.notes = []

    def ensure_server(self):
        if self.server is None or not self.server.alive():
            self.starts += 1
            self.server = h.Server(self.args.server, self.args.config, self.workdir, name=f"http{self.starts}",
                                   http=True, metrics=True, edit=add_solo_tenant)
        return self.server

    @property
    def url(self):
        return self.server.base_url

    def client(self, key=PREMIUM, **kw):
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", h.slack(60))
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, **kw)

    def health(self, path="/health"):
        r = requests.get(self.url + path, timeout=h.slack(10))
        return r.status_code, r.json()


def wait_until_idle(ctx, timeout=20):
    """Waits until the server runs and queues nothing; returns its last /health body."""
    deadline = time.monotonic() + h.slack(timeout)
    body = None
    while time.monotonic() < deadline:
        _, body = ctx.health()
        if body["running"] == 0 and body["queued"] == 0:
            return body
        time.sleep(0.1)
    raise h.TestFailure(f"the server still runs requests after {timeout} s: {body}")


# ---------------------------------------------------------------------------------------------
# The official openai package


def test_models_health_ready(ctx):
    models = ctx.client().models.list()
    ids = [m.id for m in models.data]
    check(ids == [MODEL], f"/v1/models lists {ids}")
    status, body = ctx.health("/health")
    check(status == 200 and body["status"] == "ok", f"/health: {status} {body}")
    status, body = ctx.health("/ready")
    check(status == 200 and body["accepting"], f"/ready: {status} {body}")


def test_chat_completion(ctx):
    r = ctx.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three primary colors."}], max_tokens=24)
    choice = r.choices[0]
    check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), f"object {r.object}, id {r.id}")
    check(choice.message.role == "assistant" and choice.message.content.strip(), f"message {choice.message}")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
    check(r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 24, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, f"usage {r.usage}")
    check(r.model == MODEL, f"model {r.model}")
    check(r.model_extra.get("degradations") == [], f"degradations {r.model_extra.get('degradations')}")


def test_completions_greedy_and_seeded(ctx):
    c = ctx.client()
    a = c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=16, temperature=0)
    b = c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=16, temperature=0)
    check(a.choices[0].text == b.choices[0].text and a.choices[0].text, "greedy completions differ")
    check(a.choices[0].finish_reason == "length", f"finish_reason {a.choices[0].finish_reason} at max_tokens")
    # Sampled (OpenAI's default temperature 1): the same seed gives the same text.
    s1 = c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=16, seed=1234)
    s2 = c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=16, seed=1234)
    check(s1.choices[0].text == s2.choices[0].text, "the same seed gave different texts")
    texts = {c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=16, seed=s).choices[0].text
             for s in (1, 2, 3, 4)}
    check(len(texts) > 1, "four seeds at temperature 1 gave one text: sampling is not applied")


def test_stream_equals_whole(ctx):
    c = ctx.client()
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0)
    stream = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    pieces, finish, usage, roles, extra = [], None, None, [], None
    for chunk in stream:
        check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            if ch.delta.content:
                pieces.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
                extra = chunk.model_extra
    text = "".join(pieces)
    check(text == whole.choices[0].message.content, f"stream {text!r} != whole {whole.choices[0].message.content!r}")
    check(roles == ["assistant"], f"roles in deltas: {roles}")
    check(finish == whole.choices[0].finish_reason, f"finish {finish} vs {whole.choices[0].finish_reason}")
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, f"usage {usage}")
    check(extra is not None and "degradations" in extra, "the final chunk has no degradations field")
    # Completions stream too.
    parts = [ch.choices[0].text for ch in c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=12,
                                                                 temperature=0, stream=True) if ch.choices]
    greedy = c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=12, temperature=0).choices[0].text
    check("".join(parts) == greedy, f"completion stream {''.join(parts)!r} != {greedy!r}")


def test_streams_of_multibyte_text_and_held_back_stop_strings_end_as_the_whole_answer(ctx):
    """Tokens that carry half a character, and text held back because it may begin a stop
    string, still reach a stream (and release its window): streamed text equals the whole."""
    prompt = "日本語の文章を書きます。東京は"  # the model continues with multi-byte text
    params = dict(model=MODEL, prompt=prompt, max_tokens=80, temperature=0, stop=["。。。。"])
    c = ctx.client()
    whole = c.completions.create(**params).choices[0].text
    check(any(ord(ch) > 127 for ch in whole), f"the answer has no multi-byte text: {whole!r}")
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **params) if ch.choices)
    check(streamed == whole, f"openai stream {streamed!r} != whole {whole!r}")
    for client in (tc.Client(ctx.url, api_key=PREMIUM), tc.Client(f"capnp://{ctx.server.host}:{ctx.server.port}",
                                                                   api_key=PREMIUM)):
        pieces = []
        r = client.complete(prompt, on_text=pieces.append, max_tokens=80, temperature=0, stop=["。。。。"])
        check("".join(pieces) == r.text == whole, f"{client.endpoints[0]}: streamed {''.join(pieces)!r}, "
                                                   f"result {r.text!r}, whole {whole!r}")
    # Far past the stream window (8 tokens in the test config) of tokens that may carry no text.
    # Far past the stream window (8 tokens in the test config): each "。" is held back (it may
    # begin the stop string), a token without text.
    long = c.with_options(timeout=h.slack(60)).completions.create(model=MODEL, prompt=prompt, max_tokens=300,
                                                                 temperature=0, stream=True, stop=["。。。。"])
    finish = [ch.choices[0].finish_reason for ch in long if ch.choices and ch.choices[0].finish_reason]
    check(finish and finish[-1] in ("length", "stop"), f"a long multi-byte stream did not finish: {finish}")


def test_logprobs_as_the_openai_package_reads_them(ctx):
    """Chat's logprobs.content and completions' parallel lists, whole and streamed: one entry per
    generated token, the tokens' bytes spell the text, greedy picks the most likely token."""
    c = ctx.client()
    msgs = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0, logprobs=True,
                                      top_logprobs=3)
    content = whole.choices[0].logprobs.content
    check(len(content) == whole.usage.completion_tokens, f"{len(content)} logprobs, "
                                                          f"{whole.usage.completion_tokens} tokens")
    for e in content:
        check(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token, f"greedy but not the top: {e}")
        check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6 and e.logprob <= 0, f"logprob {e}")
        check(sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1.0001, f"top probabilities over 1: {e}")
    spelled = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    check(spelled.startswith(whole.choices[0].message.content), f"bytes spell {spelled!r}, text "
                                                                 f"{whole.choices[0].message.content!r}")
    streamed = [e for ch in c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=20, temperature=0,
                                                      logprobs=True, top_logprobs=3, stream=True)
                for choice in ch.choices if choice.logprobs for e in choice.logprobs.content]
    check([e.token for e in streamed] == [e.token for e in content], "streamed logprobs differ from the whole's")
    check(all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, content)), "streamed logprob values differ")
    plain = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    check(plain.choices[0].logprobs is None, "logprobs without asking")

    legacy = c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=12, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    n = legacy.usage.completion_tokens
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n,
          f"completions logprobs lists are not one per token ({n}): {lp}")
    check("".join(lp.tokens) == legacy.choices[0].text, f"tokens {lp.tokens} do not spell {legacy.choices[0].text!r}")
    check(lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0, f"text_offset {lp.text_offset}")
    check(all(t in top and len(top) <= 3 for t, top in zip(lp.tokens, lp.top_logprobs)), f"top {lp.top_logprobs}")
    # Sampled at temperature 1 the reported logprob is still the model's: the same for the same token.
    s = c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=1, temperature=1, seed=5, logprobs=0)
    check(s.choices[0].logprobs.token_logprobs[0] <= 0, f"logprob {s.choices[0].logprobs}")


def test_penalties_and_min_p_reach_the_sampler(ctx):
    """Greedy text that repeats itself repeats less under each penalty (deterministic: greedy)."""
    c = ctx.client()
    prompt = "The list of fruits: apple, banana,"

    def distinct_share(**kw):
        text = c.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, **kw).choices[0].text
        words = text.split()
        return len(set(words)) / max(1, len(words)), text

    plain, plain_text = distinct_share()
    for kw in ({"extra_body": {"repetition_penalty": 1.3}}, {"frequency_penalty": 1.0}, {"presence_penalty": 1.5}):
        share, text = distinct_share(**kw)
        check(text != plain_text, f"{kw} did not change the greedy text {plain_text!r}")
        check(share > plain, f"{kw}: {share:.2f} of the words distinct, no more than without ({plain:.2f})")
    # min_p = 1 keeps only the most likely token: sampling at temperature 1 becomes greedy.
    greedy = c.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0).choices[0].text
    sampled = c.completions.create(model=MODEL, prompt=prompt, max_tokens=16, seed=5,
                                   extra_body={"min_p": 1.0}).choices[0].text
    check(sampled == greedy, f"min_p = 1 at temperature 1 gave {sampled!r}, greedy {greedy!r}")


def test_async_client(ctx):
    async def run():
        client = openai.AsyncOpenAI(base_url=ctx.url + "/v1", api_key=PREMIUM, max_retries=0, timeout=h.slack(60))
        prompts = [f"Count from {i} to {i + 3}." for i in range(4)]
        results = await asyncio.gather(*[
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=12)
            for p in prompts])
        stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                      max_tokens=8, stream=True)
        streamed = [c async for c in stream]
        await client.close()
        return results, streamed

    results, streamed = asyncio.run(run())
    check(all(r.choices[0].message.content for r in results), "an async completion came back empty")
    check(len({r.id for r in results}) == 4, "async responses share ids")
    check(len(streamed) >= 2, f"async stream gave {len(streamed)} chunks")


def test_errors_are_the_openai_exceptions(ctx):
    def expect_error(kind, fn, status, code=None, param=None):
        try:
            fn()
        except kind as e:
            check(e.status_code == status, f"{kind.__name__}: status {e.status_code}, expected {status}")
            body = e.body or {}
            if code is not None:
                check(body.get("code") == code, f"{kind.__name__}: code {body.get('code')}, expected {code}")
            if param is not None:
                check(body.get("param") == param, f"{kind.__name__}: param {body.get('param')}, expected {param}")
            check(body.get("message"), f"{kind.__name__}: no message in {body}")
            return body
        raise h.TestFailure(f"expected {kind.__name__}, got a response")

    msgs = [{"role": "user", "content": "Hi"}]
    expect_error(openai.AuthenticationError,
                 lambda: ctx.client(key="sk-nobody").chat.completions.create(model=MODEL, messages=msgs), 401,
                 code="invalid_api_key")
    expect_error(openai.NotFoundError,
                 lambda: ctx.client().chat.completions.create(model="gpt-4o", messages=msgs), 404,
                 code="model_not_found", param="model")
    expect_error(openai.BadRequestError,
                 lambda: ctx.client().chat.completions.create(model=MODEL, messages=msgs, n=2), 400, param="n")
    expect_error(openai.BadRequestError,
                 lambda: ctx.client().chat.completions.create(model=MODEL, messages=msgs, temperature=3), 400,
                 param="temperature")
    expect_error(openai.BadRequestError,
                 lambda: ctx.client().chat.completions.create(model=MODEL, messages=[]), 400, param="messages")
    expect_error(openai.BadRequestError,
                 lambda: ctx.client().chat.completions.create(model=MODEL, messages=msgs, top_logprobs=2), 400,
                 param="top_logprobs")
    long_doc = "The quick brown fox jumps over the lazy dog. " * 4000  # far past the context
    body = expect_error(openai.BadRequestError,
                        lambda: ctx.client().completions.create(model=MODEL, prompt=long_doc, max_tokens=4), 400,
                        code="context_length_exceeded")
    check("split" in body["message"].lower(), f"the prompt_too_long message gives no hint to split: {body}")


def test_bad_input_battery(ctx):
    """Bodies a careless or hostile client sends: each gets a 4xx with an OpenAI error body that
    names what was wrong; the server stays up and serves the next request."""
    url = ctx.url + "/v1/chat/completions"
    auth = {"Authorization": f"Bearer {PREMIUM}", "Content-Type": "application/json"}
    ok_msgs = [{"role": "user", "content": "Hi"}]
    cases = [
        (b"", 400, None),
        (b"{", 400, None),
        (b"[1, 2, 3]", 400, None),
        (b"\xff\xfe{}", 400, None),
        (b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', 400, None),  # invalid UTF-8
        (json.dumps({"messages": "hello"}).encode(), 400, "messages"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(), 400, "messages[0].role"),
        (json.dumps({"messages": [{"role": "user"}]}).encode(), 400, "messages[0].content"),
        (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(), 400,
         "messages[0].content[0].type"),
        (json.dumps({"messages": [{"role": "user", "content": "a\u0000b"}]}).encode(), 400, "messages[0].content"),
        (json.dumps({"messages": ok_msgs, "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": ok_msgs, "max_tokens": "ten"}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": ok_msgs, "max_tokens": 1e30}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": ok_msgs, "top_p": 0}).encode(), 400, "top_p"),
        (json.dumps({"messages": ok_msgs, "stop": [1, 2]}).encode(), 400, "stop[0]"),
        (json.dumps({"messages": ok_msgs, "stop": ["x"] * 100}).encode(), 400, "stop"),
        (json.dumps({"messages": ok_msgs, "stream": "yes"}).encode(), 400, "stream"),
        (json.dumps({"messages": ok_msgs, "stream_options": {"include_usage": 1}}).encode(), 400,
         "stream_options.include_usage"),
        (json.dumps({"messages": ok_msgs, "presence_penalty": 5}).encode(), 400, "presence_penalty"),
        (json.dumps({"messages": ok_msgs, "seed": "abc"}).encode(), 400, "seed"),
        (json.dumps({"model": 7, "messages": ok_msgs}).encode(), 400, "model"),
        (b"[" * 100000, 400, None),  # deep nesting
    ]
    for body, status, param in cases:
        r = requests.post(url, data=body, headers=auth, timeout=h.slack(30))
        check(r.status_code == status, f"{body[:60]!r}: status {r.status_code}, expected {status}: {r.text[:200]}")
        err = r.json().get("error", {})
        check(err.get("type") == "invalid_request_error" and err.get("message"), f"{body[:60]!r}: body {r.text[:200]}")
        if param:
            check(err.get("param") == param, f"{body[:60]!r}: param {err.get('param')}, expected {param}")
    # Unknown fields are ignored, as OpenAI does.
    r = requests.post(url, json={"messages": ok_msgs, "max_tokens": 4, "frobnicate": {"x": 1}, "tools": None},
                      headers=auth, timeout=h.slack(30))
    check(r.status_code == 200, f"an unknown field was refused: {r.status_code} {r.text[:200]}")
    # Wrong routes and methods.
    check(requests.get(url, headers=auth, timeout=10).status_code == 405, "GET on a POST route is not 405")
    check(requests.get(ctx.url + "/v2/nothing", timeout=10).status_code == 404, "an unknown route is not 404")
    # A body far over the limit: 413, with the hint to split.
    big = b'{"prompt": "' + b"a" * (80 << 20) + b'"}'
    try:
        r = requests.post(ctx.url + "/v1/completions", data=big, headers=auth, timeout=h.slack(60))
        check(r.status_code == 413 and "split" in r.text.lower(), f"an 80 MB body: {r.status_code} {r.text[:200]}")
    except requests.exceptions.ConnectionError:
        pass  # the server may answer and close before the client finished sending: also fine
    check(ctx.server.alive(), "the server died on bad input")
    wait_until_idle(ctx)


def test_curl(ctx):
    """The README's curl lines work as written."""
    base = ["curl", "-sS", "--max-time", str(int(h.slack(60)))]
    out = subprocess.run(base + [ctx.url + "/v1/chat/completions", "-H", f"Authorization: Bearer {PREMIUM}",
                                 "-H", "Content-Type: application/json", "-d",
                                 json.dumps({"model": MODEL, "max_tokens": 8,
                                             "messages": [{"role": "user", "content": "Hello!"}]})],
                         capture_output=True, text=True, timeout=h.slack(90))
    check(out.returncode == 0, f"curl exited {out.returncode}: {out.stderr}")
    body = json.loads(out.stdout)
    check(body["choices"][0]["message"]["content"], f"curl got {out.stdout[:200]}")
    out = subprocess.run(base + ["-N", ctx.url + "/v1/completions", "-H", f"Authorization: Bearer {PREMIUM}",
                                 "-d", json.dumps({"prompt": LONG_TEXT, "max_tokens": 8, "stream": True})],
                         capture_output=True, text=True, timeout=h.slack(90))
    events = [line for line in out.stdout.splitlines() if line.startswith("data: ")]
    check(events and events[-1] == "data: [DONE]", f"curl -N stream ends with {events[-1:]}")
    check(len(events) >= 3, f"curl -N stream has {len(events)} events")


# ---------------------------------------------------------------------------------------------
# 429, retries and Retry-After


class RetryLog(logging.Handler):
    """Collects the openai package's 'Retrying request ... in X seconds' waits."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.waits = []

    def emit(self, record):
        msg = record.getMessage()
        if "Retrying request" in msg and " in " in msg:
            try:
                self.waits.append(float(msg.rsplit(" in ", 1)[1].split()[0]))
            except ValueError:
                pass


def hold_solo_slot(ctx, started, tokens=60):
    """Runs one streaming request of the solo tenant to its end (in a thread)."""
    stream = ctx.client(key=SOLO).completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=tokens,
                                                     temperature=0, stream=True)
    for _ in stream:
        started.set()
    started.set()


def test_429_retry_after(ctx):
    started = threading.Event()
    holder = threading.Thread(target=hold_solo_slot, args=(ctx, started, 80))
    holder.start()
    try:
        check(started.wait(h.slack(30)), "the slot holder never started")
        r = requests.post(ctx.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {SOLO}"},
                          json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}, timeout=h.slack(30))
        check(r.status_code == 429, f"a second request of a one-at-a-time tenant: {r.status_code} {r.text[:200]}")
        err = r.json()["error"]
        ms = err.get("retry_after_ms")
        check(isinstance(ms, int) and ms > 0, f"no retry_after_ms in the body: {err}")
        check(r.headers.get("retry-after-ms") == str(ms), f"retry-after-ms header {r.headers.get('retry-after-ms')}")
        check(r.headers.get("Retry-After") == str(math.ceil(ms / 1000)),
              f"Retry-After {r.headers.get('Retry-After')} for {ms} ms")
        check(err.get("type") == "rate_limit_error" and err.get("code") == "quota_exceeded", f"error {err}")
        try:
            ctx.client(key=SOLO).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                         max_tokens=4)
            raise h.TestFailure("no RateLimitError while the slot is held")
        except openai.RateLimitError as e:
            check(e.status_code == 429, f"RateLimitError status {e.status_code}")
    finally:
        holder.join(h.slack(60))

    # The openai package's own retries honour retry-after-ms: it waits what the server said,
    # retries, and gets through once the slot is free.
    log = RetryLog()
    logger = logging.getLogger("openai")
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(log)
    started = threading.Event()
    holder = threading.Thread(target=hold_solo_slot, args=(ctx, started, 40))
    holder.start()
    try:
        check(started.wait(h.slack(30)), "the slot holder never started")
        first = requests.post(ctx.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {SOLO}"},
                              json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                              timeout=h.slack(30))
        told = int(first.headers.get("retry-after-ms", "0")) / 1000 if first.status_code == 429 else None
        r = ctx.client(key=SOLO, max_retries=8).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        check(r.choices[0].message.content is not None, "no completion after retries")
    finally:
        holder.join(h.slack(60))
        logger.removeHandler(log)
        logger.setLevel(old_level)
    if told is not None:
        check(log.waits, "the openai client got through without a retry while the slot was held")
        check(all(w > 0.05 for w in log.waits), f"retry waits {log.waits}")
        ctx.notes.append(f"the server said retry after {told:.2f} s; the openai client waited {log.waits}")


def test_backoff_loop_of_the_articles(ctx):
    """The client pattern the articles show (requests, a timeout, exponential backoff), made
    honest by Retry-After: it never retries sooner than the server said, and gets through."""
    started = threading.Event()
    holder = threading.Thread(target=hold_solo_slot, args=(ctx, started, 40))
    holder.start()
    attempts = 0
    try:
        check(started.wait(h.slack(30)), "the slot holder never started")
        delay, body = 0.25, None
        deadline = time.monotonic() + h.slack(60)
        while time.monotonic() < deadline:
            attempts += 1
            r = requests.post(ctx.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {SOLO}"},
                              json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                              timeout=h.slack(30))
            if r.status_code == 200:
                body = r.json()
                break
            check(r.status_code == 429, f"status {r.status_code}: {r.text[:200]}")
            time.sleep(max(float(r.headers["retry-after-ms"]) / 1000, delay))  # never sooner than told
            delay = min(delay * 2, 8)
        check(body is not None, f"no success in {attempts} attempts")
    finally:
        holder.join(h.slack(60))
    check(attempts >= 2, "the first attempt got through: the slot was not held")
    ctx.notes.append(f"backoff loop got through after {attempts} attempts")


# ---------------------------------------------------------------------------------------------
# Resources: cancellation, flow control, shutdown


def test_connections_over_the_limit_get_503_and_room_comes_back(ctx):
    """server.max_connections caps the HTTP listener too: one connection more is answered 503
    with Retry-After and closed; once a connection closes, a new one is served."""
    server = h.Server(ctx.args.server, ctx.args.config, ctx.workdir, name="connlimit", http=True,
                      overrides={("server", "max_connections"): 3})
    try:
        held = [socket.create_connection((server.host, server.http_port), timeout=h.slack(10)) for _ in range(3)]
        time.sleep(0.3)  # accepted by the server's loop
        extra = socket.create_connection((server.host, server.http_port), timeout=h.slack(10))
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := extra.recv(4096):
            reply += chunk
        extra.close()
        head, _, body = reply.partition(b"\r\n\r\n")
        check(head.startswith(b"HTTP/1.1 503"), f"over the limit: {head[:80]!r}")
        check(b"Retry-After: 1" in head, f"no Retry-After in {head!r}")
        check(json.loads(body)["error"]["code"] == "too_many_connections", f"body {body!r}")
        held.pop().close()
        deadline = time.monotonic() + h.slack(10)
        while True:
            try:
                r = requests.get(server.base_url + "/health", timeout=h.slack(5))
                if r.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            check(time.monotonic() < deadline, "no room after a connection closed")
            time.sleep(0.1)
        for c in held:
            c.close()
    finally:
        server.stop(timeout=h.SHUTDOWN_GRACE_MS / 1000 + 5)


def http_get_on(sock, path="/health"):
    """One GET on an open keep-alive connection; the status line, or b"" if the server had closed it."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(4096)
        if not chunk:
            return b""
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(4096)
    return head.split(b"\r\n")[0]


def test_keep_alive_follows_server_http_keep_alive_ms(ctx):
    """server.http_keep_alive_ms sets how long an idle HTTP connection stays open between two
    requests: longer than kj's 5-s default, a connection idle 6 s still serves; shorter, the
    server closes it (what a proxy in front has to know, deploy/nginx)."""
    for keep_ms, idle_s, open_after in ((9000, 6.0, True), (300, None, False)):
        server = h.Server(ctx.args.server, ctx.args.config, ctx.workdir, name=f"keepalive{keep_ms}", http=True,
                          overrides={("server", "http_keep_alive_ms"): keep_ms})
        try:
            sock = socket.create_connection((server.host, server.http_port), timeout=h.slack(20))
            check(http_get_on(sock).startswith(b"HTTP/1.1 200"), "first GET on the connection")
            if open_after:
                time.sleep(idle_s)
                status = http_get_on(sock)
                check(status.startswith(b"HTTP/1.1 200"),
                      f"idle {idle_s} s with http_keep_alive_ms = {keep_ms}: the connection was closed ({status!r})")
            else:
                # The server closes it by itself: recv sees the end, well before kj's 5-s default.
                start = time.monotonic()
                check(sock.recv(4096) == b"", "bytes on an idle connection")
                waited = time.monotonic() - start
                check(waited < 4.5, f"with http_keep_alive_ms = {keep_ms} the idle connection closed after {waited:.1f} s")
            sock.close()
        finally:
            server.stop(timeout=h.SHUTDOWN_GRACE_MS / 1000 + 5)


def test_client_going_away_cancels(ctx):
    wait_until_idle(ctx)
    # Not streamed: the client times out while the server generates; the request must stop.
    try:
        ctx.client(timeout=1.0).completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=3000, temperature=0)
        raise h.TestFailure("a 3000-token completion finished within a 1 s timeout")
    except openai.APITimeoutError:
        pass
    wait_until_idle(ctx, timeout=10)
    # Streamed: the client reads a few chunks and closes the stream.
    stream = ctx.client().completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=3000, temperature=0,
                                             stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    wait_until_idle(ctx, timeout=10)


def test_slow_reader_pauses_its_stream(ctx):
    """A stream's reader that stops reading stops its sequence (the window, then the socket's
    small buffer), instead of the server buffering the whole answer."""
    if h.SANITIZED:
        ctx.notes.append("skipped under sanitizers (needs 1500 tokens at full speed)")
        return
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((ctx.server.host, ctx.server.http_port))
    body = json.dumps({"prompt": LONG_TEXT, "max_tokens": 1500, "stream": True, "temperature": 0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s"
              % (PREMIUM.encode(), len(body), body))
    s.recv(1024)
    stop_reading = 8.0  # long enough to fill the window and the buffers on a slow or busy machine
    time.sleep(stop_reading)
    data = b""
    s.settimeout(h.slack(120))
    while b"[DONE]" not in data:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    finals = [json.loads(line[6:]) for line in data.decode(errors="replace").splitlines()
              if line.startswith("data: {") and '"finish_reason":"length"' in line]
    check(finals, "no final chunk")
    pause = finals[-1]["tireless"]["longest_pause_ms"]
    check(pause >= 1000, f"the longest pause was {pause:.0f} ms while the reader stopped for {stop_reading} s: "
                         "the stream was buffered, not paused")
    ctx.notes.append(f"reader stopped {stop_reading} s; the sequence paused {pause:.0f} ms")


def test_ready_turns_503_on_sigterm_and_streams_end(ctx):
    server = ctx.server
    url = ctx.url
    result = {}

    def streamer():
        try:
            stream = ctx.client().completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=400, temperature=0,
                                                     stream=True)
            result["chunks"] = sum(1 for _ in stream)
        except openai.APIError as e:
            result["error"] = e

    t = threading.Thread(target=streamer)
    t.start()
    time.sleep(h.slack(0.5))
    server.terminate()
    time.sleep(0.2)
    statuses = set()
    refused = None
    try:
        statuses.add(requests.get(url + "/ready", timeout=5).status_code)
        refused = requests.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {PREMIUM}"},
                                json={"messages": [{"role": "user", "content": "Hi"}]}, timeout=5)
    except requests.exceptions.ConnectionError:
        pass  # already gone: possible on a very fast stop
    t.join(h.slack(60))
    code = server.wait(h.slack(30))
    check(code == 0, f"the server exited {code} after SIGTERM")
    if statuses:
        check(statuses == {503}, f"/ready during the grace period: {statuses}")
    if refused is not None:
        check(refused.status_code == 503 and refused.headers.get("Retry-After"),
              f"a new request while stopping: {refused.status_code} {refused.text[:200]}")
    check("chunks" in result or "error" in result, "the running stream got no end")


# ---------------------------------------------------------------------------------------------
# Metrics: the text format, and a real Prometheus scraping the server


def scrape(url):
    from prometheus_client.parser import text_string_to_metric_families
    r = requests.get(url, timeout=h.slack(10))
    check(r.status_code == 200, f"{url}: {r.status_code}")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def test_metrics_speak_prometheus_and_the_inference_gateway_protocol(ctx):
    c = ctx.client()
    c.completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=8)
    try:
        ctx.client(key="sk-nobody").completions.create(model=MODEL, prompt=LONG_TEXT, max_tokens=8)
    except openai.AuthenticationError:
        pass
    own = scrape(f"http://{ctx.server.host}:{ctx.server.metrics_port}/metrics")
    same = scrape(ctx.url + "/metrics")
    for samples in (own, same):
        # The Gateway API Inference Extension's model-server protocol.
        for name in ("tireless_num_requests_waiting", "tireless_num_requests_running", "tireless_kv_cache_usage_perc"):
            check(name in samples, f"{name} is missing")
        info = samples.get("tireless_cache_config_info", [])
        check(info and info[0][0].get("block_size") == "16" and int(info[0][0]["num_gpu_blocks"]) > 0,
              f"cache_config_info {info}")
        completed = sum(v for labels, v in samples["tireless_requests_total"]
                        if labels.get("tier") == "premium" and labels.get("outcome") == "completed")
        check(completed >= 1, f"no completed premium request counted: {samples['tireless_requests_total']}")
        check(any(labels.get("reason") == "unauthenticated" for labels, v in samples["tireless_requests_total"]
                  if v > 0), "the unauthenticated refusal is not counted")
        check(samples["tireless_steps_total"][0][1] > 0, "no steps counted")
        check(any(v > 0 for _, v in samples["tireless_step_time_seconds_count"]), "no step time observed")
        check(any(labels.get("tier") == "premium" and v > 0
                  for labels, v in samples["tireless_time_to_first_token_seconds_count"]), "no TTFT observed")
        for tier in ("premium", "standard", "free"):
            check(any(labels.get("tier") == tier for labels, _ in samples["tireless_queue_depth"]),
                  f"no queue depth series for tier {tier}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_prometheus_sees_the_values_move_under_load(ctx):
    binary = shutil.which("prometheus")
    check(binary is not None, "the prometheus binary is missing (scripts/setup installs Debian's prometheus)")
    work = tempfile.mkdtemp(prefix="prometheus-", dir=ctx.workdir)
    port = free_port()
    with open(os.path.join(work, "prometheus.yml"), "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: tireless
    static_configs:
      - targets: ["{ctx.server.host}:{ctx.server.metrics_port}"]
""")
    log = open(os.path.join(work, "prometheus.log"), "wb")
    proc = subprocess.Popen([binary, f"--config.file={work}/prometheus.yml", f"--storage.tsdb.path={work}/data",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(q):
        r = requests.get(api, params={"query": q}, timeout=10)
        data = r.json()
        check(data.get("status") == "success", f"{q}: {r.text[:300]}")
        return [float(x["value"][1]) for x in data["data"]["result"]]

    try:
        deadline = time.monotonic() + h.slack(60)
        up = []
        while time.monotonic() < deadline:
            try:
                up = query('up{job="tireless"}')
                if up == [1.0]:
                    break
            except (requests.exceptions.ConnectionError, h.TestFailure):
                pass
            time.sleep(0.5)
        check(up == [1.0], f"Prometheus never scraped the server (up = {up})")
        before = sum(query('tireless_requests_total{outcome="completed"}'))
        # Load: concurrent streams long enough to span several scrapes (a sanitized build is
        # many times slower: fewer tokens span as many).
        done = []
        tokens = 40 if h.SANITIZED else 200

        def one(i):
            stream = ctx.client().completions.create(model=MODEL, prompt=f"{LONG_TEXT} {i}", max_tokens=tokens,
                                                     temperature=0, stream=True)
            done.append(sum(1 for _ in stream))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(h.slack(120))
        check(len(done) == 6, f"{len(done)} of 6 load streams finished")
        time.sleep(3)  # two scrapes more
        after = sum(query('tireless_requests_total{outcome="completed"}'))
        check(after >= before + 6, f"completed requests went from {before} to {after} in Prometheus")
        running = query("max_over_time(tireless_num_requests_running[2m])")
        check(running and running[0] >= 2, f"Prometheus never saw 2 requests running at once: {running}")
        kv = query("max_over_time(tireless_kv_cache_usage_perc[2m])")
        check(kv and 0 < kv[0] <= 1, f"KV usage as Prometheus saw it: {kv}")
        tokens = query("increase(tireless_generation_tokens_total[2m])")
        check(tokens and sum(tokens) > 0, f"generated tokens did not increase: {tokens}")
        p99 = query('histogram_quantile(0.99, sum by (le) (rate(tireless_time_to_first_token_seconds_bucket[2m])))')
        check(p99 and p99[0] > 0, f"TTFT p99 from the histogram: {p99}")
        ctx.notes.append(f"Prometheus: completed {before:.0f} -> {after:.0f}, max running {running[0]:.0f}, "
                         f"max KV {kv[0]:.3f}, TTFT p99 {p99[0] * 1000:.0f} ms")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# ---------------------------------------------------------------------------------------------
# The Python client package (clients/python)


def test_python_client_speaks_both_transports_alike(ctx):
    http = tc.Client(ctx.url, api_key=PREMIUM)
    rpc = tc.Client(f"capnp://{ctx.server.host}:{ctx.server.port}", api_key=PREMIUM)
    msgs = [{"role": "user", "content": "Name three primary colors."}]
    a = http.chat(msgs, max_tokens=20, temperature=0)
    b = rpc.chat(msgs, max_tokens=20, temperature=0)
    check(a.ok and b.ok, f"http {a.kind}, rpc {b.kind}")
    check(a.text == b.text and a.text, f"greedy texts differ: http {a.text!r}, rpc {b.text!r}")
    check(a.completion_tokens == b.completion_tokens, f"{a.completion_tokens} vs {b.completion_tokens} tokens")
    for client in (http, rpc):
        pieces = []
        r = client.complete(LONG_TEXT, on_text=pieces.append, max_tokens=12, temperature=0)
        check(r.ok and "".join(pieces) == r.text and len(pieces) >= 2, f"streamed {pieces!r} vs {r.text!r}")
        check(r.finish_reason == "length", f"finish_reason {r.finish_reason}")
    try:
        tc.Client(ctx.url, api_key="sk-nobody").chat(msgs, max_tokens=4)
        raise h.TestFailure("an unknown key was not refused")
    except tc.Refused as e:
        check(e.result.reason == "unauthenticated" and not e.result.retryable, f"{e.result}")


def test_python_client_fails_over_and_its_breaker_skips_a_dead_endpoint(ctx):
    dead = f"http://127.0.0.1:{free_port()}"
    client = tc.Client([dead, ctx.url], api_key=PREMIUM, breaker_threshold=2, breaker_cooldown_s=60,
                       policy=tc.RetryPolicy(base_s=0.2))
    for _ in range(5):
        r = client.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
        check(r.ok and r.endpoint == ctx.url, f"served by {r.endpoint}: {r.kind}")
        time.sleep(0.25)  # past the backoff: the dead endpoint is the first choice again, until its breaker opens
    check(client.breakers[dead].state == "open", f"the dead endpoint's breaker is {client.breakers[dead].state}")
    check(client.attempts[dead] == 2, f"{client.attempts[dead]} tries went to the dead endpoint; its breaker "
                                      "should have stopped them after 2")
    # All endpoints dead: Unavailable or DeadlineExceeded, quickly, never a hang.
    lonely = tc.Client([dead], api_key=PREMIUM, policy=tc.RetryPolicy(max_retries=2, base_s=0.05, deadline_s=5))
    t0 = time.monotonic()
    try:
        lonely.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
        raise h.TestFailure("a dead endpoint answered")
    except (tc.Refused, tc.DeadlineExceeded, tc.Unavailable):
        pass
    check(time.monotonic() - t0 < 6, "giving up on a dead endpoint took longer than the deadline")


def test_python_client_total_deadline_bounds_retries(ctx):
    started = threading.Event()
    holder = threading.Thread(target=hold_solo_slot, args=(ctx, started, 200))
    holder.start()
    try:
        check(started.wait(h.slack(30)), "the slot holder never started")
        client = tc.Client(ctx.url, api_key=SOLO, policy=tc.RetryPolicy(max_retries=100, deadline_s=0.5))
        t0 = time.monotonic()
        try:
            client.chat([{"role": "user", "content": "Hi"}], max_tokens=4)
            ctx.notes.append("the slot was free again within 0.5 s")
        except (tc.DeadlineExceeded, tc.Refused) as e:
            # The last answer a server gave is the quota refusal; a try cut by the deadline itself
            # (a loaded machine) is a DeadlineExceeded that carries that answer, not "unreachable".
            check(e.result is not None and e.result.reason == "quota_exceeded", f"{e}")
            if "during try" in str(e):
                ctx.notes.append(f"a try was cut by the deadline: {e}")
        check(time.monotonic() - t0 <= 0.5 + h.slack(2), "the deadline was not kept")
        check(all(e.waited_as_told for e in client.retry_log if e.told_ms >= 0), "a retry came back early")
    finally:
        holder.join(h.slack(120))


def test_long_document_is_split_when_refused_as_too_long(ctx):
    if h.SANITIZED:
        ctx.notes.append("skipped under sanitizers (~15k tokens of prefill)")
        return
    paragraphs = [f"Paragraph {i}. The lighthouse keeper counted {i} ships passing the northern cape that "
                  f"evening, and wrote each name in the log with care." * 12 for i in range(1, 40)]
    document = "\n\n".join(paragraphs)
    # Each part is a long prefill on the CPU; beside another test on two cores one took past the
    # client's default 120-s deadline (a read timed out): the deadline is this test's, not a bar.
    client = tc.Client(ctx.url, api_key=PREMIUM, policy=tc.RetryPolicy(deadline_s=h.slack(400)))
    partial = []
    result = tc.process_long_document(client, document, on_partial=lambda i, text: partial.append(i),
                                      max_tokens=24, temperature=0)
    check(result.parts and len(result.parts) >= 2, f"the document was not split ({len(result.parts)} parts)")
    check(partial == list(range(len(result.parts))), f"partial results came as {partial}")
    check("".join(result.parts).replace("\n", "").replace(" ", "") ==
          document.replace("\n", "").replace(" ", ""), "the parts lose or add text")
    check(result.text.strip(), "no combined answer")
    ctx.notes.append(f"{len(document)} chars refused as too long; {len(result.parts)} parts, then one combining request")


FLOOD_TENANT = """
[[tenants]]
name = "flood"
keys = ["sk-flood-test"]
tier = "free"
"""


def test_python_client_retries_are_honest_on_a_shedding_tier(ctx):
    """Free requests flood a server whose premium tier is busy: the free tier sheds with a
    retry_after. Of the client's retries that waited what the server said, >= 90% are admitted."""
    if h.SANITIZED:
        ctx.notes.append("skipped under sanitizers (the shipped latency targets need full speed)")
        return
    # At most 8 sequences at once: 30 free clients then queue, and the free tier sheds.
    server = h.Server(ctx.args.server, ctx.args.config, ctx.workdir, name="shedding", http=True, tier_scale=None,
                      overrides={("engine", "max_step_seqs"): 8},
                      edit=lambda t: t.replace("[[tenants]]", FLOOD_TENANT.lstrip() + "\n[[tenants]]", 1))
    url = server.base_url
    stop = time.monotonic() + 45
    log, outcomes, lock = [], {"ok": 0, "refused": 0, "deadline": 0}, threading.Lock()

    def premium_load():
        c = tc.Client(url, api_key=PREMIUM, policy=tc.RetryPolicy(deadline_s=60))
        while time.monotonic() < stop:
            try:
                c.complete(LONG_TEXT, max_tokens=120, temperature=0)
            except tc.TirelessError:
                pass

    def free_client(i):
        c = tc.Client(url, api_key="sk-flood-test", policy=tc.RetryPolicy(max_retries=8, deadline_s=60))
        while time.monotonic() < stop:
            try:
                c.chat([{"role": "user", "content": f"Write a long story about ship number {i}."}], max_tokens=200)
                key = "ok"
            except tc.DeadlineExceeded:
                key = "deadline"
            except tc.TirelessError:
                key = "refused"
            with lock:
                outcomes[key] += 1
        with lock:
            log.extend(c.retry_log)

    threads = [threading.Thread(target=premium_load) for _ in range(3)]
    threads += [threading.Thread(target=free_client, args=(i,)) for i in range(30)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        server.stop()
    told = [e for e in log if e.waited_as_told]
    admitted = sum(1 for e in told if e.admitted)
    share = admitted / len(told) if told else 0.0
    ctx.notes.append(f"free flood: {outcomes}; {len(log)} retries, {len(told)} waited retry_after, "
                     f"{admitted} of those admitted ({share:.0%})")
    again = [e for e in told if not e.admitted]
    late = sum(1 for e in again if e.message.startswith("admitted, but"))
    ctx.notes.append(f"refused again: {late} by the engine's start bound after admission, {len(again) - late} at admission")
    for e in again[:3]:
        ctx.notes.append(f"refused again after waiting {e.waited_s:.2f} s (told {e.told_ms} ms, "
                         f"{'with' if e.had_token else 'without'} a token): {e.message}")
    check(len(told) >= 10, f"only {len(told)} retries waited a retry_after: the tier did not shed")
    check(share >= 0.9, f"{share:.0%} of the retries that waited retry_after were admitted (bar: 90%)")


def test_a_flood_on_a_cold_server_is_refused_at_arrival_not_after_waiting(ctx):
    """A fresh server (nothing has finished yet) gets more free requests at once than its batch
    has seats: those it cannot start within the free tier's target are refused at arrival with a
    retry hint; few are admitted only to be refused at the start bound after waiting for it."""
    if h.SANITIZED:
        ctx.notes.append("skipped under sanitizers (the shipped latency targets need full speed)")
        return
    seats, clients = 8, 40
    server = h.Server(ctx.args.server, ctx.args.config, ctx.workdir, name="cold", http=True, tier_scale=None,
                      overrides={("engine", "max_step_seqs"): seats},
                      edit=lambda t: t.replace("[[tenants]]", FLOOD_TENANT.lstrip() + "\n[[tenants]]", 1))
    results, lock, go = [], threading.Lock(), threading.Barrier(clients)

    def client(i):
        go.wait()
        start = time.monotonic()
        r = requests.post(server.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-flood-test"},
                          json={"messages": [{"role": "user", "content": f"Write a long story about ship number {i}."}],
                                "max_tokens": 200, "stream": True}, stream=True, timeout=h.slack(120))
        first = None
        if r.status_code == 200:
            for line in r.iter_lines():
                if line.startswith(b"data:") and b'"content"' in line and first is None:
                    first = time.monotonic() - start
            kind, message = "served", ""
        else:
            message = r.json()["error"]["message"]
            kind = "late" if message.startswith("admitted, but") else "refused"
        with lock:
            results.append((kind, time.monotonic() - start, first, message))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(h.slack(180))
    finally:
        server.stop()
    count = {k: sum(1 for r in results if r[0] == k) for k in ("served", "refused", "late")}
    firsts = sorted(r[2] for r in results if r[0] == "served" and r[2] is not None)
    late_waits = sorted(r[1] for r in results if r[0] == "late")
    ctx.notes.append(f"{clients} free requests at once on a cold server with {seats} seats: {count}; first token "
                     f"p50 {firsts[len(firsts) // 2] if firsts else 0:.1f} s, max {firsts[-1] if firsts else 0:.1f} s; "
                     f"refused after waiting {', '.join(f'{w:.1f}' for w in late_waits) or 'none'} s")
    check(len(results) == clients, f"{clients - len(results)} requests had no outcome")
    check(count["served"] >= seats, f"only {count['served']} served: the batch's seats were not used")
    check(count["refused"] > 0, "nothing refused at arrival: the flood did not exceed what the tier promises")
    check(count["late"] <= 2, f"{count['late']} requests were admitted and then refused after waiting "
                              f"({', '.join(f'{w:.1f}' for w in late_waits)} s): refusal at arrival is the normal path")


TESTS = [
    test_models_health_ready,
    test_chat_completion,
    test_completions_greedy_and_seeded,
    test_stream_equals_whole,
    test_penalties_and_min_p_reach_the_sampler,
    test_logprobs_as_the_openai_package_reads_them,
    test_streams_of_multibyte_text_and_held_back_stop_strings_end_as_the_whole_answer,
    test_async_client,
    test_errors_are_the_openai_exceptions,
    test_bad_input_battery,
    test_curl,
    test_429_retry_after,
    test_backoff_loop_of_the_articles,
    test_client_going_away_cancels,
    test_connections_over_the_limit_get_503_and_room_comes_back,
    test_keep_alive_follows_server_http_keep_alive_ms,
    test_slow_reader_pauses_its_stream,
    test_python_client_speaks_both_transports_alike,
    test_python_client_fails_over_and_its_breaker_skips_a_dead_endpoint,
    test_python_client_total_deadline_bounds_retries,
    test_long_document_is_split_when_refused_as_too_long,
    test_python_client_retries_are_honest_on_a_shedding_tier,
    test_a_flood_on_a_cold_server_is_refused_at_arrival_not_after_waiting,
    test_metrics_speak_prometheus_and_the_inference_gateway_protocol,
    test_a_real_prometheus_sees_the_values_move_under_load,
    test_ready_turns_503_on_sigterm_and_streams_end,
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("-k", action="append", default=[])
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if skip := h.missing_model(args.config):
        print(skip)
        return 77
    workdir = tempfile.mkdtemp(prefix="tireless-http-e2e-")
    ctx = Context(args, workdir)
    passed = failed = 0
    try:
        # -k, or TIRELESS_HTTP_E2E_ONLY (comma-separated): only the tests whose names contain one.
        only = args.k or [k for k in os.environ.get("TIRELESS_HTTP_E2E_ONLY", "").split(",") if k]
        for fn in [t for t in TESTS if not only or any(k in t.__name__ for k in only)]:
            ctx.notes = []
            t0 = time.monotonic()
            error = None
            try:
                ctx.ensure_server()
                fn(ctx)
            except h.TestFailure as e:
                error = str(e)
            except Exception:  # noqa: BLE001
                error = traceback.format_exc()
            if ctx.server is not None and error:
                error += f"\n--- server stderr (last lines) ---\n{ctx.server.stderr_text(30)}"
            seconds = time.monotonic() - t0
            if error:
                failed += 1
                print(f"FAIL  {fn.__name__} ({seconds:.1f} s)\n" + "\n".join("      " + x for x in error.splitlines()),
                      flush=True)
            else:
                passed += 1
                print(f"ok    {fn.__name__} ({seconds:.1f} s)", flush=True)
            for n in ctx.notes:
                print(f"      note: {n}", flush=True)
    finally:
        if ctx.server is not None and ctx.server.alive():
            ctx.server.stop(timeout=h.SHUTDOWN_GRACE_MS / 1000 + 5)
        if args.keep or failed:
            print(f"configs and server logs: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
