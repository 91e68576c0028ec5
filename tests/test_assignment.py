"""Course assignments: regions are well formed; student copies fail with the task's message; grading works."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import pagedlab
from pagedlab.tools import assignment

SRC = Path(pagedlab.__file__).parent

# A smoke subset of each stage's own tests: enough to see every kind of stub fail, fast enough for CI.
SMOKE = {
    1: "test_regions_are_reserved_whole_and_first_fit or test_a_static_batch_runs_to_completion",
    2: "test_pool_story_allocate_free_reuse or test_blocks_come_one_at_a_time",
    3: "test_fork_shares_then_append_copies or test_n_children_share_the_prompt",
    4: "test_full_blocks_are_cached_kept_after_free or test_salted_requests_do_not_share",
    5: "test_prefill_is_chunked_by_the_budget or test_swap_preemption_keeps_progress",
    6: "test_paged_decode_matches_torch and v1-dtype0-2-2-16",
}


def test_every_region_is_well_formed_and_every_stage_has_one():
    regions = assignment.find_regions(SRC)
    assert {r.stage for r in regions} == {1, 2, 3, 4, 5, 6}
    for r in regions:
        assert r.task and len(r.task) > 20, f"{r.label}: a task hint should say what to implement"
    for path in {r.path for r in regions}:  # every student copy still parses
        ast.parse(assignment.stub_source(path.read_text(), [r for r in regions if r.path == path]))


def test_a_malformed_region_is_reported(tmp_path):
    (tmp_path / "bad.py").write_text('"""Stage 2: x."""\n# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n')
    with pytest.raises(ValueError, match="bad.py:3: a region must start with a '# TASK: ...' line"):
        assignment.find_regions(tmp_path)
    (tmp_path / "bad.py").write_text('"""Stage 2: x."""\n# BEGIN SOLUTION\n# TASK: t\nx = 1\n')
    with pytest.raises(ValueError, match="without # END SOLUTION"):
        assignment.find_regions(tmp_path)


def test_stubs_keep_signatures_and_docstrings():
    src = (
        '"""Stage 2: x."""\nclass A:\n    # BEGIN SOLUTION\n    # TASK: do it well\n    def f(self, n: int) -> int:\n'
        '        """Doc."""\n        return n + 1\n    # END SOLUTION\n'
    )
    (region,) = [assignment._region(Path("x.py"), 2, src.splitlines(), 2, 7)]
    out = assignment.stub_source(src, [region])
    ns: dict = {}
    exec(compile(out, "x.py", "exec"), ns)
    assert ns["A"].f.__doc__ == "Doc."
    with pytest.raises(NotImplementedError, match="TASK: do it well"):
        ns["A"]().f(1)


def test_make_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="exists and is not empty"):
        assignment.make(2, tmp_path)


@pytest.mark.parametrize("stage", [1, 2, 3, 4, 5, 6])
def test_student_copies_fail_with_the_task_and_the_reference_scores_full_marks(stage, tmp_path):
    student = assignment.make(stage, tmp_path / "student")
    spec = json.loads((student / "assignment.json").read_text())
    assert spec["stage"] == stage and spec["tasks"]
    assert (student / "HANDOUT.md").read_text().startswith(f"# pagedlab assignment: stage {stage}")
    result = assignment.grade(student, pytest_args=["-k", SMOKE[stage]])
    assert result["max_score"] > 0 and result["score"] < result["max_score"]
    outputs = " ".join(t["output"] for t in result["tests"])
    assert "NotImplementedError" in outputs and "TASK:" in outputs
    if stage > 1:  # earlier stages keep their solutions: their smoke tests pass in the student copy
        env = assignment._grading_env(student)
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                f"stage{stage - 1}",
                "-k",
                SMOKE[stage - 1],
                "tests",
            ],
            cwd=student,
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stdout[-2000:]
    teacher = assignment.make(stage, tmp_path / "teacher", with_solutions=True)
    full = assignment.grade(teacher, pytest_args=["-k", SMOKE[stage]])
    assert full["score"] == full["max_score"] > 0, full


def test_grading_refuses_a_folder_that_is_not_a_workspace(tmp_path):
    with pytest.raises(ValueError, match="not an assignment workspace"):
        assignment.grade(tmp_path)
