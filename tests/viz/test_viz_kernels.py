"""Stage 6: the kernel figures (viz/kernels.py) draw the launcher's own numbers (lessons/kernels.py), and the
parity they plot holds.

The decode figure is drawn from a dry launch of paged_decode (nothing runs); the parity rows run the kernels under
Triton's interpreter, so the tests here take the smallest subset of cases.
"""

from __future__ import annotations

import json
import math

import pytest
from matplotlib.figure import Figure

from tests.conftest import need_triton

pytestmark = pytest.mark.stage6

PNG = b"\x89PNG\r\n\x1a\n"


def texts(fig: Figure) -> list[str]:
    """Every string drawn in the figure: axes texts, titles and the suptitle."""
    found = [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title(loc="left") for ax in fig.axes]
    return found + [fig.get_suptitle()]


def test_the_plan_is_what_the_launcher_launches():
    need_triton()
    from pagedlab.attention.triton import decode
    from pagedlab.lessons.kernels import DECODE_KERNELS, demo_case, launch_plan

    kernels = {name: getattr(decode, name) for name in DECODE_KERNELS}
    plan = launch_plan()  # notebook 06's case: 3 requests, 4 query heads over 2 KV heads, blocks of 16
    assert plan.block_table == demo_case().block_table.tolist() == [[4, 3, 6], [8, 2, 1], [9, 5, 7]]
    assert plan.seq_lens == [37, 16, 5] and plan.num_blocks == 10
    assert plan.v1.grid == (3, 4) and plan.reduce.grid == (3, 4)  # one program per (request, query head)
    assert plan.v2.grid == (3, 4, math.ceil(37 / 16)) == (3, 4, 3)  # ... per partition of the longest context
    assert [plan.active_parts(b) for b in range(3)] == [3, 1, 1]
    assert (plan.const("BLOCK_SIZE"), plan.const("BLOCK_N"), plan.const("QUERIES_PER_KV")) == (16, 16, 2)
    assert plan.v2.shapes[:3] == ((3, 4, 3, 32), (3, 4, 3), (3, 4, 3))  # tmp_out, max, sum: the scratch
    assert plan.picks_v1 is decode.use_v1(37, 3, 4, 16) is False
    assert {name: getattr(decode, name) for name in DECODE_KERNELS} == kernels  # the real ones are back


def test_the_decode_figure_shows_three_partitions_and_use_v1s_choice():
    need_triton()
    from pagedlab.lessons.kernels import launch_plan
    from pagedlab.viz.kernels import draw_decode_programs

    fig = draw_decode_programs(launch_plan())
    drawn = texts(fig)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert [t for t in drawn if t.startswith("part ")] == ["part 0: p 0-15", "part 1: p 16-31", "part 2: p 32-36"]
    assert [t for t in drawn if t.startswith("program (0, 3, ")] == [f"program (0, 3, {p})" for p in range(3)]
    assert "is False: paged_decode runs V2 for it" in drawn[-1]
    assert any("tile 2: p 32-47 -> block_table[0][2] = 6" in t for t in drawn)  # the walk of program (0, 3)
    assert any(t.startswith("grid = (3, 4, 3)") for t in drawn) and any(t.startswith("grid = (3, 4):") for t in drawn)


def test_one_partition_is_v1s_case_and_the_figure_follows():
    need_triton()
    from pagedlab.lessons.kernels import launch_plan
    from pagedlab.viz.kernels import draw_decode_programs

    plan = launch_plan(partition_size=64)  # 37 tokens fit in one partition: use_v1 says V1
    assert plan.picks_v1 and plan.v2.grid == (3, 4, 1)
    drawn = texts(draw_decode_programs(plan))
    assert "is True: paged_decode runs V1 for it" in drawn[-1]
    assert [t for t in drawn if t.startswith("part ")] == ["part 0: p 0-36"]


def test_every_parity_row_is_within_its_tolerance():
    need_triton()
    from pagedlab.lessons.kernels import KERNELS, parity_rows
    from pagedlab.viz.kernels import draw_parity

    subset = dict(block_sizes=(16,), heads=((4, 1),), dtypes=("float16",), store_dtypes=("bfloat16",))
    rows = parity_rows(**subset)  # one case per kernel
    fig = draw_parity(rows)
    assert isinstance(fig, Figure)
    assert [(r["kernel"], r["version"]) for r in rows] == [
        ("store_kv", None), ("paged_decode", "v1"), ("paged_decode", "v2"), ("paged_prefill", None)
    ]  # fmt: skip
    assert len(rows) == len(KERNELS)
    for r in rows:
        assert set(r) >= {"kernel", "version", "block_size", "heads", "dtype", "max_abs_err", "tol"}
        assert r["max_abs_err"] <= r["tol"], r
    assert rows[0]["max_abs_err"] == 0.0 and rows[0]["tol"] == 0.0  # store_kv copies: bit-exact
    assert all(r["tol"] == 2e-3 and r["heads"] == "4/1" for r in rows[1:])


def test_the_figures_are_saved_as_png_and_the_parity_rows_beside(tmp_path, monkeypatch):
    need_triton()
    from pagedlab.lessons import stage6

    real = stage6.parity_rows
    monkeypatch.setattr(stage6, "parity_rows", lambda: real(kernels=("store_kv",), block_sizes=(16,)))
    png, rows = stage6.fig_06_parity(tmp_path)
    assert (png, rows) == (tmp_path / "06_parity.png", tmp_path / "06_parity.json")
    assert png.read_bytes()[:8] == PNG
    assert [r["dtype"] for r in json.loads(rows.read_text())] == ["float32", "float16", "bfloat16"]
    path = stage6.fig_06_decode_programs(tmp_path)
    assert path == tmp_path / "06_decode_programs.png" and path.read_bytes()[:8] == PNG


def test_without_triton_the_figure_is_skipped_with_the_reason(tmp_path, monkeypatch):
    from pagedlab.lessons import kernels, stage6

    def refuse():
        raise kernels.KernelsUnavailable("kernel: triton is not installed")

    monkeypatch.setattr(kernels, "kernel_device", refuse)
    with pytest.raises(stage6.TritonCannotRun) as caught:
        stage6.fig_06_decode_programs(tmp_path)
    assert caught.value.path == tmp_path / "06_decode_programs.png" and not caught.value.path.exists()
    assert str(caught.value) == f"kernel: triton is not installed: skipped {caught.value.path}"
