class TirelessError(Exception):
    """A request that did not complete; .result is its last attempt's outcome (or None)."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


class Refused(TirelessError):
    """Refused for good: not retryable (invalid, unauthenticated, prompt_too_long, a quota that
    will never fit), or still refused after the last retry."""


class DeadlineExceeded(TirelessError):
    """The next retry could not start (or end) before the total deadline."""


class Unavailable(TirelessError):
    """No endpoint could be reached within the deadline."""
