"""Stage 1: `pagedlab figures`, every figure of figures/ regenerated from a seeded run of the bundled model.

Builds on: llm.py (a traced engine), viz.py (the drawings).
Read with: chapters/01-contiguous-static.md, chapters/02-paged-blocks.md.

Figures are never drawn by hand (DESIGN §1). Each figure is one function
`(out_dir) -> Path` listed in FIGURES; a later stage appends its own. The
workload is greedy, so the same code gives the same pictures on every machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from pagedlab import viz
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams
from pagedlab.stats import StepTrace

DPI = 120

# Eight speakers with different output lengths: with max_num_seqs=4, two static batches of four.
STAGE1_PROMPTS = (
    "ROMEO:",
    "JULIET:",
    "HAMLET:",
    "First Citizen:",
    "KING RICHARD III:",
    "MENENIUS:",
    "LADY MACBETH:",
    "PROSPERO:",
)
STAGE1_MAX_TOKENS = (24, 64, 40, 96, 32, 80, 48, 16)


@dataclass(frozen=True)
class TracedRun:
    """What a figure needs from one engine run."""

    trace: list[StepTrace]  # llm.engine.trace
    num_kv_blocks: int  # pool capacity in blocks
    block_size: int  # tokens per block


def stage1_workload() -> tuple[list[str], list[SamplingParams]]:
    """The prompts and per-prompt greedy params that every stage-1 figure (and notebook 01) runs."""
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=False) for m in STAGE1_MAX_TOKENS]
    return list(STAGE1_PROMPTS), params


@functools.cache
def stage1_run() -> TracedRun:
    """Stage 1 (contiguous KV + static batching) on the stage-1 workload; run once per process."""
    llm = LLM(stage=1, max_num_seqs=4, block_size=16, record_trace=True)
    llm.generate(*stage1_workload(), use_tqdm=False)
    return TracedRun(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def fig_01_reserved_vs_used(out_dir: Path) -> Path:
    title = "Reserved vs used KV slots per request under static batching (stage 1)"
    return _save(viz.plot_reserved_vs_used(stage1_run().trace, title), out_dir / "01_reserved_vs_used.png")


def fig_01_kv_over_steps(out_dir: Path) -> Path:
    run = stage1_run()
    fig = viz.plot_kv_over_steps(run.trace, run.num_kv_blocks, run.block_size)
    return _save(fig, out_dir / "01_kv_over_steps.png")


def fig_01_batch_timeline(out_dir: Path) -> Path:
    return _save(viz.plot_batch_timeline(stage1_run().trace), out_dir / "01_batch_timeline.png")


# Stage 2's comparison: 16 speakers in the same small pool at stages 1 and 2 (regions of 16 blocks, 4 of them).
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
    return TracedRun(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


@functools.cache
def pool_comparison_run(stage: int) -> TracedRun:
    """The 16-speaker workload at `stage` with STAGE2_POOL: the same prompts and the same KV memory."""
    llm = LLM(stage=stage, record_trace=True, **STAGE2_POOL)
    llm.generate(*stage2_workload(), use_tqdm=False)
    return TracedRun(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


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


FIGURES = [
    fig_01_reserved_vs_used,
    fig_01_kv_over_steps,
    fig_01_batch_timeline,
    fig_02_block_tables,
    fig_02_pool_occupancy,
]


def make_figures(out_dir: str | Path = "figures") -> list[Path]:
    """Write every figure in FIGURES to out_dir; returns their paths in order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [make(out) for make in FIGURES]
