"""Stage 1: `pagedlab figures`, every figure of figures/ regenerated from a seeded run of the bundled model.

Builds on: lessons/common.py (DPI, TracedRun, the savers) and one module per stage, lessons/stage1.py to
lessons/stage5.py (each stage's workload, runs and figures), lessons/stage6.py (the Triton kernels) and
lessons/stage7.py (a real model), drawn by viz/ and viz/graphs.py.
Read with: chapters/01-contiguous-static.md to chapters/07-real-model.md.

Figures are never drawn by hand (chapters/97-architecture.md, Layout). Each figure is one function
`(out_dir) -> Path` listed in FIGURES (or `-> (figure, its rows as JSON)`, for one drawn from a measurement);
a later stage appends its own. The workload is greedy, so the same code gives the same pictures on every
machine. A figure drawn by graphviz raises graphs.DotNotFound where `dot` is not installed: make_figures skips
it and names every skipped figure in one line on stderr, with how to install `dot`. Likewise a figure of
chapter 7 raises stage7.ModelNotFetched before `pagedlab fetch smollm2`, and a figure of chapter 6 raises
stage6.TritonCannotRun where Triton cannot run the kernels: skipped, and named in one line each.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pagedlab.lessons.hybrid import fig_02_hybrid_tables
from pagedlab.lessons.stage1 import fig_01_batch_timeline, fig_01_kv_over_steps, fig_01_reserved_vs_used
from pagedlab.lessons.stage2 import fig_02_block_tables, fig_02_pool_occupancy
from pagedlab.lessons.stage3 import fig_03_beam_tree, fig_03_cow_before_after
from pagedlab.lessons.stage4 import fig_04_block_tables_hits, fig_04_hash_chain
from pagedlab.lessons.stage5 import (
    fig_05_gantt,
    fig_05_static_vs_continuous,
    fig_05_swap_block_tables,
    fig_05_tokens_per_step,
)
from pagedlab.lessons.stage6 import TritonCannotRun, fig_06_decode_programs, fig_06_parity
from pagedlab.lessons.stage6 import skipped_line as triton_missing_line
from pagedlab.lessons.stage7 import (
    ModelNotFetched,
    fig_07_kv_per_token,
    fig_07_preemption,
    fig_07_second_turn,
    fig_07_shared_prefix,
)
from pagedlab.lessons.stage7 import skipped_line as model_missing_line
from pagedlab.lessons.window import fig_02_sliding_window
from pagedlab.viz import graphs

FIGURES = [
    fig_01_reserved_vs_used,
    fig_01_kv_over_steps,
    fig_01_batch_timeline,
    fig_02_block_tables,
    fig_02_pool_occupancy,
    fig_02_sliding_window,
    fig_02_hybrid_tables,
    fig_03_cow_before_after,
    fig_03_beam_tree,
    fig_04_hash_chain,
    fig_04_block_tables_hits,
    fig_05_gantt,
    fig_05_tokens_per_step,
    fig_05_swap_block_tables,
    fig_05_static_vs_continuous,
    fig_06_decode_programs,
    fig_06_parity,
    fig_07_kv_per_token,
    fig_07_shared_prefix,
    fig_07_second_turn,
    fig_07_preemption,
]


def make_figures(out_dir: str | Path = "figures") -> list[Path]:
    """Write every figure in FIGURES to out_dir; returns the paths written (a figure's JSON rows after it), in order.

    Without graphviz's `dot`, the figures it draws are skipped: one line on stderr names them all. Without the
    fetched SmolLM2, so are chapter 7's, in a line of their own; where Triton cannot run, so are chapter 6's.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, skipped, unfetched, no_triton = [], [], [], []
    for make in FIGURES:
        try:
            made = make(out)
            written += [made] if isinstance(made, Path) else list(made)
        except graphs.DotNotFound as e:
            skipped.append(e.path)
        except ModelNotFetched as e:
            unfetched.append(e.path)
        except TritonCannotRun as e:
            no_triton.append(e)
    if skipped:
        print(graphs.dot_missing_line(skipped), file=sys.stderr)
    if unfetched:
        print(model_missing_line(unfetched), file=sys.stderr)
    if no_triton:
        print(triton_missing_line([e.path for e in no_triton], no_triton[0].reason), file=sys.stderr)
    return written
