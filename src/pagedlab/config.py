"""Stage 1: `EngineConfig`, every knob of the engine, checked for type and range.

Builds on: nothing (this module imports nothing of pagedlab: everything else may read it).
Read with: chapters/01-contiguous-static.md.

What each stage reads, its defaults, its attention backends and its policies
are facts of the stage presets (stages.py), which build a config with
`stages.engine_config` and refuse a knob the chosen stage does not use. This
module knows no stage: it checks each field's type and range, and fills the
defaults that depend on the model (the pool's size, max_model_len).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields, replace

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}  # the dtypes of model and KV cache -> bytes per element
KV_MEMORY_BUDGET_BYTES = 512 * 2**20  # default KV pool size cap on any device
_KIND_WORDS = {"int": "an integer", "bool": "True or False", "str": "a string"}  # a field's annotation -> words


@dataclass(frozen=True)
class EngineConfig:
    """Every engine setting. Build it with `stages.engine_config`, which checks it against the stage's preset and
    fills the defaults that depend on the model."""

    stage: int  # 1 .. 6
    stage_name: str = ""  # its preset's name ("continuous"), set by stages.engine_config
    block_size: int = 16  # tokens per KV block
    num_kv_blocks: int = 0  # KV pool capacity in blocks of block_size tokens (0 = size it for the model)
    kv_cache_memory: int = 0  # bytes for the KV pool when num_kv_blocks is 0 ("512MiB" accepted; 0 = see below)
    max_model_len: int = 0  # prompt + output tokens at most (0 = the model's max positions, capped by the pool)
    max_num_seqs: int = 32  # requests running at once at most
    max_num_batched_tokens: int = 0  # tokens per step at most (0 = max(2048, max_model_len))
    long_prefill_token_threshold: int = 0  # stage 5: cap on one request's prefill chunk; 0 = no cap (as vLLM)
    enable_prefix_caching: bool = False  # stage 4+: reuse cached full blocks (on by default there)
    preemption_mode: str = "recompute"  # stage 5: "recompute" | "swap"
    num_swap_blocks: int = 0  # stage 5: CPU swap pool size in blocks
    scheduling_policy: str = "fcfs"  # stage 5: "fcfs" | "priority"
    attention_backend: str = ""  # "torch" | "triton" (stage 6); "" = triton at stage 6 where it can run
    device: str = "cpu"  # torch device of the model and the KV cache
    dtype: str = "float32"  # model and KV cache dtype
    seed: int = 0  # seeds sampling for requests without a seed of their own
    max_logprobs: int = 20  # most top logprobs a request may ask for (vLLM's default); -1 = the whole vocabulary
    record_trace: bool = False  # keep a per-step trace (who ran, tokens, KV held/used) for plots
    max_trace_steps: int = 10_000  # the trace keeps the last this many steps (a ring: a long run stays bounded)
    debug_checks: bool = False  # check every invariant after every step (slow; for tests)
    sliding_window: int = 0  # from the model (stages 2+): every layer's window, so blocks behind it are freed; 0 = none
    # from a hybrid model (stages 2+): each layer's window (None: full attention) when the layers differ; the KV
    # cache then keeps one block table per KV cache group (kv/hybrid.py); () = one group
    layer_windows: tuple = ()

    @property
    def hybrid(self) -> bool:
        """Layers of more than one kind: the KV cache keeps a table per KV cache group (kv/hybrid.py)."""
        return len(set(self.layer_windows)) > 1

    @classmethod
    def checked_overrides(cls, overrides: dict) -> dict:
        """The keyword settings a user gave, each a known field of its annotated type ("512MiB" -> bytes)."""
        kinds = {f.name: f.type for f in fields(cls)}  # "int" | "bool" | "str" (annotations are strings here)
        known = set(kinds) - {"stage", "stage_name", "layer_windows"}  # the last comes from the model
        if isinstance(overrides.get("kv_cache_memory"), str):
            overrides = overrides | {"kv_cache_memory": parse_bytes(overrides["kv_cache_memory"], "kv_cache_memory")}
        for name, value in overrides.items():
            if name not in known:
                raise ValueError(f"{name}: not an engine setting (known: {', '.join(sorted(known))})")
            if value is not None:
                _check_kind(name, value, kinds[name])
        return overrides

    def with_defaults(self, model_max_len: int, kv_bytes_per_token: int) -> EngineConfig:
        """Fill the defaults that depend on the model, then check every range (choices are the presets')."""
        _check_positive(self, "block_size", "max_num_seqs")
        if self.kv_cache_memory < 0:
            raise ValueError(f"kv_cache_memory: expected bytes >= 0, got {self.kv_cache_memory}")
        if self.kv_cache_memory and self.num_kv_blocks:
            raise ValueError("kv_cache_memory: give it or num_kv_blocks, not both (each sizes the KV pool)")
        max_len = self.max_model_len or model_max_len
        if max_len > model_max_len:
            raise ValueError(f"max_model_len: {max_len} exceeds the model's max_position_embeddings ({model_max_len})")
        if 0 < max_len < self.block_size:
            raise ValueError(
                f"block_size: {self.block_size} tokens per block exceed max_model_len ({max_len}), so no request can "
                f"fill one, and one block would take {format_bytes(self.block_size * kv_bytes_per_token)} of KV"
            )
        blocks = self.num_kv_blocks or _default_num_blocks(self, max_len, kv_bytes_per_token)
        if not self.max_model_len and not self.num_kv_blocks:
            # A pool sized from memory caps the length (vLLM fits max_model_len to the KV cache the same way);
            # a pool the user sized keeps the model's length, and a request too long for it is refused.
            max_len = min(max_len, blocks * self.block_size)
        batched = self.max_num_batched_tokens or max(2048, max_len)  # vLLM's default without chunked prefill
        swap = self.num_swap_blocks or (blocks if self.preemption_mode == "swap" else 0)  # as big as the pool
        cfg = replace(
            self, max_model_len=max_len, max_num_batched_tokens=batched, num_kv_blocks=blocks, num_swap_blocks=swap
        )
        _check_positive(cfg, "max_model_len", "max_num_batched_tokens", "num_kv_blocks", "max_trace_steps")
        _check_choice(cfg, "dtype", tuple(DTYPES))
        check_device(cfg.device)
        _check_choice(cfg, "preemption_mode", ("recompute", "swap"))
        if cfg.max_num_batched_tokens < cfg.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens: {cfg.max_num_batched_tokens} is below max_num_seqs ({cfg.max_num_seqs}); "
                "a step of decodes alone would not fit"
            )
        for name, minimum in (("long_prefill_token_threshold", 0), ("num_swap_blocks", 0), ("seed", 0)):
            if getattr(cfg, name) < minimum:
                raise ValueError(f"{name}: must be >= {minimum}, got {getattr(cfg, name)}")
        if cfg.max_trace_steps > sys.maxsize:  # a ring buffer's length is a machine integer
            raise ValueError(f"max_trace_steps: must be at most {sys.maxsize}, got {cfg.max_trace_steps}")
        if cfg.max_logprobs < -1:
            raise ValueError(f"max_logprobs: must be >= 0, or -1 for the whole vocabulary; got {cfg.max_logprobs}")
        return cfg


def check_device(device: str) -> None:
    """'cpu', 'cuda', 'cuda:N' or 'mps', present on this machine; anything else is a ValueError naming the field."""
    if device == "cpu":
        return
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device: {device!r} is not a torch device; use 'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device: {device!r} but this machine has no usable CUDA device; use 'cpu'")
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(
                f"device: {device!r} but this machine has {count} CUDA device(s) (cuda:0 .. cuda:{count - 1})"
            )
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device: {device!r} but Apple's MPS is not available here; use 'cpu'")
    elif parsed.type != "cpu":
        raise ValueError(f"device: {device!r} is not supported; use 'cpu', 'cuda', 'cuda:N' or 'mps'")


def kv_bytes_per_token(model_config, dtype: str) -> int:
    """K and V of one token in every layer: 2 x layers x KV heads x head_dim x bytes per element."""
    mc = model_config
    return 2 * mc.num_hidden_layers * mc.num_key_value_heads * mc.head_dim * DTYPES[dtype]


def _default_num_blocks(cfg: EngineConfig, max_len: int, kv_bytes_per_token: int) -> int:
    """The KV pool's size in blocks when num_kv_blocks is not given.

    kv_cache_memory given: as many blocks as fit in it (vLLM gives the KV cache what gpu_memory_utilization
    leaves after the weights). Not given: enough for max_num_seqs requests of max_model_len tokens, within
    KV_MEMORY_BUDGET_BYTES (a small model then allocates no more than it can use).
    """
    block_bytes = max(1, kv_bytes_per_token * cfg.block_size)
    if cfg.kv_cache_memory:
        if cfg.kv_cache_memory < block_bytes:
            raise ValueError(
                f"kv_cache_memory: {format_bytes(cfg.kv_cache_memory)} is less than one block "
                f"({format_bytes(block_bytes)} for block_size {cfg.block_size})"
            )
        return cfg.kv_cache_memory // block_bytes
    wanted = cfg.max_num_seqs * math.ceil(max_len / cfg.block_size)
    return max(1, min(wanted, KV_MEMORY_BUDGET_BYTES // block_bytes))


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: str, name: str) -> int:
    """'512MiB' -> 536870912; '1.5GB' -> 1500000000; '4096' -> 4096 (a ValueError naming `name` otherwise)."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m and m.group(2).lower()
    if not m or unit not in _BYTE_UNITS:
        raise ValueError(f"{name}: {text!r} is not a size (e.g. 536870912, '512MiB', '2GB')")
    return int(float(m.group(1)) * _BYTE_UNITS[unit])


def _check_positive(cfg: EngineConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")


def _check_kind(name: str, value, kind: str) -> None:
    """A field's value has its annotated type: no 3.5 for an int, no 'no' for a bool (bools are not ints here)."""
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        raise ValueError(f"{name}: expected {_KIND_WORDS[kind]}, got {value!r}")


def _check_choice(cfg: EngineConfig, name: str, choices: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in choices:
        raise ValueError(f"{name}: {getattr(cfg, name)!r} is not one of {choices}")


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (error messages say how much memory a size would take)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
