"""One client over either transport, with honest retries, a total deadline and failover."""
import asyncio
import random
import time
from dataclasses import dataclass
from typing import Callable, List, Optional
from urllib.parse import urlparse

import requests

from .errors import DeadlineExceeded, Refused, Unavailable
from .http import HttpTransport
from .result import Result
from .retry import CircuitBreaker, RetryPolicy


@dataclass
class RetryLogEntry:
    """One retry: what the server told (ms, -1: nothing), how long the client waited, and what
    the retry got."""
    told_ms: int
    waited_s: float
    endpoint: str
    kind: str
    reason: str
    message: str = ""
    had_token: bool = False  # the refusal it followed gave a retry token, and it was sent back

    @property
    def waited_as_told(self):
        return self.told_ms >= 0 and self.waited_s * 1000 >= self.told_ms

    @property
    def admitted(self):
        return not (self.kind == "rejected" and self.reason in ("overloaded", "quota_exceeded"))


def _transport(endpoint):
    u = urlparse(endpoint)
    if u.scheme in ("http", "https"):
        return HttpTransport(endpoint)
    if u.scheme == "capnp":
        from .rpc import RpcTransport
        return RpcTransport(u.hostname, u.port or 7433)
    raise ValueError(f"endpoint {endpoint!r}: use http://host:port or capnp://host:port")


class Client:
    """endpoints: the first is preferred; the others take over when it refuses, fails or is
    unreachable. api_key: the tenant's key. attempt_timeout_s: one attempt's limit (the total
    deadline caps it too)."""

    def __init__(self, endpoints, api_key, policy: Optional[RetryPolicy] = None, breaker_threshold=3,
                 breaker_cooldown_s=10.0, attempt_timeout_s=None, rng=None, sleep=time.sleep, clock=time.monotonic):
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not endpoints:
            raise ValueError("give at least one endpoint")
        self.endpoints = list(endpoints)
        self.api_key = api_key
        self.policy = policy or RetryPolicy()
        self.transports = {e: _transport(e) for e in self.endpoints}
        self.breakers = {e: CircuitBreaker(breaker_threshold, breaker_cooldown_s, clock) for e in self.endpoints}
        self.attempt_timeout_s = attempt_timeout_s
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.clock = clock
        self.retry_log: List[RetryLogEntry] = []
        self.attempts = {e: 0 for e in self.endpoints}  # requests sent to each endpoint
        # Until when (clock) each endpoint asked us to stay away (its last retry_after).
        self._refused_until = {e: 0.0 for e in self.endpoints}

    def chat(self, messages, on_text: Optional[Callable[[str], None]] = None, **params) -> Result:
        return self.generate(dict(params, messages=messages), on_text)

    def complete(self, prompt, on_text: Optional[Callable[[str], None]] = None, **params) -> Result:
        return self.generate(dict(params, prompt=prompt), on_text)

    def _pick(self, now):
        """The first endpoint whose breaker allows a request and that did not ask us to wait;
        else the usable one free soonest, with how long until then."""
        usable = [e for e in self.endpoints if self.breakers[e].allows()]
        for e in usable:
            if self._refused_until[e] <= now:
                return e, 0.0
        if usable:
            e = min(usable, key=lambda x: self._refused_until[x])
            return e, self._refused_until[e] - now
        e = min(self.endpoints, key=lambda x: self.breakers[x].reopens_in_s())
        return e, self.breakers[e].reopens_in_s()

    def generate(self, request, on_text=None) -> Result:
        """One request (messages or prompt, and OpenAI's parameters), retried as the policy says.
        Returns the completed Result; raises Refused, DeadlineExceeded or Unavailable."""
        start = self.clock()
        deadline = start + self.policy.deadline_s
        attempt, last, told_ms, waited = 0, None, None, 0.0
        token, token_endpoint = "", None  # the last refusal's reservation, for the retry to that endpoint
        streamed = []

        def forward(piece):
            streamed.append(piece)
            if on_text is not None:
                on_text(piece)

        while True:
            now = self.clock()
            endpoint, wait = self._pick(now)
            if wait > 0:
                if now + wait >= deadline:
                    raise DeadlineExceeded(f"the next try could start in {wait:.1f} s, past the deadline", last)
                self.sleep(wait)
                waited += wait
                now = self.clock()
            timeout = max(0.001, deadline - now)
            if self.attempt_timeout_s:
                timeout = min(timeout, self.attempt_timeout_s)
            self.attempts[endpoint] += 1
            try:
                result = self.transports[endpoint].generate(
                    self.api_key, request, forward if on_text else None, timeout,
                    retry_token=token if endpoint == token_endpoint else "")
            except (requests.exceptions.RequestException, OSError, TimeoutError, asyncio.TimeoutError,
                    ConnectionError) as e:
                result = Result(kind="failed", reason="unreachable", message=str(e), endpoint=endpoint)
            except Exception as e:  # the RPC transport's disconnects (kj exceptions)
                if type(e).__name__ not in ("KjException",):
                    raise
                result = Result(kind="failed", reason="unreachable", message=str(e), endpoint=endpoint)
            if attempt > 0:
                self.retry_log.append(RetryLogEntry(told_ms if told_ms is not None else -1, waited, endpoint,
                                                    result.kind, result.reason, result.message,
                                                    bool(token) and endpoint == token_endpoint))
            if result.reason == "unreachable" and self.clock() >= deadline:
                # The try was cut by the total deadline, not refused by an endpoint: say so, with
                # the last answer a server gave (its reason and retry hint) where there was one.
                raise DeadlineExceeded(f"the deadline passed during try {attempt + 1} ({result.message})",
                                       last if last is not None else result)
            last = result
            if result.ok:
                self.breakers[endpoint].success()
                return result
            if result.kind == "failed" or result.reason in ("shutting_down", "shutdown"):
                self.breakers[endpoint].failure()
            if not result.retryable:
                raise Refused(f"{result.kind} ({result.reason}): {result.message}", result)
            if streamed:  # text already went to the caller: a retry would repeat it
                raise Refused(f"{result.kind} ({result.reason}) after {len(streamed)} streamed pieces", result)
            if attempt >= self.policy.max_retries:
                raise Refused(f"still {result.reason} after {attempt} retries: {result.message}", result)
            attempt += 1
            told_ms = result.retry_after_ms
            token, token_endpoint = result.retry_token, endpoint
            wait = self.policy.wait_s(result.retry_after_ms, attempt - 1, self.rng)
            self._refused_until[endpoint] = self.clock() + wait
            nxt, nxt_wait = self._pick(self.clock())
            if nxt != endpoint and nxt_wait == 0:  # another channel is free now: go there at once
                waited = 0.0
                continue
            if self.clock() + wait >= deadline:
                raise DeadlineExceeded(f"{result.reason}: retrying after {wait:.1f} s would pass the deadline", result)
            self.sleep(wait)
            waited = wait
