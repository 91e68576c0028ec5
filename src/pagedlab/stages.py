"""Stage 1: the stage presets: which KV manager, scheduler and attention backend each stage wires.

Builds on: config.py and every part a preset names.
Read with: chapters/00-overview.md.

A stage is data, not a flag: the engine asks its preset for three parts and
never checks a stage number. A later stage adds a preset that names a new
class (or a subclass overriding one method).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedlab.attention.contiguous import ContiguousAttention
from pagedlab.attention.paged import PagedAttention
from pagedlab.config import STAGE_NAMES, parse_stage
from pagedlab.kv.contiguous import ContiguousKVCacheManager
from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.kv.swap import SwappingKVCacheManager
from pagedlab.sched.continuous import ContinuousScheduler
from pagedlab.sched.cow import CowScheduler
from pagedlab.sched.static import StaticScheduler


@dataclass(frozen=True)
class StagePreset:
    """The three parts of one stage, and what its notebook asks."""

    number: int  # 1 .. 6
    name: str  # STAGE_NAMES[number]
    kv_manager: type  # built with .from_config(config)
    scheduler: type  # (config, kv_manager) -> scheduler
    attention: type  # (kv_cache, num_queries_per_kv, head_dim) -> attention backend
    question: str  # the question the stage's notebook answers
    vllm_files: tuple[str, ...]  # where vLLM keeps the same idea


STAGES: dict[int, StagePreset] = {
    1: StagePreset(
        1,
        STAGE_NAMES[1],
        ContiguousKVCacheManager,
        StaticScheduler,
        ContiguousAttention,
        "How much reserved KV memory is wasted?",
        (
            "the paper's contiguous pre-allocation and its Orca baselines (Kwon et al. 2023, §3.1, §6.1, Fig. 2)",
            "vllm/v1/worker/gpu_model_runner.py",
        ),
    ),
    2: StagePreset(
        2,
        STAGE_NAMES[2],
        PagedKVCacheManager,
        StaticScheduler,
        PagedAttention,
        "How many more requests fit?",
        (
            "vllm/v1/core/block_pool.py",
            "vllm/v1/core/kv_cache_utils.py (FreeKVCacheBlockQueue)",
            "vllm/v1/core/kv_cache_manager.py",
            "vllm/v1/worker/block_table.py",
        ),
    ),
    3: StagePreset(
        3,
        STAGE_NAMES[3],
        CowKVCacheManager,
        CowScheduler,
        PagedAttention,
        "What do n>1 sampling and beam search cost with sharing?",
        (
            "vllm/core/block_manager.py (v0: fork, copy-on-write)",
            "vllm/core/block/cpu_gpu_block_allocator.py",
            "vllm/beam_search.py",
            "LLM.beam_search in vllm/entrypoints/llm.py",
        ),
    ),
    4: StagePreset(
        4,
        STAGE_NAMES[4],
        PrefixCachingKVCacheManager,
        CowScheduler,
        PagedAttention,
        "How much prefill does a shared prefix save?",
        (
            "vllm/v1/core/kv_cache_utils.py (hash_block_tokens, NONE_HASH)",
            "vllm/v1/core/block_pool.py (cached_block_hash_to_block, touch)",
            "vllm/v1/core/kv_cache_manager.py (get_computed_blocks)",
        ),
    ),
    5: StagePreset(
        5,
        STAGE_NAMES[5],
        SwappingKVCacheManager,
        ContinuousScheduler,
        PagedAttention,
        "Throughput and latency vs static batching?",
        (
            "vllm/v1/core/sched/scheduler.py (schedule, _preempt_request)",
            "vllm/v1/core/sched/request_queue.py",
            "vllm/v1/request.py (RequestStatus)",
        ),
    ),
    6: StagePreset(
        6,
        STAGE_NAMES[6],
        SwappingKVCacheManager,
        ContinuousScheduler,
        PagedAttention,  # the fallback; attention_backend="triton" swaps in attention/triton/backend.py
        "Parity, and speed on a GPU?",
        (
            "csrc/attention/attention_kernels.cuh (paged_attention_v1/v2)",
            "csrc/cache_kernels.cu (reshape_and_cache)",
            "vllm/attention/ops/paged_attn.py, vllm/attention/ops/prefix_prefill.py",
        ),
    ),
}


def make_attention(config, preset: StagePreset, kv_cache, num_queries_per_kv: int, head_dim: int):
    """The preset's torch backend, or the Triton one (imported only now) when the config resolved to it."""
    if config.attention_backend == "triton":
        from pagedlab.attention.triton.backend import TritonAttention

        return TritonAttention(kv_cache, num_queries_per_kv, head_dim)
    return preset.attention(kv_cache, num_queries_per_kv, head_dim)


def get_preset(stage: int) -> StagePreset:
    if stage not in STAGES:
        done = ", ".join(f"{n} ({p.name})" for n, p in STAGES.items())
        raise ValueError(f"stage: stage {stage} ({STAGE_NAMES[stage]}) is not implemented yet; implemented: {done}")
    return STAGES[stage]


def highest_stage() -> int:
    return max(STAGES)


def default_stage() -> int:
    """DESIGN §3: "continuous" once it exists (stage 6 only swaps the attention kernels)."""
    return 5 if 5 in STAGES else highest_stage()


def describe(stage: int | str) -> str:
    """The wiring of one stage, as `pagedlab describe --stage N` prints it."""
    p = get_preset(parse_stage(stage))
    lines = [
        f"stage {p.number} ({p.name}): {p.question}",
        f"  KV manager : {p.kv_manager.__module__}.{p.kv_manager.__qualname__}",
        f"  scheduler  : {p.scheduler.__module__}.{p.scheduler.__qualname__}",
        f"  attention  : {p.attention.__module__}.{p.attention.__qualname__}",
        "  step()     : scheduler.schedule() -> runner.execute() -> scheduler.update()",
        "  in vLLM    : " + "; ".join(p.vllm_files),
    ]
    return "\n".join(lines)
