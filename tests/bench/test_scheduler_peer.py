"""`pagedlab bench scheduler --peer vllm`: vLLM 0.33.0's own Scheduler timed on the same loop as ours, in its own
environment, taking turns size by size. Needs `pagedlab fetch vllm` (skipped without it, a failure in CI). No
test asserts a speed: the rows' shape, the turns and the ratio's arithmetic."""

import io

import pytest
from rich.console import Console as RichConsole

from pagedlab.bench.scheduler import peer_lines, peer_rows
from tests.conftest import need_vllm

pytestmark = [pytest.mark.stage5, pytest.mark.slow]


def Console():
    return RichConsole(file=io.StringIO(), width=120)


def test_both_schedulers_time_the_same_decodes_in_turns():
    need_vllm()
    rows = peer_rows(Console(), running=(4, 8), steps=3, rounds=2)
    assert [(r["system"], r["running"]) for r in rows] == [("pagedlab", 4), ("vllm", 4), ("pagedlab", 8), ("vllm", 8)]
    for row in rows:
        assert row["us_per_step"] > 0 and row["steps"] == 3 and row["rounds"] == 2
        assert row["us_per_request"] == pytest.approx(row["us_per_step"] / row["running"])
    for ours, theirs in zip(rows[::2], rows[1::2]):
        assert ours["pagedlab_vs_vllm"] == pytest.approx(ours["us_per_step"] / theirs["us_per_step"])
    lines = peer_lines(rows)
    assert len(lines) == 2 and "(no target here)" in lines[0]  # the target is read at 256 and 1024 running


def test_a_peer_other_than_vllm_is_a_mistake():
    from pagedlab.bench.scheduler import measure_scheduler

    with pytest.raises(ValueError, match="--peer: only 'vllm' is a peer"):
        measure_scheduler(Console(), peer="sglang")
