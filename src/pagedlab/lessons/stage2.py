"""Stage 2: the figures of paged KV blocks: block tables into one pool, and stage 1 vs 2 in the same memory.

Builds on: lessons/stage1.py (the stage-1 workload and its prompts), lessons/common.py, viz/.
Read with: chapters/02-paged-blocks.md.

The comparison runs 16 speakers in the same small pool at stages 1 and 2 (regions of 16 blocks, 4 of them).
"""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib.pyplot as plt

from pagedlab import viz
from pagedlab.lessons.common import TracedRun, _save
from pagedlab.lessons.stage1 import STAGE1_MAX_TOKENS, STAGE1_PROMPTS, stage1_workload
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams

STAGE2_PROMPTS = STAGE1_PROMPTS + (
    "GLOUCESTER:",
    "DUKE VINCENTIO:",
    "PETRUCHIO:",
    "ISABELLA:",
    "BRUTUS:",
    "KATHARINA:",
    "LEONTES:",
    "MIRANDA:",
)
STAGE2_MAX_TOKENS = STAGE1_MAX_TOKENS + (56, 40, 72, 24, 88, 32, 48, 64)
STAGE2_POOL = dict(block_size=16, num_kv_blocks=64, max_model_len=256, max_num_seqs=16)


def stage2_workload() -> tuple[list[str], list[SamplingParams]]:
    """The 16 prompts and greedy params of the stage-1 vs stage-2 comparison (figure 02 and notebook 02)."""
    return list(STAGE2_PROMPTS), [SamplingParams(max_tokens=m, temperature=0.0) for m in STAGE2_MAX_TOKENS]


@functools.cache
def stage2_block_table_run() -> TracedRun:
    """The stage-1 workload at stage 2 in a pool of 40 blocks of 8: the second batch reuses freed blocks."""
    llm = LLM(stage=2, max_num_seqs=4, block_size=8, num_kv_blocks=40, record_trace=True)
    llm.generate(*stage1_workload(), use_tqdm=False)
    return TracedRun.of(llm)


@functools.cache
def pool_comparison_run(stage: int) -> TracedRun:
    """The 16-speaker workload at `stage` with STAGE2_POOL: the same prompts and the same KV memory."""
    llm = LLM(stage=stage, record_trace=True, **STAGE2_POOL)
    llm.generate(*stage2_workload(), use_tqdm=False)
    return TracedRun.of(llm)


def fig_02_block_tables(out_dir: Path) -> Path:
    run = stage2_block_table_run()
    step = [s for s in run.trace if len(s.running) == 4][-1]  # second batch, blocks from finished requests reused
    fig = viz.plot_block_tables(step, run.num_kv_blocks, run.block_size, order=viz.request_order(run.trace))
    return _save(fig, out_dir / "02_block_tables.png")


def fig_02_pool_occupancy(out_dir: Path) -> Path:
    fig, axes = plt.subplots(4, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1, 3, 1]})
    runs = {stage: pool_comparison_run(stage) for stage in (1, 2)}
    for (stage, run), pair in zip(runs.items(), (axes[:2], axes[2:])):
        title = f"stage {stage} ({'contiguous' if stage == 1 else 'paged'})"
        viz.plot_pool_occupancy(run.trace, run.num_kv_blocks, axes=pair, title=title)
    axes[1].set_xlabel("")
    top = max(axes[1].get_ylim()[1], axes[3].get_ylim()[1])
    axes[1].set_ylim(0, top)  # one scale for "running" in both panels
    axes[3].set_ylim(0, top)
    axes[-1].set_xlim(0.5, max(len(run.trace) for run in runs.values()) + 0.5)  # both runs on one step axis
    fig.tight_layout()
    return _save(fig, out_dir / "02_pool_occupancy.png")
