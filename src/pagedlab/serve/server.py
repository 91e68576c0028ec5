"""Serving: `pagedlab serve`, an OpenAI-compatible HTTP server around one engine loop.

Builds on: engine/async_engine.py (the engine thread), serve/protocol.py (requests checked, responses
built), serve/prompts.py (prompts rendered and tokenized), serve/metrics.py (/metrics, /metrics/explain).
Read with: chapters/08-online-serving.md.

    GET  /health                   200 while the engine loop runs
    GET  /v1/models                the one model served
    POST /v1/completions           OpenAI's completions; "stream": true -> server-sent events
    POST /v1/chat/completions      messages rendered by the model's chat template, then the same
    GET  /metrics                  Prometheus text with vLLM's metric names
    GET  /metrics/explain          in words: why the prefix-cache hit rate is what it is

A request's body (at most --max-body-bytes) and fields are checked before it is
queued, and its prompt is rendered and tokenized in a worker thread, never on the
event loop or the engine thread (serve/prompts.py: chat templates render in threads
of their own, so a slow template never delays a prompt that needs none); a bad one
gets HTTP 400 with OpenAI's error JSON ({"error": {"message", "type", "param",
"code"}}) and the requests already running never notice. A client that goes away,
streaming or not, has its request aborted, and its blocks freed, in the engine's
next loop.
vLLM: vllm/entrypoints/openai/api_server.py and its serving_*.py files.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import urllib.request
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from pagedlab.engine.async_engine import AsyncEngine
from pagedlab.model.chat_template import load_chat_template
from pagedlab.serve import protocol as api
from pagedlab.serve.metrics import MetricsExporter, explain_hit_rate, parse_metrics
from pagedlab.serve.prompts import PromptPools, chat_prompt, tokenized
from pagedlab.serve.protocol import BadRequest


@dataclass
class ServerState:
    engine: AsyncEngine
    model_name: str
    tokenizer: object
    max_model_len: int
    chat_template: str | None
    metrics: MetricsExporter
    started: float
    max_body_bytes: int = api.DEFAULT_MAX_BODY_BYTES  # a longer request body is refused (413) unread
    pools: PromptPools = field(default_factory=PromptPools)  # where prompts are rendered and tokenized
    ids: itertools.count = field(default_factory=itertools.count)


def create_app(state: ServerState):
    """The ASGI app (Starlette, via FastAPI) for one engine and one model name."""
    app = FastAPI(title="pagedlab", docs_url=None, redoc_url=None)

    @app.exception_handler(BadRequest)
    async def bad_request(_request, exc: BadRequest):
        kinds = {404: "NotFoundError", 413: "RequestTooLargeError", 429: "RateLimitError"}
        kind = kinds.get(exc.status, "BadRequestError")
        body = {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.status}}
        return JSONResponse(body, status_code=exc.status)

    @app.get("/health")
    async def health():  # 503 once the engine loop has stopped (a step raised, or shutting down)
        engine = state.engine
        return Response(status_code=503 if engine.error is not None or engine._stopping else 200)

    @app.get("/v1/models")
    async def models():
        card = {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "pagedlab"}
        return {"object": "list", "data": [dict(card, root=state.model_name, max_model_len=state.max_model_len)]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/metrics/explain")
    async def explain():
        return PlainTextResponse(explain_hit_rate(state.engine, state.metrics) + "\n")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await api.read_json(request, state.max_body_bytes)
        prompt = api.completion_prompt(body)
        prompt = await state.pools.tokenized(tokenized, state, prompt)  # never on the engine thread, never here
        return await _serve(state, request, body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await api.read_json(request, state.max_body_bytes)
        messages = api.chat_messages(body)
        prompt = await state.pools.rendered(chat_prompt, state, messages)  # the template runs bounded, off the loop
        return await _serve(state, request, body, prompt, chat=True)

    return app


async def _serve(state: ServerState, request: Request, body: dict, prompt, chat: bool):
    model = body.get("model")
    if model is not None and model != state.model_name:
        served = state.model_name
        raise BadRequest(f"model: The model `{model}` does not exist (this server serves `{served}`).", "model")
    stream, include_usage = api.stream_options(body)
    params = api.sampling_params(body, chat)
    priority, salt = api.priority_and_salt(body)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(state.ids)}-{uuid.uuid4().hex[:6]}"  # short: the live view
    outputs = state.engine.generate(request_id, prompt, params, priority=priority, cache_salt=salt)
    try:  # the ValueError of a bad request comes here, before any byte is sent
        first = await _unless_disconnected(request, outputs.__anext__())
    except ValueError as e:
        raise BadRequest.of(e) from None
    if first is None:
        return Response(status_code=499)  # the client left while its request waited: aborted
    created = int(time.time())
    reply = _Reply(state, request_id, created, chat, params.logprobs)
    if stream:
        return StreamingResponse(reply.events(first, outputs, include_usage), media_type="text/event-stream")
    last = await _unless_disconnected(request, _last(first, outputs))
    if last is None:
        return Response(status_code=499)  # as vLLM's with_cancellation: the work stops, nobody reads the answer
    return JSONResponse(reply.whole(last))


async def _last(first, outputs):
    last = first
    async for out in outputs:
        last = out
    return last


async def _unless_disconnected(request: Request, work):
    """`work`'s result, or None if the client disconnects first (then `work` is cancelled, which aborts the
    request and frees its blocks). vLLM: with_cancellation, listening for http.disconnect the same way."""
    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Reply:
    """One request's response: whole, or as server-sent events with one chunk per choice (as vLLM)."""

    def __init__(self, state: ServerState, request_id: str, created: int, chat: bool, top_n: int | None):
        self.state, self.request_id, self.created, self.chat, self.top_n = state, request_id, created, chat, top_n

    def whole(self, out) -> dict:
        tok = self.state.tokenizer
        choices = [api.full_choice(c, self.chat, api.logprobs_of(c, tok, (0, len(c.token_ids)), self.top_n, self.chat))
                   for c in out.outputs]  # fmt: skip
        return self._body("chat.completion" if self.chat else "text_completion", choices) | {"usage": api.usage(out)}

    def _body(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.state.model_name,
                "choices": choices}  # fmt: skip

    def _chunk(self, choices: list[dict], include_usage: bool, usage: dict | None = None) -> str:
        body = self._body("chat.completion.chunk" if self.chat else "text_completion", choices)
        if include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    async def events(self, first, outputs, include_usage: bool):
        """The role chunk (chat), then for each choice a chunk whenever its text grows and one with its finish
        reason, never repeated; the usage chunk; [DONE]. If the client goes away, Starlette stops this
        generator, and closing `outputs` aborts the request."""
        sent = {c.index: [0, 0, False] for c in first.outputs}  # choice -> [characters, tokens, finished] sent
        try:
            if self.chat:
                for c in first.outputs:
                    role = {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}  # fmt: skip
                    yield self._chunk([role], include_usage)
            out = first
            while True:
                for c in out.outputs:
                    piece = self._delta(c, sent[c.index])
                    if piece is not None:
                        yield self._chunk([piece], include_usage)
                if out.finished:
                    break
                out = await outputs.__anext__()
            if include_usage:
                yield self._chunk([], True, api.usage(out))
            yield "data: [DONE]\n\n"
        finally:
            await outputs.aclose()

    def _delta(self, c, sent: list) -> dict | None:
        """Choice `c`'s chunk since `sent` ([characters, tokens, finished]), or None when there is nothing new."""
        chars, tokens, finished = sent
        delta = c.text[chars:]
        if finished or not (delta or c.finish_reason is not None):
            return None
        span = (tokens, len(c.token_ids))
        logprobs = api.logprobs_of(c, self.state.tokenizer, span, self.top_n, self.chat, chars)
        sent[:] = [len(c.text), len(c.token_ids), c.finish_reason is not None]
        return api.delta_choice(c.index, self.chat, delta, logprobs, c.finish_reason)


# -- the command -----------------------------------------------------------------------------------


def build_state(
    model: str, engine_args: dict, chat_template: str | None = None, live=None, llm=None,
    max_body_bytes: int = api.DEFAULT_MAX_BODY_BYTES,
) -> ServerState:  # fmt: skip
    """A server's state for `model` (a name or folder); `llm`: an LLM already built for it (a bench's)."""
    from pathlib import Path

    from pagedlab import LLM

    chat_template = load_chat_template(chat_template)  # before the model loads: a wrong path fails at once
    llm = llm or LLM(model, **engine_args)
    engine = AsyncEngine(llm.engine, on_step=live)
    name = Path(model).name if Path(model).exists() else model
    metrics = MetricsExporter(engine, name)
    return ServerState(engine, name, llm.get_tokenizer(), llm.engine.config.max_model_len, chat_template, metrics,
                       time.time(), max_body_bytes)  # fmt: skip


class ThreadedServer:
    """The app under uvicorn in a daemon thread on a free port of 127.0.0.1: for notebooks, benches and tests
    (the command runs it in the main thread instead, with its signal handlers)."""

    def __init__(self, state: ServerState, start_timeout: float = 60.0):
        import socket
        import threading

        import uvicorn

        self.state = state
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(create_app(state), host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout
        while not self.server.started:  # bounded: it binds in well under a second
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the server did not start within {start_timeout:g} s")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    @classmethod
    def for_model(cls, model: str = "tiny-shakespeare", chat_template: str | None = None, **engine_args):
        """The server of `model` (a name or folder) with these engine settings, started (the notebook's)."""
        return cls(build_state(model, engine_args, chat_template=chat_template))

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return response.read().decode()

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name: counters, gauges, histogram _sum and _count (buckets left out)."""
        return parse_metrics(self.get("/metrics"))

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.state.engine.shutdown()
        self.state.pools.close()


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> int:
    """Run until SIGINT or SIGTERM, then finish: stop taking requests, abort the running ones, stop the engine
    loop, and return the signal's number (0 if none) for the caller to report; the process exits normally."""
    import contextlib
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # uvicorn re-raises the signal after shutdown; we finish cleanly instead
            handlers = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level, lifespan="off")
    server = Server(config)
    try:
        asyncio.run(server.serve())
    finally:
        state.engine.shutdown()
        state.pools.close()
    return server._captured_signals[-1] if server._captured_signals else 0
