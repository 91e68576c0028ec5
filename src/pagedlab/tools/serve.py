"""`pagedlab serve`: an OpenAI-compatible HTTP server around one engine loop (chapters/08-online-serving.md).

Builds on: engine/async_engine.py (the engine thread), tools/serve_metrics.py (/metrics, --explain-metrics).
Read with: chapters/08-online-serving.md.

    GET  /health                   200 while the engine loop runs
    GET  /v1/models                the one model served
    POST /v1/completions           OpenAI's completions; "stream": true -> server-sent events
    POST /v1/chat/completions      messages rendered by the model's chat template, then the same
    GET  /metrics                  Prometheus text with vLLM's metric names
    GET  /metrics/explain          in words: why the prefix-cache hit rate is what it is

A request's fields are checked before it is queued; a bad one gets HTTP 400 with
OpenAI's error JSON ({"error": {"message", "type", "param", "code"}}) and the
requests already running never notice. A client that closes its stream has its
request aborted, and its blocks freed, in the engine's next loop.
vLLM: vllm/entrypoints/openai/api_server.py and its serving_*.py files.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from pagedlab.engine.async_engine import AsyncEngine
from pagedlab.sampling_params import SamplingParams
from pagedlab.tools.serve_metrics import MetricsExporter, explain_hit_rate


class BadRequest(ValueError):
    """A client's mistake: HTTP 400 (or `status`), OpenAI's error JSON, naming the field when one is at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


# Request fields passed to SamplingParams as they are (OpenAI's names, plus vLLM's extras).
SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos")
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


@dataclass
class ServerState:
    engine: AsyncEngine
    model_name: str
    tokenizer: object
    max_model_len: int
    chat_template: str | None
    metrics: MetricsExporter
    started: float
    ids: itertools.count = field(default_factory=itertools.count)


def create_app(state: ServerState):
    """The ASGI app (Starlette, via FastAPI) for one engine and one model name."""
    app = FastAPI(title="pagedlab", docs_url=None, redoc_url=None)

    @app.exception_handler(BadRequest)
    async def bad_request(_request, exc: BadRequest):
        kind = "NotFoundError" if exc.status == 404 else "BadRequestError"
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
        body = await _json(request)
        prompt = _completion_prompt(body)
        return await _serve(state, body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _json(request)
        prompt = _chat_prompt(state, body)
        return await _serve(state, body, prompt, chat=True)

    return app


async def _json(request) -> dict:
    try:
        body = json.loads(await request.body())
    except ValueError as e:
        raise BadRequest(f"the request body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _completion_prompt(body: dict):
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list, as the openai client may send it
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise BadRequest("prompt: expected a non-empty string or a list of token ids (one prompt per request)", "prompt")


def _chat_prompt(state: ServerState, body: dict) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of {'role', 'content'}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRequest(f"messages[{i}]: expected {{'role': str, 'content': str}}", "messages")
    if state.tokenizer is None:
        raise BadRequest("messages: this model has no tokenizer, so it has no chat template", "messages")
    try:
        text = state.tokenizer.apply_chat_template(
            messages, chat_template=state.chat_template, tokenize=False, add_generation_prompt=True
        )
    except ValueError as e:
        raise BadRequest(f"messages: {e}", "messages") from None
    return state.tokenizer.encode(text, add_special_tokens=False)


def sampling_params(body: dict, chat: bool) -> SamplingParams:
    """OpenAI's request fields as SamplingParams; a wrong one is a BadRequest naming it."""
    kwargs = {name: body[name] for name in SAMPLING_FIELDS if body.get(name) is not None}
    limit = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
    kwargs["max_tokens"] = (None if chat else DEFAULT_MAX_TOKENS) if limit is None else limit
    if body.get("logprobs"):
        raise BadRequest("logprobs: not served by pagedlab's server (LLM.generate returns them)", "logprobs")
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e), param_of(str(e))) from None


def param_of(message: str) -> str | None:
    """The field a ValueError names ("SamplingParams.top_p must ...", "prompt: ..."), as OpenAI's `param`."""
    match = re.match(r"(?:SamplingParams\.)?([a-z_]+)(?=[ :.])", message)
    return match.group(1) if match else None


async def _serve(state: ServerState, body: dict, prompt, chat: bool):
    model = body.get("model")
    if model is not None and model != state.model_name:
        served = state.model_name
        raise BadRequest(f"model: The model `{model}` does not exist (this server serves `{served}`).", "model")
    params = sampling_params(body, chat)
    priority, salt = body.get("priority", 0), body.get("cache_salt")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise BadRequest(f"priority: expected an integer, got {priority!r}", "priority")
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(state.ids)}-{uuid.uuid4().hex[:6]}"  # short: the live view
    outputs = state.engine.generate(request_id, prompt, params, priority=priority, cache_salt=salt)
    try:
        first = await outputs.__anext__()  # the ValueError of a bad request comes here, before any byte is sent
    except ValueError as e:
        raise BadRequest(str(e), param_of(str(e))) from None
    created = int(time.time())
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = _stream_events(state, request_id, created, first, outputs, chat, include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    last = first
    async for out in outputs:
        last = out
    return JSONResponse(_full_response(state, request_id, created, last, chat))


def _usage(out) -> dict:
    completion = sum(len(c.token_ids) for c in out.outputs)
    prompt = len(out.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _full_response(state, request_id, created, out, chat: bool) -> dict:
    if chat:
        choices = [
            {"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": None,
             "finish_reason": c.finish_reason}
            for c in out.outputs
        ]  # fmt: skip
        kind = "chat.completion"
    else:
        choices = [{"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
                   for c in out.outputs]  # fmt: skip
        kind = "text_completion"
    return {"id": request_id, "object": kind, "created": created, "model": state.model_name, "choices": choices,
            "usage": _usage(out)}  # fmt: skip


async def _stream_events(state, request_id, created, first, outputs, chat: bool, include_usage: bool):
    """Server-sent events: one chunk per new text of each choice, the finish reasons, usage, [DONE].
    If the client goes away, Starlette stops this generator; closing `outputs` aborts the request."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    sent: dict[int, int] = {}  # choice index -> characters sent
    last = first

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        body = {"id": request_id, "object": kind, "created": created, "model": state.model_name, "choices": choices}
        if include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    try:
        if chat:
            yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for c in first.outputs])  # fmt: skip
        out = first
        while True:
            choices = []
            for c in out.outputs:
                delta = c.text[sent.get(c.index, 0) :]
                if delta or c.finish_reason is not None:
                    sent[c.index] = len(c.text)
                    piece = {"delta": {"content": delta}} if chat else {"text": delta}
                    choices.append({"index": c.index, **piece, "logprobs": None, "finish_reason": c.finish_reason})
            if choices:
                yield chunk(choices)
            last = out
            if out.finished:
                break
            out = await outputs.__anext__()
        if include_usage:
            yield chunk([], _usage(last))
        yield "data: [DONE]\n\n"
    finally:
        await outputs.aclose()


# -- the command -----------------------------------------------------------------------------------


def build_state(model: str, engine_args: dict, chat_template: str | None = None, live=None, llm=None) -> ServerState:
    """A server's state for `model` (a name or folder); `llm`: an LLM already built for it (a bench's)."""
    from pathlib import Path

    from pagedlab import LLM

    llm = llm or LLM(model, **engine_args)
    if chat_template is not None and Path(chat_template).is_file():
        chat_template = Path(chat_template).read_text()
    engine = AsyncEngine(llm.engine, on_step=live)
    name = Path(model).name if Path(model).exists() else model
    metrics = MetricsExporter(engine, name)
    return ServerState(engine, name, llm.get_tokenizer(), llm.engine.config.max_model_len, chat_template, metrics,
                       time.time())  # fmt: skip


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

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.state.engine.shutdown()


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
    return server._captured_signals[-1] if server._captured_signals else 0


class LiveView:
    """`pagedlab serve --live`: the demo's frame (queues, pool, requests, what changed), redrawn from the
    server's own engine after its steps, at most `fps` times a second."""

    def __init__(self, console=None, fps: float = 4.0):
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.min_interval, self.last = 1.0 / fps, 0.0

    def __call__(self, engine: AsyncEngine) -> None:  # the engine thread, after each step
        now = time.monotonic()
        if now - self.last < self.min_interval:
            return
        self.last = now
        self.live.update(self.frame(engine), refresh=True)

    def frame(self, engine: AsyncEngine):
        from rich.console import Group
        from rich.text import Text

        from pagedlab.engine.events import step_events
        from pagedlab.tools.demo_view import changes, pool_line, queue_line, request_table

        trace, config = list(engine.engine.trace), engine.engine.config
        if not trace:
            return Text("waiting for the first request")
        with engine.lock:
            prompts, texts, stats = dict(engine.prompts), dict(engine.texts), engine.stats
            done = sum(stats.finished.values())
        t = trace[-1]
        header = Text(f"step {t.step} · serving at stage {config.stage} ({config.stage_name}) · {done} finished")
        header.stylize("bold")
        body = [header, queue_line(t, config), pool_line(t, config), request_table(t, prompts, texts)]
        return Group(*body, changes(step_events(trace, len(trace) - 1, config)))

    def __enter__(self):
        self.live.start()
        return self

    def __exit__(self, *exc):
        self.live.stop()


def explain_from(url: str) -> str:
    """`pagedlab serve --explain-metrics`: ask a running server why its hit rate is what it is."""
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/metrics/explain", timeout=10) as response:
        return response.read().decode()
