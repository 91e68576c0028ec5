"""Serving: one engine loop in its own thread, fed by many asyncio clients (chapters/08-online-serving.md).

Builds on: engine/engine.py (LLMEngine: add_request, step, abort_request).
Read with: chapters/08-online-serving.md, serve/server.py (the HTTP server around it).

Offline, `LLM.generate` queues every request and steps until all are done.
Online, requests arrive while others run, so the loop never ends; it steps
while anything is pending and sleeps otherwise:

    HTTP handlers (asyncio)                 engine thread (the only one touching LLMEngine)
    generate(): put ("add", ...) ------->   drain commands: add_request / abort_request
                await its queue              if work: step(), then each RequestOutput goes to its
    <------------- call_soon_threadsafe      request's asyncio.Queue; else wait for a command
    client gone: put ("abort", id) ----->   abort_request(id): its blocks are freed at once

A bad request fails inside the engine thread's add_request, before anything is
queued, and the error comes back to its handler alone: the running requests
never see it. vLLM: vllm/v1/engine/async_llm.py (AsyncLLM.generate, abort), with
the engine core in another process instead of a thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from pagedlab.outputs import RequestOutput


@dataclass
class ServingStats:
    """What /metrics reports, updated by the engine thread after every step and read by the server."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_cache_queries: int = 0  # prompt tokens looked up (vLLM counts the same)
    prefix_cache_hits: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0  # of requests that produced a first token
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests


class _Stream:
    """One request's outputs, handed from the engine thread to its handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, arrival: float):
        self.loop, self.queue = loop, asyncio.Queue()
        self.arrival, self.last_token_time, self.tokens = arrival, None, 0

    def put(self, item) -> bool:
        """Hand `item` to the handler's loop; False if that loop is gone (its client with it)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop was closed
            return False
        return True


class AsyncEngine:
    """Runs `engine` (an LLMEngine) in a background thread; `generate` streams one request's outputs.

    Invariant: only the engine thread calls the LLMEngine; every other thread talks to it through commands.
    """

    def __init__(self, engine, on_step: Callable[[AsyncEngine], None] | None = None):
        self.engine = engine
        self.on_step = on_step  # called in the engine thread after each step (the --live view)
        self.observe: Callable[[str, float], None] = lambda name, seconds: None  # "ttft" | "itl" | "e2e" latencies
        self.stats = ServingStats()
        self.lock = threading.Lock()  # guards `stats` and `texts` for readers in other threads
        self.texts: dict[str, str] = {}  # request id -> text so far (the live view)
        self.prompts: dict[str, str] = {}
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._stopping = False
        self.error: Exception | None = None  # set if a step ever raised: the loop has stopped
        self._recent_prompts: deque[list[int]] = deque(maxlen=64)  # for longest_shared_prefix
        self.longest_shared_prefix = 0  # tokens: the longest prompt prefix two requests shared (explain-metrics)
        self._thread = threading.Thread(target=self._run, name="pagedlab-engine", daemon=True)
        self._thread.start()

    # -- the handlers' side (any thread with an event loop) ------------------------------------------

    async def generate(
        self, request_id: str, prompt, params, priority: int = 0, cache_salt: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its RequestOutputs, the last one finished; a bad request raises
        ValueError before anything is yielded. Closing the iterator early (a client gone) aborts it."""
        if self.error is not None or self._stopping:
            raise RuntimeError(f"the engine loop is not running ({self.error!r})")
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, time.monotonic())
        accepted = loop.create_future()
        self._submit(("add", request_id, prompt, params, priority, cache_salt, stream, accepted))
        finished = False
        try:
            await accepted  # raises the ValueError of add_request
            while True:
                out = await stream.queue.get()
                if isinstance(out, Exception):
                    raise RuntimeError(f"the engine loop stopped: {out!r}") from out
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            if not finished:  # closed early, or cancelled (even before its add was taken: commands keep order)
                self._submit(("abort", request_id, stream))

    def abort(self, request_id: str) -> None:
        self._submit(("abort", request_id, None))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop after the step in progress; requests still running are aborted."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _submit(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    # -- the engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            self._drain()
            if self.engine.has_unfinished_requests():
                try:
                    outputs = self.engine.step()
                except Exception as e:  # a bug, not a bad request: fail every stream, keep no broken state
                    self._fail_all(e)
                    return
                self._deliver(outputs, time.monotonic())
                if self.on_step is not None:
                    self.on_step(self)
            else:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
        for request_id in list(self._streams):
            self.engine.abort_request(request_id)
        if self.engine.has_unfinished_requests():
            self._deliver(self.engine.step(), time.monotonic())

    def _drain(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "abort":  # a stream's own abort never ends another request that has its id
                _, request_id, stream = command
                if request_id in self._streams and stream in (None, self._streams[request_id]):
                    self.engine.abort_request(request_id)
                continue
            _, request_id, prompt, params, priority, cache_salt, stream, accepted = command
            try:
                self.engine.add_request(request_id, prompt, params, priority=priority, cache_salt=cache_salt)
            except Exception as e:  # a bad request is its own handler's problem, never the loop's
                stream.loop.call_soon_threadsafe(_settle, accepted, e)
                continue
            self._streams[request_id] = stream
            with self.lock:
                self.prompts[request_id] = prompt if isinstance(prompt, str) else f"<{len(prompt)} tokens>"
            stream.loop.call_soon_threadsafe(_settle, accepted, None)

    def _deliver(self, outputs: list[RequestOutput], now: float) -> None:
        s, sched = self.stats, self.engine.scheduler
        with self.lock:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is None:
                    continue
                tokens = sum(len(c.token_ids) for c in out.outputs)
                if tokens > stream.tokens:
                    if stream.last_token_time is None:
                        self.observe("ttft", now - stream.arrival)
                        s.prompt_tokens += len(out.prompt_token_ids)
                        self._note_prompt(out.prompt_token_ids)
                    else:
                        self.observe("itl", now - stream.last_token_time)
                    s.generation_tokens += tokens - stream.tokens
                    stream.tokens, stream.last_token_time = tokens, now
                self.texts[out.request_id] = out.outputs[0].text if out.outputs else ""
                if out.finished:
                    reason = out.outputs[0].finish_reason if out.outputs else "abort"
                    s.finished[reason] = s.finished.get(reason, 0) + 1
                    self.observe("e2e", now - stream.arrival)
                    del self._streams[out.request_id]
                    self.texts.pop(out.request_id, None)
                    self.prompts.pop(out.request_id, None)
                if not stream.put(out) and not out.finished:
                    self.engine.abort_request(out.request_id)  # nobody is listening any more
            stats = self.engine.stats
            s.running, s.waiting = len(sched.running), len(sched.waiting)
            s.kv_usage = self.engine.kv_manager.usage
            s.prefix_cache_queries, s.prefix_cache_hits = stats.prefix_cache_queries, stats.prefix_cache_hits
            s.preemptions = stats.num_preemptions

    def _fail_all(self, error: Exception) -> None:
        self.error = error
        for stream in self._streams.values():
            stream.put(error)
        self._streams.clear()

    def _note_prompt(self, tokens: list[int]) -> None:
        for other in self._recent_prompts:
            n = 0
            for a, b in zip(tokens, other):
                if a != b:
                    break
                n += 1
            self.longest_shared_prefix = max(self.longest_shared_prefix, n)
        self._recent_prompts.append(list(tokens))


def _settle(future: asyncio.Future, error: Exception | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
