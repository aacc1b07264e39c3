"""A client for tireless-serve, over its OpenAI-style HTTP API or Cap'n Proto RPC.

    from tireless_client import Client
    client = Client(["http://127.0.0.1:8000", "http://backup:8000"], api_key="sk-premium-demo",
                    deadline_s=60)
    result = client.chat([{"role": "user", "content": "Name three primary colors."}], max_tokens=64)
    print(result.text, result.degradations)

Retries are honest: after a refusal that says when to come back (429 + retry-after-ms, or an
RPC rejection's retryAfterMs), the client never retries sooner; otherwise it backs off
exponentially with full jitter, capped. No retry starts that would end past the total deadline.
With several endpoints, one that keeps failing is skipped for a while (a circuit breaker) and
a refused request goes to another endpoint first (the articles' "two channels").
process_long_document() handles a prompt_too_long refusal: it splits the text at paragraph
boundaries within the limit the refusal names, processes the parts, then sends one summarising
request, streaming partial results as they come.
"""
from .client import Client, RetryLogEntry
from .documents import LongDocumentResult, process_long_document, split_paragraphs
from .errors import DeadlineExceeded, Refused, TirelessError, Unavailable
from .result import Result
from .retry import CircuitBreaker, RetryPolicy

__all__ = ["Client", "RetryLogEntry", "Result", "RetryPolicy", "CircuitBreaker", "TirelessError", "Refused",
           "DeadlineExceeded", "Unavailable", "process_long_document", "split_paragraphs", "LongDocumentResult"]
