"""The OpenAI-style HTTP transport (requests): one attempt, its Result."""
import json

import requests

from .result import Result

# An HTTP error's code back to the outcome's reason (server/openai_api.cpp, error_of).
_REASON_OF_CODE = {"invalid_api_key": "unauthenticated", "context_length_exceeded": "prompt_too_long",
                   "model_not_found": "invalid"}


def _error_result(r, endpoint):
    try:
        err = r.json().get("error", {})
    except ValueError:
        err = {"message": r.text[:500]}
    code = err.get("code") or ""
    reason = _REASON_OF_CODE.get(code, code)
    retry_ms = err.get("retry_after_ms")
    if retry_ms is None and r.headers.get("retry-after-ms"):
        retry_ms = int(float(r.headers["retry-after-ms"]))
    if retry_ms is None and r.headers.get("Retry-After", "").isdigit():
        retry_ms = int(r.headers["Retry-After"]) * 1000
    status = r.status_code
    if status == 500:
        kind, reason = "failed", reason or "error"
    elif status == 504:
        kind, reason = "cancelled", "deadline"
    elif status == 503 and reason == "shutdown":
        kind = "cancelled"
    else:
        kind = "rejected"
        if not reason:
            reason = {401: "unauthenticated", 413: "prompt_too_long", 429: "overloaded", 503: "shutting_down"}.get(
                status, "invalid")
    return Result(kind=kind, reason=reason, message=err.get("message", ""),
                  retry_after_ms=-1 if retry_ms is None else int(retry_ms),
                  retry_token=err.get("retry_token") or r.headers.get("x-tireless-retry-token", ""),
                  endpoint=endpoint, status=status)


def _completed(body, text, endpoint):
    usage = body.get("usage") or {}
    extra = body.get("tireless") or {}
    choice = (body.get("choices") or [{}])[0]
    return Result(kind="completed", reason=extra.get("reason", ""), text=text,
                  finish_reason=choice.get("finish_reason") or "", degradations=body.get("degradations") or [],
                  prompt_tokens=usage.get("prompt_tokens", 0), completion_tokens=usage.get("completion_tokens", 0),
                  time_to_first_token_ms=extra.get("time_to_first_token_ms", -1), endpoint=endpoint, status=200)


class HttpTransport:
    def __init__(self, base_url):
        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()

    def generate(self, api_key, request, on_text=None, timeout_s=None, retry_token=""):
        """request: messages or prompt, and OpenAI's parameters. on_text: streams when given.
        retry_token: an earlier refusal's, sent back with its retry."""
        chat = "messages" in request
        body = dict(request)
        if retry_token:
            body["retry_token"] = retry_token
        body["stream"] = on_text is not None
        if on_text is not None:
            body["stream_options"] = {"include_usage": True}
        url = f"{self.base_url}/v1/{'chat/completions' if chat else 'completions'}"
        r = self.session.post(url, json=body, headers={"Authorization": f"Bearer {api_key}"},
                              stream=on_text is not None, timeout=timeout_s)
        if r.status_code != 200:
            return _error_result(r, self.base_url)
        if on_text is None:
            data = r.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            return _completed(data, text or "", self.base_url)
        pieces, final, usage = [], None, None
        r.encoding = "utf-8"  # SSE is UTF-8 whatever the header says (requests would guess Latin-1)
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:  # the request ended otherwise after its first token
                err = event["error"]
                kind = "cancelled" if err.get("type") == "timeout" else "failed"
                return Result(kind=kind, reason="deadline" if kind == "cancelled" else "error",
                              message=err.get("message", ""), text="".join(pieces), endpoint=self.base_url,
                              status=200)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    pieces.append(piece)
                    on_text(piece)
                if choice.get("finish_reason"):
                    final = event
        if final is None:
            return Result(kind="failed", reason="error", message="the stream ended without its last chunk",
                          text="".join(pieces), endpoint=self.base_url, status=200)
        final = dict(final)
        final["usage"] = usage
        return _completed(final, "".join(pieces), self.base_url)
