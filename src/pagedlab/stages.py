"""Stage 1: the stage presets: the parts each stage wires, and every fact about a stage.

Builds on: config.py and every part a preset names.
Read with: chapters/00-overview.md, chapters/97-architecture.md.

A stage is data, not a flag: the engine asks its preset for its parts and
never checks a stage number, and what a stage allows (which engine settings
it reads, their defaults, its attention backends) is written here, once, so
that config.py knows nothing about stages. A later stage adds a preset that
names a new class (or a subclass overriding one method).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedlab.attention.contiguous import ContiguousAttention
from pagedlab.attention.paged import PagedAttention
from pagedlab.attention.tiled import TiledPagedAttention
from pagedlab.config import STAGE_NAMES, parse_stage
from pagedlab.kv.contiguous import ContiguousKVCacheManager
from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.kv.swap import SwappingKVCacheManager
from pagedlab.sched.continuous import ContinuousScheduler
from pagedlab.sched.groups import NoSharing
from pagedlab.sched.sharing import PromptSharing
from pagedlab.sched.static import StaticScheduler

# Engine settings that only some stages read (every other EngineConfig field is read by every stage).
STAGE_FIELDS = ("enable_prefix_caching", "long_prefill_token_threshold", "preemption_mode", "num_swap_blocks",
                "scheduling_policy")  # fmt: skip
CONTINUOUS_FIELDS = frozenset(STAGE_FIELDS)


@dataclass(frozen=True)
class StagePreset:
    """The parts of one stage, what it allows, and what its notebook asks."""

    number: int  # 1 .. 6
    name: str  # STAGE_NAMES[number]
    kv_manager: type  # built with .from_config(config)
    scheduler: type  # (config, kv_manager, sharing) -> scheduler
    sharing: type  # how a request's children are scheduled: NoSharing, or PromptSharing (fork, beams) from stage 3
    attention: type  # the torch backend: (kv_cache, num_queries_per_kv, head_dim) -> attention backend
    question: str  # the question the stage's notebook answers
    vllm_files: tuple[str, ...]  # where vLLM keeps the same idea
    uses: frozenset[str] = frozenset()  # the fields of STAGE_FIELDS this stage reads
    defaults: dict = field(default_factory=dict)  # field -> its value when the user gives none
    backends: tuple[str, ...] = ("torch",)  # attention backends it can run, the preferred first


STAGES: dict[int, StagePreset] = {
    1: StagePreset(
        1,
        STAGE_NAMES[1],
        ContiguousKVCacheManager,
        StaticScheduler,
        NoSharing,
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
        NoSharing,
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
        StaticScheduler,
        PromptSharing,
        PagedAttention,
        "What do n>1 sampling and beam search cost with sharing?",
        (
            "vllm/core/block_manager.py (v0.10.2: fork, copy-on-write)",
            "vllm/core/block/cpu_gpu_block_allocator.py (v0.10.2)",
            "BeamSearchOfflineMixin.beam_search in vllm/entrypoints/generate/beam_search/offline.py",
        ),
    ),
    4: StagePreset(
        4,
        STAGE_NAMES[4],
        PrefixCachingKVCacheManager,
        StaticScheduler,
        PromptSharing,
        PagedAttention,
        "How much prefill does a shared prefix save?",
        (
            "vllm/v1/core/kv_cache_utils.py (hash_block_tokens, NONE_HASH)",
            "vllm/v1/core/block_pool.py (cached_block_hash_to_block, touch)",
            "vllm/v1/core/kv_cache_manager.py (get_computed_blocks)",
        ),
        uses=frozenset({"enable_prefix_caching"}),
        defaults={"enable_prefix_caching": True},
    ),
    5: StagePreset(
        5,
        STAGE_NAMES[5],
        SwappingKVCacheManager,
        ContinuousScheduler,
        PromptSharing,
        TiledPagedAttention,
        "Throughput and latency vs static batching?",
        (
            "vllm/v1/core/sched/scheduler.py (schedule, _preempt_request)",
            "vllm/v1/core/sched/request_queue.py",
            "vllm/v1/request.py (RequestStatus)",
        ),
        uses=CONTINUOUS_FIELDS,
        defaults={"enable_prefix_caching": True},
    ),
    6: StagePreset(
        6,
        STAGE_NAMES[6],
        SwappingKVCacheManager,
        ContinuousScheduler,
        PromptSharing,
        TiledPagedAttention,  # the fallback where Triton cannot run; "triton" is attention/triton/backend.py
        "Parity, and speed on a GPU?",
        (
            "csrc/attention/attention_kernels.cuh (paged_attention_v1/v2, v0.10.2)",
            "csrc/cache_kernels.cu (reshape_and_cache)",
            "vllm/attention/ops/paged_attn.py (v0.10.2)",
            "vllm/v1/attention/ops/prefix_prefill.py",
        ),
        uses=CONTINUOUS_FIELDS,
        defaults={"enable_prefix_caching": True},
        backends=("triton", "torch"),
    ),
}


def make_attention(config, preset: StagePreset, kv_cache, num_queries_per_kv: int, head_dim: int, windows=()):
    """The preset's torch backend, or the Triton one (imported only now) when the config resolved to it."""
    if config.attention_backend == "triton":
        from pagedlab.attention.triton.backend import TritonAttention

        backend = TritonAttention(kv_cache, num_queries_per_kv, head_dim)
    else:
        backend = preset.attention(kv_cache, num_queries_per_kv, head_dim)
    backend.windows = windows  # each layer's sliding window; () = none
    return backend


def make_scheduler(config, preset: StagePreset, kv_manager):
    return preset.scheduler(config, kv_manager, preset.sharing)


def get_preset(stage: int) -> StagePreset:
    if stage not in STAGES:
        done = ", ".join(f"{n} ({p.name})" for n, p in STAGES.items())
        raise ValueError(f"stage: stage {stage} ({STAGE_NAMES[stage]}) is not implemented yet; implemented: {done}")
    return STAGES[stage]


def first_stage_using(name: str) -> int:
    """The first stage that reads the engine setting `name` (1 for a setting every stage reads)."""
    if name not in STAGE_FIELDS:
        return 1
    return min(n for n, p in STAGES.items() if name in p.uses)


def introduced_by(name: str) -> str:
    """'stage 5 (continuous)', for messages about a setting a stage does not read."""
    first = first_stage_using(name)
    return f"stage {first} ({STAGE_NAMES[first]})"


def highest_stage() -> int:
    return max(STAGES)


def default_stage() -> int:
    """ "continuous" once it exists (stage 6 only swaps the attention kernels)."""
    return 5 if 5 in STAGES else highest_stage()


def describe(stage: int | str) -> str:
    """The wiring of one stage, as `pagedlab describe --stage N` prints it."""
    p = get_preset(parse_stage(stage))
    name = lambda cls: f"{cls.__module__}.{cls.__qualname__}"
    attention = name(p.attention)
    here = []
    if "triton" in p.backends:
        attention = f"pagedlab.attention.triton.backend.TritonAttention where Triton runs; else {attention}"
        here = [f"  here       : {_backend_here()}"]
    lines = [
        f"stage {p.number} ({p.name}): {p.question}",
        f"  KV manager : {name(p.kv_manager)}",
        f"  scheduler  : {name(p.scheduler)}, children scheduled by {name(p.sharing)}",
        f"  attention  : {attention}",
        "  step()     : scheduler.schedule() -> runner.execute() -> scheduler.update()",
        "  in vLLM    : " + "; ".join(p.vllm_files),
    ]
    return "\n".join(lines[:4] + here + lines[4:])


def _backend_here() -> str:
    """Which attention backend stage 6 picks on this machine, and why."""
    import importlib.util
    import os

    import torch

    from pagedlab.config import triton_can_run

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if triton_can_run(device):
        how = "compiled for the GPU" if device == "cuda" else "in Triton's interpreter (TRITON_INTERPRET=1), slowly"
        return f"TritonAttention, {how}"
    if importlib.util.find_spec("triton") is None:
        why = "Triton is not installed (pip install triton)"
    elif os.environ.get("TRITON_INTERPRET") != "1":
        why = "no CUDA device; TRITON_INTERPRET=1 runs the kernels in Triton's interpreter"
    else:
        why = "Triton cannot run here"
    return f"TiledPagedAttention (the torch fallback): {why}"
