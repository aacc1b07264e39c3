"""When to retry, and which endpoints to avoid for a while."""
import random
import time
from dataclasses import dataclass


@dataclass
class RetryPolicy:
    max_retries: int = 6
    base_s: float = 0.5        # the first backoff's cap
    cap_s: float = 30.0        # no backoff is longer
    deadline_s: float = 120.0  # the total time a call may take, retries included

    def backoff_s(self, attempt, rng=random):
        """Full jitter: uniform in [0, min(cap, base * 2^attempt)]. For refusals without a hint."""
        return rng.uniform(0, min(self.cap_s, self.base_s * (2 ** attempt)))

    def wait_s(self, retry_after_ms, attempt, rng=random):
        """The wait before retry number `attempt`: never less than the server's retry_after (a
        little jitter above it spreads clients refused together); backoff when it gave none."""
        if retry_after_ms is not None and retry_after_ms >= 0:
            told = retry_after_ms / 1000.0
            return told + rng.uniform(0, min(0.1 * told, 1.0))
        return self.backoff_s(attempt, rng)


class CircuitBreaker:
    """Opens after `threshold` consecutive failures (unreachable, 5xx, shutting down); while open
    the endpoint is skipped; after `cooldown_s` one trial request may go (half open): success
    closes it, failure opens it again."""

    def __init__(self, threshold=3, cooldown_s=10.0, clock=time.monotonic):
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.failures = 0
        self.opened_at = None

    @property
    def state(self):
        if self.opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self.opened_at >= self.cooldown_s else "open"

    def allows(self):
        return self.state != "open"

    def success(self):
        self.failures = 0
        self.opened_at = None

    def failure(self):
        self.failures += 1
        if self.state == "half_open" or self.failures >= self.threshold:
            self.opened_at = self.clock()

    def reopens_in_s(self):
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.cooldown_s - (self.clock() - self.opened_at))
