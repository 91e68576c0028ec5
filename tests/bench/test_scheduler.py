"""`pagedlab bench scheduler`: the fake-model decode loop and its JSON rows (no timing thresholds: benches show
performance, tests never time it)."""

import contextlib
import io
import json

import pytest

from pagedlab import bench
from pagedlab.bench.scheduler import add_requests, fake_model, make_scheduler, scheduler_rows, time_decode_steps

pytestmark = pytest.mark.stage5


def test_the_fake_model_samples_only_for_requests_fed_to_their_end():
    # Budget 2 x 32: both prompts in one step; each then decodes one token per step and nobody is preempted.
    s = make_scheduler(2, steps=3)
    add_requests(s, 2, max_tokens=5)
    so = s.schedule()
    assert so.num_scheduled_tokens == {"r0": 32, "r1": 32}
    out = fake_model(so)
    assert out.req_ids == ["r0", "r1"] and out.token_ids == [7, 7]
    s.update(so, out)
    for _ in range(3):
        so = s.schedule()
        assert so.num_scheduled_tokens == {"r0": 1, "r1": 1}
        s.update(so, fake_model(so))
    assert [r.num_tokens for r in s.running] == [36, 36] and s.num_preemptions == 0


def test_prompts_are_distinct_so_nothing_hits_the_prefix_cache():
    s = make_scheduler(4, steps=2)
    add_requests(s, 4, max_tokens=4)
    so = s.schedule()
    assert list(so.num_scheduled_tokens.values()) == [32] * 4  # no request starts with computed (cached) tokens
    assert len({tuple(r.prompt_token_ids) for r in so.scheduled}) == 4


def test_each_timed_step_is_recorded():
    timings = time_decode_steps(8, steps=5)
    assert len(timings["schedule_ns"]) == len(timings["update_ns"]) == 5
    assert all(t > 0 for t in timings["schedule_ns"] + timings["update_ns"])


def test_rows_have_the_design_fields_and_positive_times():
    rows = scheduler_rows(running=(4, 16), steps=4)
    assert [r["running"] for r in rows] == [4, 16]
    for r in rows:
        assert r["us_per_step"] > 0 and r["us_schedule"] > 0 and r["us_update"] > 0
        assert r["us_per_request"] == pytest.approx(r["us_per_step"] / r["running"])


def test_json_stdout_is_one_object():
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        result = bench.run_bench("scheduler", as_json=True, running=(4, 8), steps=3)
    assert json.loads(stdout.getvalue()) == result and stdout.getvalue().count("\n") == 1
    assert result["bench"] == "scheduler"
    assert all({"running", "us_per_step"} <= row.keys() for row in result["rows"])
