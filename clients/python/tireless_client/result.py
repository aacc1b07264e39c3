"""One attempt's outcome, the same whatever the transport."""
from dataclasses import dataclass, field
from typing import List, Optional

# Refusals worth retrying (after retry_after): load and quotas; and a server shutting down
# (another replica, or this one restarted). Never: invalid, unauthenticated, prompt_too_long.
RETRYABLE_REJECTIONS = {"overloaded", "quota_exceeded", "shutting_down"}


@dataclass
class Result:
    kind: str                     # completed, rejected, cancelled, failed
    reason: str = ""              # stop_token, max_tokens, ... | overloaded, quota_exceeded, ...
    message: str = ""
    retry_after_ms: int = -1      # rejected: wait at least this long before retrying; -1: don't
    retry_token: str = ""         # rejected for load: sent back with the retry, it holds a reservation
    text: str = ""
    finish_reason: str = ""       # completed: "stop" or "length"
    degradations: List[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    time_to_first_token_ms: float = -1
    endpoint: str = ""
    status: Optional[int] = None  # HTTP status, when over HTTP

    @property
    def ok(self):
        return self.kind == "completed"

    @property
    def retryable(self):
        if self.kind == "rejected":
            return self.reason in RETRYABLE_REJECTIONS and (self.retry_after_ms >= 0 or self.reason == "shutting_down")
        return self.kind == "failed" or (self.kind == "cancelled" and self.reason == "shutdown")
