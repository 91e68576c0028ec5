"""Stage 1: the figures of contiguous KV and static batching, and the workload they run.

Builds on: lessons/common.py (TracedRun, the saver), llm.py (a traced engine), viz/ (the drawings).
Read with: chapters/01-contiguous-static.md.

Eight speakers with different output lengths: with max_num_seqs=4, two static batches of four. Later
stages reuse this workload (stage1_workload) to compare against stage 1 on the same prompts.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pagedlab import viz
from pagedlab.lessons.common import TracedRun, _save
from pagedlab.llm import LLM
from pagedlab.sampling_params import SamplingParams

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


def stage1_workload() -> tuple[list[str], list[SamplingParams]]:
    """The prompts and per-prompt greedy params that every stage-1 figure (and notebook 01) runs."""
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=False) for m in STAGE1_MAX_TOKENS]
    return list(STAGE1_PROMPTS), params


@functools.cache
def stage1_run() -> TracedRun:
    """Stage 1 (contiguous KV + static batching) on the stage-1 workload; run once per process."""
    llm = LLM(stage=1, max_num_seqs=4, block_size=16, record_trace=True)
    llm.generate(*stage1_workload(), use_tqdm=False)
    return TracedRun.of(llm)


def fig_01_reserved_vs_used(out_dir: Path) -> Path:
    title = "Reserved vs used KV slots per request under static batching (stage 1)"
    return _save(viz.plot_reserved_vs_used(stage1_run().trace, title), out_dir / "01_reserved_vs_used.png")


def fig_01_kv_over_steps(out_dir: Path) -> Path:
    run = stage1_run()
    fig = viz.plot_kv_over_steps(run.trace, run.num_kv_blocks, run.block_size)
    return _save(fig, out_dir / "01_kv_over_steps.png")


def fig_01_batch_timeline(out_dir: Path) -> Path:
    return _save(viz.plot_batch_timeline(stage1_run().trace), out_dir / "01_batch_timeline.png")
