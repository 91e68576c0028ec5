"""Serving: OpenAI's request and response shapes, checked at the door (chapters/08-online-serving.md).

Builds on: sampling_params.py (check_text).
Read with: chapters/08-online-serving.md, serve/server.py (the routes that use this).

Everything a request's body can hold is checked here, before the engine sees
it: the body's size, its JSON, each field's type and range. A bad field is a
`BadRequest` (HTTP 400 with OpenAI's error JSON, `param` naming the field), so
nothing a client sends can make an engine step raise. The responses are built
here too, with vLLM's fields: one chunk per choice when streaming, logprobs in
the completions API's columns or the chat API's list.
vLLM: vllm/entrypoints/openai/completion/protocol.py, vllm/entrypoints/openai/chat_completion/protocol.py.
"""

from __future__ import annotations

import json
import re

from pagedlab.sampling_params import SamplingParams, check_text

# Request fields passed to SamplingParams as they are (OpenAI's names, plus vLLM's extras).
SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos")
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions
DEFAULT_MAX_BODY_BYTES = 1 << 20  # `pagedlab serve --max-body-bytes`: a prompt of any model's context fits
# Fields OpenAI or vLLM define that this server does not implement, with the value that means "off". Any other
# value is a 400: silently ignoring a penalty or a bias would return other tokens than the client asked for.
UNSERVED = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "logit_bias": None,
            "best_of": None, "echo": False, "suffix": None, "min_tokens": 0, "response_format": None,
            "tools": None, "tool_choice": None, "structured_outputs": None}  # fmt: skip


class BadRequest(ValueError):
    """A client's mistake: HTTP 400 (or `status`), OpenAI's error JSON, naming the field when one is at fault."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status

    @classmethod
    def of(cls, error: ValueError) -> BadRequest:
        """A ValueError from the library ("prompt: ...", "SamplingParams.top_p must ..."), as a 400."""
        return cls(str(error), param_of(str(error)))


def param_of(message: str) -> str | None:
    """The field a ValueError names ("SamplingParams.top_p must ...", "prompt: ..."), as OpenAI's `param`."""
    match = re.match(r"(?:SamplingParams\.)?([a-z_]+)(?=[ :.\[])", message)
    return match.group(1) if match else None


async def read_json(request, limit: int) -> dict:
    """The body as a JSON object, read no further than `limit` bytes (HTTP 413 past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the request body has {declared} bytes, more than this server's limit of {limit}", status=413)
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise BadRequest(f"the request body exceeds this server's limit of {limit} bytes", status=413)
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as e:  # RecursionError: brackets nested thousands deep
        raise BadRequest(f"the request body is not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise BadRequest("the request body must be a JSON object")
    return parsed


def _text(value: str, name: str) -> str:
    try:
        return check_text(value, name)
    except ValueError as e:
        raise BadRequest.of(e) from None


def completion_prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list, as the openai client may send it
    if isinstance(prompt, str) and prompt:
        return _text(prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise BadRequest("prompt: expected a non-empty string or a list of token ids (one prompt per request)", "prompt")


def chat_messages(body: dict) -> list[dict]:
    """OpenAI's messages, any role, text content (a string, or a list of {"type": "text", "text"} parts)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of {'role', 'content'}", "messages")
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise BadRequest(f"messages[{i}]: expected {{'role': str, 'content': str}}", "messages")
        checked.append({"role": _text(m["role"], f"messages[{i}]"), "content": _content(m.get("content"), i)})
    return checked


def _content(content, i: int) -> str:
    if isinstance(content, list):  # content parts: only text ones are served
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            raise BadRequest(f"messages[{i}]: only text content parts are served", "messages")
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}]: content must be a string or a list of text parts", "messages")
    return _text(content, f"messages[{i}]")


def sampling_params(body: dict, chat: bool) -> SamplingParams:
    """OpenAI's request fields as SamplingParams; a wrong one is a BadRequest naming it."""
    for name, off in UNSERVED.items():
        if body.get(name, off) not in (off, None) and not (name == "best_of" and body[name] == body.get("n", 1)):
            raise BadRequest(f"{name}: not supported by pagedlab's server (only {off!r} is accepted)", name)
    kwargs = {name: body[name] for name in SAMPLING_FIELDS if body.get(name) is not None}
    limit = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
    kwargs["max_tokens"] = (None if chat else DEFAULT_MAX_TOKENS) if limit is None else limit
    kwargs["logprobs"] = chat_logprobs(body) if chat else completion_logprobs(body)
    if isinstance(kwargs.get("stop"), (str, list)):
        for s in [kwargs["stop"]] if isinstance(kwargs["stop"], str) else kwargs["stop"]:
            if isinstance(s, str):
                _text(s, "stop")
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e), param_of(str(e))) from None


def completion_logprobs(body: dict) -> int | None:
    """/v1/completions: `logprobs` is how many top tokens per position (0: only the sampled one)."""
    value = body.get("logprobs")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"logprobs: expected an integer >= 0, got {value!r}", "logprobs")
    return value


def chat_logprobs(body: dict) -> int | None:
    """/v1/chat/completions: `logprobs: true` asks for them, `top_logprobs` for how many alternatives."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise BadRequest(f"logprobs: expected true or false, got {wanted!r}", "logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise BadRequest(f"top_logprobs: expected an integer >= 0, got {top!r}", "top_logprobs")
    if top is not None and not wanted:
        raise BadRequest("top_logprobs: when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    return (top or 0) if wanted else None


def stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage), as vLLM checks them."""
    stream, options = body.get("stream", False), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest(f"stream: expected true or false, got {stream!r}", "stream")
    if options is None:
        return bool(stream), False
    if not isinstance(options, dict):
        raise BadRequest(f"stream_options: expected an object, got {options!r:.80}", "stream_options")
    if not stream:
        raise BadRequest("stream_options: Stream options can only be defined when `stream=True`.", "stream_options")
    include = options.get("include_usage", False)
    if include is not None and not isinstance(include, bool):
        raise BadRequest(f"stream_options: include_usage must be true or false, got {include!r}", "stream_options")
    return True, bool(include)


def priority_and_salt(body: dict) -> tuple[int, str | None]:
    priority, salt = body.get("priority", 0), body.get("cache_salt")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise BadRequest(f"priority: expected an integer, got {priority!r}", "priority")
    if salt is not None and not isinstance(salt, str):
        raise BadRequest(f"cache_salt: expected a string, got {salt!r:.80}", "cache_salt")
    return priority, None if salt is None else _text(salt, "cache_salt")


def too_long(num_tokens: int, max_model_len: int) -> BadRequest:
    """vLLM's words for a prompt that leaves no room for output."""
    return BadRequest(
        f"prompt: This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
        f"{num_tokens} input tokens, which leaves no room for any output token. "
        "Please reduce the length of the input prompt.",
        "prompt",
    )


# -- responses -------------------------------------------------------------------------------------------


def usage(out) -> dict:
    completion = sum(len(c.token_ids) for c in out.outputs)
    prompt = len(out.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def full_choice(c, chat: bool, logprobs) -> dict:
    """One choice of a whole (non-streamed) response."""
    body = {"message": {"role": "assistant", "content": c.text}} if chat else {"text": c.text}
    return {"index": c.index, **body, "logprobs": logprobs, "finish_reason": c.finish_reason}


def delta_choice(index: int, chat: bool, text: str, logprobs, finish_reason: str | None) -> dict:
    """One choice of a streamed chunk: the text since the last chunk of this choice."""
    body = {"delta": {"content": text}} if chat else {"text": text}
    return {"index": index, **body, "logprobs": logprobs, "finish_reason": finish_reason}


def logprobs_of(c, tokenizer, span: tuple[int, int], top_n: int | None, chat: bool, offset: int = 0):
    """The logprobs of output tokens span = [start, end) of choice `c`, in the chat or the completions format
    (None if none were asked for: top_n None). `offset`: characters of the choice's text before `start`."""
    if top_n is None or c.logprobs is None:
        return None
    ids, tops = c.token_ids[span[0] : span[1]], c.logprobs[span[0] : span[1]]
    pieces = [_token_text(tokenizer, t) for t in ids]
    if chat:
        return {"content": [_chat_entry(p, t, top, top_n, tokenizer) for p, t, top in zip(pieces, ids, tops)]}
    offsets, at = [], offset
    for p in pieces:
        offsets.append(at)
        at += len(p)
    tops_text = [{_token_text(tokenizer, i): lp for i, lp in top.items()} for top in tops]
    return {"text_offset": offsets, "token_logprobs": [top[t] for t, top in zip(ids, tops)], "tokens": pieces,
            "top_logprobs": tops_text}  # fmt: skip


def _chat_entry(piece: str, token: int, top: dict[int, float], top_n: int, tokenizer) -> dict:
    """The sampled token's entry, with the `top_n` most likely tokens as its alternatives (the engine's dict
    holds those plus the sampled token, which may lie outside them)."""
    ranked = sorted(top.items(), key=lambda kv: -kv[1])[:top_n]
    return _entry(piece, top[token]) | {"top_logprobs": [_entry(_token_text(tokenizer, i), lp) for i, lp in ranked]}


def _entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}


def _token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token]) if tokenizer is not None else str(token)
