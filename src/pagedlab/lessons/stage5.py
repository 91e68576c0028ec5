"""Stage 5: the figures of continuous batching: schedules, tokens per step, the swap pool, static vs continuous.

Builds on: lessons/stage1.py (the stage-1 workload), lessons/common.py, viz/ (Gantt, tokens per step,
block tables with a swap pool, pool occupancy).
Read with: chapters/05-continuous-batching.md.

Six speakers in a pool of 24 blocks of 4 (96 slots), at most 4 running, a budget of 16 tokens per step and
prefill chunks of at most 6: prompts are chunked beside decodes, and the pool runs dry. The comparison of
static (stage 4) and continuous (stage 5) batching runs the stage-1 workload instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from pagedlab import viz
from pagedlab.engine.stats import StepTrace
from pagedlab.lessons.common import TracedRun, _save
from pagedlab.lessons.stage1 import stage1_workload
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams

STAGE5_PROMPTS = (
    "ROMEO:\nBut soft, what light",
    "JULIET:",
    "HAMLET:\nTo be, or not",
    "First Citizen:",
    "KING RICHARD III:\nNow is",
    "MENENIUS:",
)
STAGE5_MAX_TOKENS = (20, 28, 16, 24, 12, 20)
STAGE5_POOL = dict(
    block_size=4, num_kv_blocks=24, max_num_seqs=4, max_num_batched_tokens=16, long_prefill_token_threshold=6
)
STAGE5_SWAP_BLOCKS = 16  # the CPU swap pool of the swap run: room for two victims at once
STAGE5_SWAP_STEP = 20  # in the swap run, two requests are swapped out after this step


def stage5_workload() -> tuple[list[str], list[SamplingParams]]:
    """The six prompts and greedy params of the stage-5 figures (and notebook 05); ignore_eos fixes the lengths."""
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in STAGE5_MAX_TOKENS]
    return list(STAGE5_PROMPTS), params


@dataclass(frozen=True)
class ScheduleRun:
    """A stage-5 run with what its schedule figures need."""

    trace: list[StepTrace]  # llm.engine.trace
    prompt_lens: dict[str, int]  # request_id -> prompt tokens (tells a one-token chunk from a decode)
    preemption_mode: str  # "recompute" | "swap"


@functools.cache
def stage5_run(preemption_mode: str = "recompute") -> ScheduleRun:
    """The stage-5 workload on a traced stage-5 engine with STAGE5_POOL, preempting by `preemption_mode`."""
    swap = STAGE5_SWAP_BLOCKS if preemption_mode == "swap" else 0
    llm = LLM(stage=5, record_trace=True, preemption_mode=preemption_mode, num_swap_blocks=swap, **STAGE5_POOL)
    outputs = llm.generate(*stage5_workload(), use_tqdm=False)
    return ScheduleRun(llm.engine.trace, viz.prompt_lens_of(outputs), preemption_mode)


def fig_05_gantt(out_dir: Path) -> Path:
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.4), sharex=True)
    for ax, mode in zip(axes, ("recompute", "swap")):
        run = stage5_run(mode)
        title = f"preemption_mode={mode!r}"
        viz.plot_schedule_gantt(run.trace, run.prompt_lens, run.preemption_mode, ax=ax, title=title)
    axes[0].set_xlabel("")
    fig.tight_layout()
    return _save(fig, out_dir / "05_gantt.png")


def fig_05_tokens_per_step(out_dir: Path) -> Path:
    run = stage5_run()
    fig = viz.plot_tokens_per_step(run.trace, STAGE5_POOL["max_num_batched_tokens"], run.prompt_lens)
    return _save(fig, out_dir / "05_tokens_per_step.png")


@functools.cache
def swap_tables_run() -> tuple[StepTrace, dict[str, list[int]], set[int]]:
    """The swap run stopped after STAGE5_SWAP_STEP steps: (its last step, the swap pool's blocks, cached blocks)."""
    llm = LLM(stage=5, record_trace=True, preemption_mode="swap", num_swap_blocks=STAGE5_SWAP_BLOCKS, **STAGE5_POOL)
    for i, (prompt, params) in enumerate(zip(*stage5_workload())):
        llm.engine.add_request(str(i), prompt, params)
    for _ in range(STAGE5_SWAP_STEP):
        llm.engine.step()
    kv = llm.engine.kv_manager
    return llm.engine.trace[-1], viz.swapped_block_ids(kv), viz.cached_block_ids(kv.pool)


def fig_05_swap_block_tables(out_dir: Path) -> Path:
    step, swapped, cached = swap_tables_run()
    order = [str(i) for i in range(len(STAGE5_PROMPTS))]
    pool = STAGE5_POOL
    fig = viz.plot_block_tables(
        step,
        pool["num_kv_blocks"],
        pool["block_size"],
        order=order,
        arrows_for=[],
        cached=cached,
        swapped=swapped,
        num_swap_blocks=STAGE5_SWAP_BLOCKS,
    )
    return _save(fig, out_dir / "05_swap_block_tables.png")


# Static (stage 4) vs continuous (stage 5) batching: the stage-1 workload, the same pool, max_num_seqs=4.
STATIC_VS_CONTINUOUS_POOL = dict(block_size=16, num_kv_blocks=16, max_num_seqs=4)


@functools.cache
def batching_run(stage: int) -> TracedRun:
    """The stage-1 workload at `stage` (4: static, 5: continuous) with STATIC_VS_CONTINUOUS_POOL."""
    llm = LLM(stage=stage, record_trace=True, **STATIC_VS_CONTINUOUS_POOL)
    llm.generate(*stage1_workload(), use_tqdm=False)
    return TracedRun.of(llm)


def fig_05_static_vs_continuous(out_dir: Path) -> Path:
    fig, axes = plt.subplots(4, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1, 3, 1]})
    runs = {stage: batching_run(stage) for stage in (4, 5)}
    for (stage, run), pair in zip(runs.items(), (axes[:2], axes[2:])):
        title = f"stage {stage} ({'static' if stage == 4 else 'continuous'}), {len(run.trace)} steps"
        viz.plot_pool_occupancy(run.trace, run.num_kv_blocks, axes=pair, title=title)
    axes[1].set_xlabel("")
    for ax in (axes[1], axes[3]):
        ax.set_ylim(0, 1.2 * STATIC_VS_CONTINUOUS_POOL["max_num_seqs"])  # one scale for "running" in both
    axes[-1].set_xlim(0.5, max(len(run.trace) for run in runs.values()) + 0.5)  # both runs on one step axis
    fig.tight_layout()
    return _save(fig, out_dir / "05_static_vs_continuous.png")
