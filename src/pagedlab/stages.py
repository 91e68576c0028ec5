"""Stage 1: the stage presets: the parts each stage wires, every fact about a stage, and its config.

Builds on: config.py (EngineConfig), attention/backends.py (BACKENDS), sched/policies.py (POLICIES), and
every part a preset names.
Read with: chapters/00-overview.md, chapters/97-architecture.md.

A stage is data, not a flag: the engine asks its preset for its parts and
never checks a stage number, and every fact about a stage (its name, chapter,
notebook and test marker, which engine settings it reads, their defaults, its
attention backends) is written here, once; everything else reads it. A later
stage adds a preset that names a new class (or a subclass overriding one
method). `engine_config` builds a stage's EngineConfig from a user's settings:
a setting the stage does not read is a ValueError naming the stage that
introduces it (a reader who sets `preemption_mode` on stage 2 has
misunderstood something, and silence would hide it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

from pagedlab.attention.backends import BACKENDS
from pagedlab.config import DTYPES, KV_MEMORY_BUDGET_BYTES, EngineConfig, kv_bytes_per_token
from pagedlab.kv.block_pool import FreeKVCacheBlockQueue
from pagedlab.kv.cache_groups import kv_cache_groups
from pagedlab.kv.contiguous import ContiguousKVCacheManager
from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.kv.hashing import HashChainIndex
from pagedlab.kv.hybrid import HybridKVCacheManager
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.kv.swap import SwappingKVCacheManager
from pagedlab.sched.continuous import ContinuousScheduler
from pagedlab.sched.groups import NoSharing
from pagedlab.sched.policies import POLICIES
from pagedlab.sched.sharing import PromptSharing
from pagedlab.sched.static import StaticScheduler

# Engine settings that only some stages read (every other EngineConfig field is read by every stage).
STAGE_FIELDS = ("enable_prefix_caching", "long_prefill_token_threshold", "preemption_mode", "num_swap_blocks",
                "scheduling_policy")  # fmt: skip
CONTINUOUS_FIELDS = frozenset(STAGE_FIELDS)
# The prefix cache's parts (stage 4 on): the index of cached blocks, and the eviction policy, the free queue's order
# (least recently freed first, as vLLM's). Another index or policy is one file and a change here.
PREFIX_CACHE = {"prefix_index": HashChainIndex, "eviction": FreeKVCacheBlockQueue}


@dataclass(frozen=True)
class StagePreset:
    """The parts of one stage, what it allows, and where a reader meets it."""

    number: int  # 1 .. 6
    name: str  # "contiguous", "paged", ...: what `stage=` may say instead of the number
    kv_manager: type  # built with .from_config(config)
    scheduler: type  # (config, kv_manager, sharing) -> scheduler
    sharing: type  # how a request's children are scheduled: NoSharing, or PromptSharing (fork, beams) from stage 3
    question: str  # the question the stage's notebook answers
    vllm_files: tuple[str, ...]  # where vLLM keeps the same idea
    slug: str  # "01-contiguous-static": chapters/{slug}.md, and (with "_") notebooks/{slug}.ipynb
    uses: frozenset[str] = frozenset()  # the fields of STAGE_FIELDS this stage reads
    defaults: dict = field(default_factory=dict)  # field -> its value when the user gives none
    backends: tuple[str, ...] = ("reference", "tiled")  # names in BACKENDS it can run, the preferred first
    kv_parts: dict = field(default_factory=dict)  # the KV manager's parts: prefix_index, eviction (stage 4 on)

    @property
    def chapter(self) -> str:
        return f"chapters/{self.slug}.md"

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.slug.replace('-', '_')}.ipynb"

    @property
    def marker(self) -> str:
        """The pytest marker of the stage's tests (the grader runs -m stageN)."""
        return f"stage{self.number}"


STAGES: dict[int, StagePreset] = {
    1: StagePreset(
        1,
        "contiguous",
        ContiguousKVCacheManager,
        StaticScheduler,
        NoSharing,
        "How much reserved KV memory is wasted?",
        (
            "the paper's contiguous pre-allocation and its Orca baselines (Kwon et al. 2023, §3.1, §6.1, Fig. 2)",
            "vllm/v1/worker/gpu_model_runner.py",
        ),
        "01-contiguous-static",
        backends=("contiguous",),
    ),
    2: StagePreset(
        2,
        "paged",
        PagedKVCacheManager,
        StaticScheduler,
        NoSharing,
        "How many more requests fit?",
        (
            "vllm/v1/core/block_pool.py",
            "vllm/v1/core/kv_cache_utils.py (FreeKVCacheBlockQueue)",
            "vllm/v1/core/kv_cache_manager.py",
            "vllm/v1/worker/block_table.py",
        ),
        "02-paged-blocks",
    ),
    3: StagePreset(
        3,
        "cow",
        CowKVCacheManager,
        StaticScheduler,
        PromptSharing,
        "What do n>1 sampling and beam search cost with sharing?",
        (
            "vllm/core/block_manager.py (v0.10.2: fork, copy-on-write)",
            "vllm/core/block/cpu_gpu_block_allocator.py (v0.10.2)",
            "BeamSearchOfflineMixin.beam_search in vllm/entrypoints/generate/beam_search/offline.py",
        ),
        "03-copy-on-write",
    ),
    4: StagePreset(
        4,
        "prefix",
        PrefixCachingKVCacheManager,
        StaticScheduler,
        PromptSharing,
        "How much prefill does a shared prefix save?",
        (
            "vllm/v1/core/kv_cache_utils.py (hash_block_tokens, NONE_HASH)",
            "vllm/v1/core/block_pool.py (cached_block_hash_to_block, touch)",
            "vllm/v1/core/kv_cache_manager.py (get_computed_blocks)",
        ),
        "04-prefix-caching",
        uses=frozenset({"enable_prefix_caching"}),
        defaults={"enable_prefix_caching": True},
        kv_parts=PREFIX_CACHE,
    ),
    5: StagePreset(
        5,
        "continuous",
        SwappingKVCacheManager,
        ContinuousScheduler,
        PromptSharing,
        "Throughput and latency vs static batching?",
        (
            "vllm/v1/core/sched/scheduler.py (schedule, _preempt_request)",
            "vllm/v1/core/sched/request_queue.py",
            "vllm/v1/request.py (RequestStatus)",
        ),
        "05-continuous-batching",
        uses=CONTINUOUS_FIELDS,
        defaults={"enable_prefix_caching": True},
        kv_parts=PREFIX_CACHE,
        backends=("tiled", "reference"),
    ),
    6: StagePreset(
        6,
        "kernel",
        SwappingKVCacheManager,
        ContinuousScheduler,
        PromptSharing,
        "Parity, and speed on a GPU?",
        (
            "csrc/attention/attention_kernels.cuh (paged_attention_v1/v2, v0.10.2)",
            "csrc/cache_kernels.cu (reshape_and_cache)",
            "vllm/attention/ops/paged_attn.py (v0.10.2)",
            "vllm/v1/attention/ops/prefix_prefill.py",
        ),
        "06-triton-kernel",
        uses=CONTINUOUS_FIELDS,
        defaults={"enable_prefix_caching": True},
        kv_parts=PREFIX_CACHE,
        backends=("triton", "tiled", "reference"),  # tiled: the fallback where Triton cannot run
    ),
}


STAGE_NAMES = {n: p.name for n, p in STAGES.items()}


def parse_stage(stage: int | str) -> int:
    """'paged', 2 and '2' all mean stage 2."""
    if isinstance(stage, str) and stage.isdigit():
        stage = int(stage)
    if isinstance(stage, int) and not isinstance(stage, bool) and stage in STAGES:
        return stage
    by_name = {p.name: n for n, p in STAGES.items()}
    if isinstance(stage, str) and stage in by_name:
        return by_name[stage]
    choices = ", ".join(f"{n} ({p.name})" for n, p in STAGES.items())
    raise ValueError(f"stage: unknown stage {stage!r}; choose one of {choices}")


def get_preset(stage: int | str) -> StagePreset:
    return STAGES[parse_stage(stage)]


# --- a stage's EngineConfig ------------------------------------------------------------------------------------


def engine_config(stage: int | str, model_max_len: int, kv_bytes_per_token: int, **overrides) -> EngineConfig:
    """The stage's EngineConfig from a user's settings: each checked against the preset, the rest its defaults,
    then the defaults that depend on the model (config.py), the policy and the attention backend."""
    preset = get_preset(stage)
    overrides = EngineConfig.checked_overrides(overrides)
    for name, value in overrides.items():
        if value is not None and name in STAGE_FIELDS and name not in preset.uses:
            raise ValueError(
                f"{name}: stage {preset.number} ({preset.name}) does not use it; it is introduced by "
                f"{introduced_by(name)}"
            )
    given = {k: v for k, v in overrides.items() if v is not None}
    cfg = EngineConfig(stage=preset.number, stage_name=preset.name, **(preset.defaults | given))
    cfg = cfg.with_defaults(model_max_len, kv_bytes_per_token)
    if cfg.scheduling_policy not in POLICIES:
        raise ValueError(f"scheduling_policy: {cfg.scheduling_policy!r} is not one of {tuple(POLICIES)}")
    return replace(cfg, attention_backend=resolve_backend(cfg, preset))


def config_for_model(stage: int | str, model_config, **overrides) -> EngineConfig:
    """The settings for a model, from its config.json alone: built before a single weight is read."""
    dtype = overrides.get("dtype") or "float32"
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {tuple(DTYPES)}")
    if "sliding_window" in overrides:
        raise ValueError("sliding_window: comes from the model's config.json (sliding_window, layer_types)")
    per_token = kv_bytes_per_token(model_config, dtype)
    cfg = engine_config(stage, model_config.max_position_embeddings, per_token, **overrides)
    if cfg.stage < 2:  # stage 1's regions are reserved whole
        return cfg
    windows = model_config.layer_windows
    if len(set(windows)) > 1:  # layers of different kinds: one KV cache group per kind (kv/cache_groups.py)
        if not overrides.get("num_kv_blocks") and not overrides.get("kv_cache_memory"):
            # the default pool holds max_num_seqs tables of max_model_len; here every request has a table per
            # group, and block 0 is the null block (within the same memory budget as any default pool)
            groups = len(kv_cache_groups(windows))
            budget = max(cfg.num_kv_blocks, KV_MEMORY_BUDGET_BYTES // max(1, per_token * cfg.block_size))
            cfg = replace(cfg, num_kv_blocks=min(cfg.num_kv_blocks * groups + 1, budget))
        return replace(cfg, layer_windows=tuple(windows))
    return replace(cfg, sliding_window=model_config.kv_window or 0)


def resolve_backend(cfg: EngineConfig, preset: StagePreset) -> str:
    """The attention backend's name, among those the stage can run (preferred first; "torch" means its first
    torch backend). The preferred one falls back to torch, with one warning, where it cannot run; one asked for
    by name there is an error."""
    torch_default = next(n for n in preset.backends if BACKENDS[n].family == "torch")
    asked = torch_default if cfg.attention_backend == "torch" else cfg.attention_backend
    if asked and asked not in BACKENDS:
        raise ValueError(f"attention_backend: {asked!r} is not one of {('torch', *BACKENDS)}")
    if asked and asked not in preset.backends:
        first = min(n for n, p in STAGES.items() if asked in p.backends)
        raise ValueError(
            f"attention_backend: {asked!r} is introduced by stage {first} ({STAGES[first].name}), not stage {cfg.stage}"
        )
    backend = BACKENDS[asked or preset.backends[0]]
    if backend.can_run(cfg.device):
        return backend.name
    if asked:
        raise ValueError(f"attention_backend: {asked!r} needs {backend.needs} (device is {cfg.device!r})")
    warnings.warn(
        f"stage {cfg.stage}: {backend.name} cannot run here ({backend.needs}); using the torch attention backend",
        stacklevel=4,
    )
    return torch_default


def first_stage_using(name: str) -> int:
    """The first stage that reads the engine setting `name` (1 for a setting every stage reads)."""
    if name not in STAGE_FIELDS:
        return 1
    return min(n for n, p in STAGES.items() if name in p.uses)


def introduced_by(name: str) -> str:
    """'stage 5 (continuous)', for messages about a setting a stage does not read."""
    first = first_stage_using(name)
    return f"stage {first} ({STAGES[first].name})"


# --- the parts ----------------------------------------------------------------------------------------------------


def make_attention(config, kv_cache, num_queries_per_kv: int, head_dim: int, windows=()):
    """The backend the config resolved to (imported only now: Triton's only where it runs)."""
    backend = BACKENDS[config.attention_backend].load()(kv_cache, num_queries_per_kv, head_dim)
    backend.windows = windows  # each layer's sliding window; () = none
    return backend


def make_kv_manager(config, preset: StagePreset):
    """The preset's KV manager for `config`, with the preset's parts (a prefix index and its eviction policy); for a
    hybrid model, that manager once per KV cache group under kv/hybrid.py's coordinator."""
    if config.hybrid:
        if config.stage < 2:
            raise ValueError(f"layer_windows: stage {config.stage} keeps no paged KV cache to split into groups")
        groups = kv_cache_groups(config.layer_windows)
        return HybridKVCacheManager.for_config(preset.kv_manager, groups, config, **preset.kv_parts)
    return preset.kv_manager.from_config(config, **preset.kv_parts)


def make_scheduler(config, preset: StagePreset, kv_manager):
    return preset.scheduler(config, kv_manager, preset.sharing)


def default_stage() -> int:
    """ "continuous" (stage 6 only swaps the attention kernels)."""
    return 5


def describe(stage: int | str) -> str:
    """The wiring of one stage, as `pagedlab describe --stage N` prints it."""
    p = get_preset(stage)
    name = lambda cls: f"{cls.__module__}.{cls.__qualname__}"
    backends = [f"{BACKENDS[b].target.replace(':', '.')} ({b})" for b in p.backends]
    lines = [
        f"stage {p.number} ({p.name}): {p.question}",
        f"  KV manager : {name(p.kv_manager)}",
        f"  scheduler  : {name(p.scheduler)}, children scheduled by {name(p.sharing)}",
        f"  attention  : {backends[0]}" + (f"; else {', '.join(backends[1:])}" if len(backends) > 1 else ""),
        "  step()     : scheduler.schedule() -> runner.execute() -> scheduler.update()",
        "  in vLLM    : " + "; ".join(p.vllm_files),
    ]
    if "triton" in p.backends:
        lines.insert(4, f"  here       : {_backend_here()}")
    return "\n".join(lines)


def _backend_here() -> str:
    """Which attention backend stage 6 picks on this machine, and why."""
    import importlib.util
    import os

    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if BACKENDS["triton"].can_run(device):
        how = "compiled for the GPU" if device == "cuda" else "in Triton's interpreter (TRITON_INTERPRET=1), slowly"
        return f"TritonAttention, {how}"
    if importlib.util.find_spec("triton") is None:
        why = "Triton is not installed (pip install triton)"
    elif os.environ.get("TRITON_INTERPRET") != "1":
        why = "no CUDA device; TRITON_INTERPRET=1 runs the kernels in Triton's interpreter"
    else:
        why = "Triton cannot run here"
    return f"TiledPagedAttention (the torch fallback): {why}"
