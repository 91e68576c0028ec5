"""Serving: where a request's prompt is prepared before it is queued: rendered, tokenized and bounded.

Builds on: model/chat_template.py (templates rendered in bounded worker processes), model/tokenizer.py.
Read with: chapters/08-online-serving.md, serve/server.py (the routes that call this).

A prompt costs time before the engine sees it: a chat template may run until its 5 s bound, and a
long text takes a while to tokenize. None of it runs on the event loop (every client shares it) or
on the engine thread (every running request shares it), and a slow template must not delay a
prompt that needs no template. The functions here take the server's state (its tokenizer,
max_model_len and chat template) and run in the threads of PromptPools.
vLLM: vllm/renderers/base.py (BaseRenderer: one pool of renderer_num_workers threads, 1 by default,
tokenizes prompts and, in vllm/renderers/hf.py, renders chat templates alike, without a time bound).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from pagedlab.model.chat_template import RENDER_WORKERS
from pagedlab.serve import protocol as api
from pagedlab.serve.protocol import BadRequest

TOKENIZE_THREADS = 4  # threads tokenizing plain prompts (each text bounded in characters; encoding frees the GIL)
MAX_WAITING_RENDERS = 8  # chat requests waiting for a render beyond the RENDER_WORKERS rendering; more: 429


class PromptPools:
    """Where prompts are prepared before they are queued, off the event loop and the engine thread, in two pools
    of threads, so that chat templates running to their time bound delay other renders only, never a prompt that
    needs none (eight such renders once held every thread of asyncio's one pool, and a plain completion that takes
    0.04 s alone waited about 14 s):

        /v1/completions       --> tokenize: TOKENIZE_THREADS threads; a text is bounded in characters first
        /v1/chat/completions  --> render:   RENDER_WORKERS threads, one template worker process each
                                            (model/chat_template.py), which then tokenize what it rendered;
                                            at most max_waiting_renders more wait, and beyond them a 429

    Invariant: `renders` (rendering or waiting) <= RENDER_WORKERS + max_waiting_renders; it counts the render
    pool's unfinished jobs, so a handler that gives up waiting frees no place its job still holds."""

    def __init__(self, max_waiting_renders: int = MAX_WAITING_RENDERS):
        self.tokenize = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="pagedlab-tokenize")
        self.render = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="pagedlab-render")
        self.max_renders = RENDER_WORKERS + max_waiting_renders
        self.renders = 0
        self.lock = threading.Lock()  # guards `renders`: done callbacks run in the pool's threads

    async def tokenized(self, fn, *args):
        return await asyncio.wrap_future(self.tokenize.submit(fn, *args))

    async def rendered(self, fn, *args):
        """fn(*args) in a render thread, or a 429 at once if max_renders are rendering or waiting already."""
        with self.lock:
            if self.renders >= self.max_renders:
                raise BadRequest(
                    f"{self.renders} chat requests are rendering their chat template or waiting to, this server's "
                    f"limit ({RENDER_WORKERS} at a time, {self.max_renders - RENDER_WORKERS} waiting); try again later",
                    status=429,
                )
            self.renders += 1
        job = self.render.submit(fn, *args)
        job.add_done_callback(self._finished)
        return await asyncio.wrap_future(job)

    def _finished(self, _job: Future) -> None:
        with self.lock:
            self.renders -= 1

    def close(self) -> None:
        for pool in (self.tokenize, self.render):
            pool.shutdown(wait=False, cancel_futures=True)


def tokenized(state, prompt) -> dict | list[int]:
    """A text prompt as {"prompt", "prompt_token_ids"}, its length checked before anything is queued (a text
    that cannot fit is refused by its length in characters first, as vLLM does, without tokenizing it)."""
    if isinstance(prompt, list):
        if len(prompt) >= state.max_model_len:
            raise api.too_long(len(prompt), state.max_model_len)
        return prompt
    if state.tokenizer is None:
        return prompt  # the engine refuses text for a model without a tokenizer, with its own message
    _check_characters(state, prompt, "prompt", "your prompt contains")
    ids = state.tokenizer.encode(prompt)
    if len(ids) >= state.max_model_len:
        raise api.too_long(len(ids), state.max_model_len)
    return {"prompt": prompt, "prompt_token_ids": ids}


def _check_characters(state, text: str, param: str, words: str) -> None:
    """A text longer than (max_model_len - 1) x the longest token's characters cannot fit: refused untokenized."""
    bound = (state.max_model_len - 1) * state.tokenizer.max_chars_per_token
    if len(text) > bound:
        raise BadRequest(
            f"{param}: This model's maximum context length is {state.max_model_len} tokens. However, {words} "
            f"{len(text)} characters (more than {bound} characters, which is the upper bound for "
            f"{state.max_model_len - 1} input tokens). Please reduce the length of the input prompt.",
            param,
        )


def chat_prompt(state, messages: list[dict]) -> list[int]:
    if state.tokenizer is None:
        raise BadRequest("messages: this model has no tokenizer, so it has no chat template", "messages")
    try:
        text = state.tokenizer.apply_chat_template(
            messages, chat_template=state.chat_template, tokenize=False, add_generation_prompt=True
        )
    except ValueError as e:  # "chat_template: ..." whatever the template did
        raise BadRequest.of(e) from None
    _check_characters(state, text, "messages", "the chat template rendered your messages into")  # up to 4 Mi chars
    ids = state.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) >= state.max_model_len:
        raise api.too_long(len(ids), state.max_model_len)
    return ids
