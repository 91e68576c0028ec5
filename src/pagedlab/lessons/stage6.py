"""Stage 6: the figures of the Triton kernels: which program reads which blocks (V1, V2), and parity with torch.

Builds on: lessons/common.py (the saver), lessons/kernels.py (the dry launch, the parity cases), viz/kernels.py
(the drawings).
Read with: chapters/06-triton-kernel.md.

    06_decode_programs.png   notebook 06's decode step (seq_lens 37, 16, 5; 4 query heads over 2 KV heads)
                             as paged_decode launches it: V1's grid, block tables and pool; V2's partitions
    06_parity.png, .json     every kernel over the tests' parametrizations against the fp32 reference
                             (30 cases, about 10 s under TRITON_INTERPRET=1 on a quiet 2-core CPU)

Both need Triton, run compiled on a GPU or by its interpreter on a CPU (set here when no kernel module is imported
yet). Where it cannot run they raise TritonCannotRun before drawing anything, and make_figures names every figure
it skipped in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pagedlab.lessons.common import _save
from pagedlab.lessons.kernels import KernelsUnavailable, launch_plan, parity_rows
from pagedlab.viz.kernels import draw_decode_programs, draw_parity


class TritonCannotRun(Exception):
    """A figure of chapter 6 was asked for where Triton cannot run the kernels."""

    def __init__(self, path: str | Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(skipped_line([self.path], reason))


def skipped_line(paths, reason: str) -> str:
    """The one line make_figures prints for every figure skipped for want of Triton."""
    return f"{reason}: skipped {', '.join(str(p) for p in paths)}"


@contextmanager
def _needs_triton(path: Path) -> Iterator[None]:
    try:
        yield
    except KernelsUnavailable as e:
        raise TritonCannotRun(path, str(e)) from e


def fig_06_decode_programs(out_dir: Path) -> Path:
    path = out_dir / "06_decode_programs.png"
    with _needs_triton(path):
        fig = draw_decode_programs(launch_plan())  # notebook 06's case, both versions dry-launched
    return _save(fig, path)


def fig_06_parity(out_dir: Path) -> tuple[Path, Path]:
    """The parity figure and, beside it, the rows it was drawn from (the chapter quotes them)."""
    path = out_dir / "06_parity.png"
    with _needs_triton(path):
        rows = parity_rows()
        fig = draw_parity(rows)
    rows_path = path.with_suffix(".json")
    rows_path.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return _save(fig, path), rows_path
