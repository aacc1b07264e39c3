"""The Cap'n Proto RPC transport (pycapnp): one attempt, its Result. Each call opens its own
connection on its own event loop, so the client stays synchronous."""
import asyncio
import os

from .result import Result

_SCHEMA = None


def _schema():
    global _SCHEMA
    if _SCHEMA is None:
        import capnp
        here = os.path.dirname(os.path.abspath(__file__))
        # From the source tree, the tree's own schemas (one file loaded twice under two paths
        # would clash in pycapnp's loader); installed, the copies in the package.
        folders = [os.path.normpath(os.path.join(here, "..", "..", "..", "protocol")), os.path.join(here, "schema")]
        folder = next(f for f in folders if os.path.exists(os.path.join(f, "tireless.capnp")))
        _SCHEMA = capnp.load(os.path.join(folder, "tireless.capnp"),
                             imports=[folder] + [os.path.dirname(p) for p in capnp.__path__])
    return _SCHEMA


def _result_of(outcome, text, endpoint):
    which = outcome.which()
    detail = getattr(outcome, which)
    reason = str(detail.reason) if hasattr(detail, "reason") else "error"
    reason = {"stopToken": "stop_token", "stopString": "stop_string", "maxTokens": "max_tokens",
              "contextFull": "context_full", "quotaExceeded": "quota_exceeded", "promptTooLong": "prompt_too_long",
              "shuttingDown": "shutting_down"}.get(reason, reason)
    r = Result(kind=which, reason=reason, text=text, endpoint=endpoint,
               degradations=[str(d) for d in outcome.degradations],
               prompt_tokens=outcome.usage.promptTokens, completion_tokens=outcome.usage.completionTokens,
               time_to_first_token_ms=outcome.timings.timeToFirstTokenMs)
    if which == "rejected":
        r.message, r.retry_after_ms = detail.message, detail.retryAfterMs
        r.retry_token = str(detail.retryToken) if detail.retryToken else ""
    elif which == "failed":
        r.message = detail.message
    if which == "completed":
        r.finish_reason = "length" if reason in ("max_tokens", "context_full") else "stop"
    return r


class RpcTransport:
    def __init__(self, host, port):
        self.host, self.port = host, port
        self.endpoint = f"capnp://{host}:{port}"

    def generate(self, api_key, request, on_text=None, timeout_s=None, retry_token=""):
        import capnp
        return asyncio.run(capnp.run(asyncio.wait_for(self._generate(api_key, request, on_text, retry_token),
                                                      timeout_s)))

    async def _generate(self, api_key, request, on_text, retry_token):
        import capnp
        schema = _schema()

        class Sink(schema.TokenSink.Server):
            def __init__(self):
                self.pieces = []
                self.outcome = asyncio.get_running_loop().create_future()

            async def tokens(self, chunk, **kwargs):
                self.pieces.append(chunk.text)
                if on_text is not None and chunk.text:
                    on_text(chunk.text)

            async def sync(self, **kwargs):
                pass

            async def done(self, outcome, **kwargs):
                if not self.outcome.done():
                    self.outcome.set_result(outcome.as_builder())

        connection = await capnp.AsyncIoStream.create_connection(host=self.host, port=self.port)
        client = capnp.TwoPartyClient(connection)
        inference = client.bootstrap().cast_as(schema.Inference)
        r = schema.GenerateRequest.new_message()
        r.apiKey = api_key
        if retry_token:
            r.retryToken = int(retry_token)
        if "messages" in request:
            msgs = r.input.init("messages", len(request["messages"]))
            for i, m in enumerate(request["messages"]):
                msgs[i].role = m["role"]
                msgs[i].content = m["content"]
        else:
            r.input.text = request["prompt"]
        if request.get("max_tokens"):
            r.maxTokens = int(request["max_tokens"])
        s = r.init("sampling")
        s.temperature = float(request.get("temperature", 1.0))
        for key, field in (("top_p", "topP"), ("top_k", "topK"), ("min_p", "minP"), ("seed", "seed"),
                           ("presence_penalty", "presencePenalty"), ("frequency_penalty", "frequencyPenalty"),
                           ("repetition_penalty", "repetitionPenalty")):
            if request.get(key) is not None:
                setattr(s, field, request[key])
        stop = request.get("stop")
        if stop:
            stops = [stop] if isinstance(stop, str) else list(stop)
            lst = r.init("stop", len(stops))
            for i, x in enumerate(stops):
                lst[i] = x
        sink = Sink()
        result = await inference.generate(r, sink)
        generation = result.generation  # dropping it would cancel the request
        outcome = await sink.outcome
        del generation
        return _result_of(outcome, "".join(sink.pieces), self.endpoint)
