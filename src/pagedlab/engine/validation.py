"""Stage 1: checks on a request, and on the sizes asked for, before anything enters the engine.

Builds on: config.py, sampling_params.py, model/tokenizer.py.
Read with: chapters/01-contiguous-static.md.

Every check runs before any engine state changes, so a bad request is
refused whole and the requests already running never notice it. Each problem
is a ValueError whose message starts with the field at fault. What a
`SamplingParams` can check alone it checks when it is built; what needs the
model or the engine's settings (the vocabulary, `max_logprobs`,
`max_num_seqs`) is checked here, at `add_request`, as vLLM's input processor does.

Sizes are checked the same way (with model/memory.py): a pool, a swap pool or
a model that cannot fit in memory is refused with the bytes it would take,
instead of minutes of work and then an allocator's crash.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pagedlab.config import DTYPES, EngineConfig, kv_bytes_per_token
from pagedlab.kv.block_pool import cdiv
from pagedlab.model.memory import check_memory
from pagedlab.request import Request, max_output_tokens
from pagedlab.sampling_params import BeamSearchParams, SamplingParams, check_text
from pagedlab.sched.beam import BeamGroup, is_beam_id
from pagedlab.sched.policies import POLICIES
from pagedlab.stages import introduced_by

if TYPE_CHECKING:  # the tokenizers library: only where a model has a tokenizer
    from pagedlab.model.tokenizer import Tokenizer


def check_request_id(request_id) -> None:
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id: expected a non-empty string, got {request_id!r}")


def check_prompt(prompt, tokenizer: Tokenizer | None, vocab_size: int, max_model_len: int):
    """Return (text or None, token ids) for a prompt, or raise ValueError.

    A prompt is a str, a list[int], or vLLM's dicts: {"prompt": str} (TextPrompt) or
    {"prompt_token_ids": list[int]} (TokensPrompt), which may carry its "prompt" text alongside (LLM.chat).
    """
    if isinstance(prompt, dict):
        unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
        if unknown:
            raise ValueError(f"prompt: unknown key {unknown[0]!r} (a prompt dict has 'prompt' or 'prompt_token_ids')")
        if "prompt_token_ids" not in prompt:
            if "prompt" not in prompt:
                raise ValueError("prompt: a prompt dict needs 'prompt' or 'prompt_token_ids'")
            return check_prompt(prompt["prompt"], tokenizer, vocab_size, max_model_len)
        text = prompt.get("prompt")
        if text is not None and not isinstance(text, str):
            raise ValueError(f"prompt: 'prompt' must be a string, got {type(text).__name__}")
        ids = prompt["prompt_token_ids"]
        if not isinstance(ids, (list, tuple)) or isinstance(ids, str):
            raise ValueError(f"prompt: 'prompt_token_ids' must be a list of ints, got {type(ids).__name__}")
        return text, check_prompt(list(ids), tokenizer, vocab_size, max_model_len)[1]
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: empty prompt")
        check_text(prompt, "prompt")
        if tokenizer is None:
            raise ValueError("prompt: this model folder has no tokenizer.json; pass token ids instead of text")
        text, ids = prompt, tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        text, ids = None, list(prompt)
    else:
        raise ValueError(f"prompt: expected str or list[int], got {type(prompt).__name__}")
    if not ids:
        raise ValueError("prompt: empty prompt")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary (0 .. {vocab_size - 1})")
    if len(ids) >= max_model_len:
        raise ValueError(
            f"prompt: This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{len(ids)} input tokens, which leaves no room for any output token (max_model_len)."
        )
    return text, ids


def check_sampling_params(params, config: EngineConfig, vocab_size: int, has_tokenizer: bool) -> SamplingParams:
    """The params (None: vLLM's defaults) checked against the model and the engine's limits."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params: expected SamplingParams, got {type(params).__name__}")
    if params.stop and not has_tokenizer:  # vLLM: stop strings need detokenized text
        raise ValueError("stop: stop strings need text, and this model folder has no tokenizer.json")
    if params.n > config.max_num_seqs:  # before n children are built
        raise ValueError(f"n: {params.n} children exceed max_num_seqs ({config.max_num_seqs})")
    if params.logprobs is not None:
        wanted = vocab_size if params.logprobs == -1 else params.logprobs
        limit = max_logprobs(config, vocab_size)
        if wanted > limit:
            raise ValueError(
                f"logprobs: requested sample logprobs of {wanted}, which is greater than max allowed: {limit} "
                f"(max_logprobs={config.max_logprobs}, a vocabulary of {vocab_size})"
            )
    bad = [t for t in params.stop_token_ids if t >= vocab_size]
    if bad:
        raise ValueError(f"stop_token_ids: token id {bad[0]} is outside the vocabulary (0 .. {vocab_size - 1})")
    return params


def check_beam_params(params, config: EngineConfig, vocab_size: int) -> BeamSearchParams:
    """Every step reads the top 2 * beam_width logprobs of each beam, so that many must be allowed."""
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"params: expected BeamSearchParams, got {type(params).__name__}")
    width = params.beam_width
    if width > config.max_num_seqs:
        raise ValueError(f"beam_width: {width} beams exceed max_num_seqs ({config.max_num_seqs})")
    limit = max_logprobs(config, vocab_size)
    if 2 * width > limit:
        raise ValueError(
            f"beam_width: {width} beams read the top {2 * width} logprobs of each beam, which is greater than "
            f"max allowed: {limit} (max_logprobs={config.max_logprobs}, a vocabulary of {vocab_size})"
        )
    return params


def max_logprobs(config: EngineConfig, vocab_size: int) -> int:
    """The most top logprobs one request may ask for: max_logprobs (-1: all), never more than the vocabulary."""
    return vocab_size if config.max_logprobs == -1 else min(config.max_logprobs, vocab_size)


def check_request_options(config: EngineConfig, priority, cache_salt, arrival_time) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority: expected an int, got {priority!r}")
    if priority != 0 and not POLICIES[config.scheduling_policy].uses_priority:
        raise ValueError(
            f"priority: {priority} needs a policy that orders by priority, scheduling_policy='priority' "
            f"({introduced_by('scheduling_policy')})"
        )
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise ValueError(f"cache_salt: expected a string, got {cache_salt!r}")
    if cache_salt is not None:
        check_text(cache_salt, "cache_salt")
    if cache_salt is not None and not config.enable_prefix_caching:
        raise ValueError(f"cache_salt: needs prefix caching ({introduced_by('enable_prefix_caching')}, enabled)")
    real = isinstance(arrival_time, (int, float)) and not isinstance(arrival_time, bool)
    if arrival_time is not None and not (real and math.isfinite(arrival_time)):
        raise ValueError(f"arrival_time: expected a finite number of seconds, got {arrival_time!r}")


# --- memory ------------------------------------------------------------------------------------------------------


class InputProcessor:
    """Request intake: check a request against everything and build its Request(s), changing nothing.

    vLLM: InputProcessor.process_inputs (vllm/v1/engine/input_processor.py; processor.py before v0.12)."""

    def __init__(self, config: EngineConfig, model_config, tokenizer: Tokenizer | None, scheduler, owner_of):
        self.config, self.model_config, self.tokenizer = config, model_config, tokenizer
        self.scheduler = scheduler  # asked whether a group could ever be admitted
        self.owner_of = owner_of  # request id -> the live request it belongs to, or None

    def process(self, request_id, prompt, params, arrival_time, priority, cache_salt, now: float):
        """The group's children, checked: request id, params, options, prompt, and whether it can ever fit."""
        check_request_id(request_id)
        vocab = self.model_config.vocab_size
        params = check_sampling_params(params, self.config, vocab, self.tokenizer is not None)
        self._check_free(request_id, [f"{i}_{request_id}" for i in range(params.n)] if params.n > 1 else [])
        check_request_options(self.config, priority, cache_salt, arrival_time)
        text, token_ids = check_prompt(prompt, self.tokenizer, vocab, self.config.max_model_len)
        max_tokens = max_output_tokens(len(token_ids), params.max_tokens, self.config.max_model_len)
        arrival = now if arrival_time is None else float(arrival_time)
        eos = self.model_config.eos_token_ids
        children = Request.new_group(
            request_id, token_ids, params, max_tokens, eos, arrival, priority, cache_salt, text
        )
        self.scheduler.check_admissible(children)
        return children

    def process_beams(self, request_id, prompt, params, now: float) -> BeamGroup:
        """A beam search's first beam, checked (it needs stage 3's fork and copy-on-write)."""
        if not self.scheduler.supports_beam_search:
            raise ValueError(
                f"beam_search: needs copy-on-write (stage 3, cow) or later; this engine is stage {self.config.stage}"
            )
        check_request_id(request_id)
        params = check_beam_params(params, self.config, self.model_config.vocab_size)
        self._check_free(request_id, [i for i in self.scheduler.requests.all_ids() if is_beam_id(i, request_id)])
        text, token_ids = check_prompt(prompt, self.tokenizer, self.model_config.vocab_size, self.config.max_model_len)
        steps = max_output_tokens(len(token_ids), params.max_tokens, self.config.max_model_len)
        group = BeamGroup.start(request_id, token_ids, params, steps, self.model_config.eos_token_ids, now, text)
        self.scheduler.check_admissible(group.live * params.beam_width)  # every beam may need its own blocks
        return group

    def _check_free(self, request_id: str, reserved: list[str]) -> None:
        """`request_id` and the ids it reserves (its children's; for a search, its beams') name no live request."""
        if self.owner_of(request_id) == request_id:
            raise ValueError(f"request_id: {request_id!r} is already running")
        for rid in [request_id, *reserved]:
            owner = self.owner_of(rid)
            if owner is not None:
                raise ValueError(f"request_id: {request_id!r} collides with the live request {owner!r} (id {rid!r})")


def check_engine_memory(config: EngineConfig, model_config) -> None:
    """What an engine allocates up front must fit: weights and KV pool on config.device, the rest on the CPU."""
    kv_block = config.block_size * kv_bytes_per_token(model_config, config.dtype)
    weights = model_config.num_parameters * DTYPES[config.dtype]
    on_device = {
        "model": (weights, "the model's weights"),
        "num_kv_blocks": (
            config.num_kv_blocks * kv_block,
            f"{config.num_kv_blocks} KV blocks of {config.block_size} tokens",
        ),
    }
    on_host = {
        "num_swap_blocks": (config.num_swap_blocks * kv_block, f"{config.num_swap_blocks} CPU swap blocks"),
        "max_num_seqs": (
            config.max_num_seqs * cdiv(config.max_model_len, config.block_size) * 4,
            "the runner's block tables",
        ),
    }
    if config.device == "cpu":
        check_memory(on_device | on_host, "cpu")
    else:
        check_memory(on_device, config.device)
        check_memory(on_host, "cpu")
