"""Stage 1: what every figure module shares: the resolution, a traced run's record and the savers.

Builds on: engine/stats.py (StepTrace).
Read with: chapters/01-contiguous-static.md.

One DPI for matplotlib and graphviz alike, so that the PNGs of figures/ sit side by side at one scale.
A figure drawn by graphviz raises graphs.DotNotFound when `dot` is not on PATH, before it writes anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pagedlab import viz
from pagedlab.engine.stats import StepTrace
from pagedlab.viz import graphs

DPI = 120


@dataclass(frozen=True)
class TracedRun:
    """What a figure needs from one engine run."""

    trace: list[StepTrace]  # llm.engine.trace
    num_kv_blocks: int  # pool capacity in blocks
    block_size: int  # tokens per block

    @classmethod
    def of(cls, llm) -> TracedRun:
        """What an LLM built with record_trace=True recorded, and its pool."""
        return cls(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


def _save(fig, path: Path) -> Path:
    return viz.save_figure(fig, path, dpi=DPI, tight=False)  # the lessons lay out their own margins


def _save_graph(graph, path: Path) -> Path:
    """Render with `dot`; without it, raise graphs.DotNotFound (make_figures names every skipped figure at once)."""
    graphs.require_dot(path)
    return graphs.save_graph(graph, path, dpi=DPI)
