"""Stage 1: checks on a request, and on the sizes asked for, before anything enters the engine.

Builds on: config.py, sampling_params.py, model/tokenizer.py.
Read with: chapters/01-contiguous-static.md.

Every check runs before any engine state changes, so a bad request is
refused whole and the requests already running never notice it. Each problem
is a ValueError whose message starts with the field at fault. What a
`SamplingParams` can check alone it checks when it is built; what needs the
model or the engine's settings (the vocabulary, `max_logprobs`,
`max_num_seqs`) is checked here, at `add_request`, as vLLM's input processor does.

Sizes are checked the same way: a pool, a swap pool or a model that cannot fit
in memory is refused with the bytes it would take, instead of minutes of work
and then an allocator's crash.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from pagedlab.config import FIELD_STAGE, STAGE_NAMES, EngineConfig, format_bytes
from pagedlab.model.tokenizer import Tokenizer
from pagedlab.sampling_params import BeamSearchParams, SamplingParams


def check_request_id(request_id) -> None:
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"request_id: expected a non-empty string, got {request_id!r}")


def check_prompt(prompt, tokenizer: Tokenizer | None, vocab_size: int, max_model_len: int):
    """Return (text or None, token ids) for a str or list[int] prompt, or raise ValueError."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: empty prompt")
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
        raise ValueError(f"prompt: {len(ids)} tokens leave no room for output within max_model_len ({max_model_len})")
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
    if priority != 0 and config.scheduling_policy != "priority":
        stage = FIELD_STAGE["scheduling_policy"]
        raise ValueError(
            f"priority: {priority} needs scheduling_policy='priority' (stage {stage}, {STAGE_NAMES[stage]})"
        )
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise ValueError(f"cache_salt: expected a string, got {cache_salt!r}")
    if cache_salt is not None and not config.enable_prefix_caching:
        stage = FIELD_STAGE["enable_prefix_caching"]
        raise ValueError(f"cache_salt: needs prefix caching (stage {stage}, {STAGE_NAMES[stage]}, enabled)")
    real = isinstance(arrival_time, (int, float)) and not isinstance(arrival_time, bool)
    if arrival_time is not None and not (real and math.isfinite(arrival_time)):
        raise ValueError(f"arrival_time: expected a finite number of seconds, got {arrival_time!r}")


# --- memory ------------------------------------------------------------------------------------------------------


def check_engine_memory(config: EngineConfig, num_parameters: int, kv_bytes_per_token: int, itemsize: int) -> None:
    """What an engine allocates up front must fit: weights and KV pool on config.device, the rest on the CPU."""
    kv_block = config.block_size * kv_bytes_per_token
    on_device = {
        "model": (num_parameters * itemsize, "the model's weights"),
        "num_kv_blocks": (
            config.num_kv_blocks * kv_block,
            f"{config.num_kv_blocks} KV blocks of {config.block_size} tokens",
        ),
    }
    on_host = {
        "num_swap_blocks": (config.num_swap_blocks * kv_block, f"{config.num_swap_blocks} CPU swap blocks"),
        "max_num_seqs": (config.max_num_seqs * config.max_blocks_per_request * 4, "the runner's block tables"),
    }
    if config.device == "cpu":
        check_memory(on_device | on_host, "cpu")
    else:
        check_memory(on_device, config.device)
        check_memory(on_host, "cpu")


def check_memory(parts: dict, device: str) -> None:
    """Refuse what cannot fit: parts is {field to blame: (bytes, what)}; the largest part names the field.

    A lower bound (activations come on top), so it never refuses what could have run.
    """
    available = available_memory(device)
    total = sum(size for size, _ in parts.values())
    if available is None or total <= available:
        return
    field, (size, what) = max(parts.items(), key=lambda item: item[1][0])
    raise ValueError(
        f"{field}: {what} take {format_bytes(size)}, {format_bytes(total)} in all with the rest, "
        f"but {device} has {format_bytes(available)} available"
    )


def available_memory(device: str) -> int | None:
    """Bytes free on `device` now (None where it cannot be told)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    if device != "cpu":
        return None
    limits = [_meminfo_available(), _cgroup_available()]
    known = [b for b in limits if b is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    """Linux's MemAvailable, or free pages where sysconf knows them (other Unix systems)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """A container's memory limit minus its use (cgroup v2), when it has one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)
