"""The grader a course can trust: the score is decided outside the student's process, from plain data.

Every forging route a student tried (chapters/98-assignments.md, The boundary) runs here through the real CLI and
must score what an untouched copy scores; a body that reaches for the reference, the network or the parent's
files gets an error in the sandbox and scores 0; the tests are feedback, and an interrupted test is a failure.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pagedlab.course import assignment, feedback, gradescope, grading, messages, sandbox
from pagedlab.course.scenarios import TaskScenarios, run_case, stage_scenarios
from pagedlab.stages import STAGES
from tests.course import routes as R

NEEDS_BWRAP = os.environ.get("PAGEDLAB_REQUIRE_BWRAP") == "1"
UNTOUCHED = 0.0  # what an untouched stage-2 copy scores (test_untouched_copy_scores_zero_and_the_reference_full_marks)


@pytest.fixture(scope="module")
def handout(tmp_path_factory) -> Path:
    """An untouched stage-2 student copy (copied per test, so each test may forge its own)."""
    return assignment.make(2, tmp_path_factory.mktemp("handout") / "hw2")


@pytest.fixture
def workspace(handout, tmp_path) -> Path:
    return Path(shutil.copytree(handout, tmp_path / "hw2"))


def cli_grade(ws: Path, *extra: str, env=None) -> tuple[subprocess.CompletedProcess, dict]:
    """`pagedlab assignment grade WS --stage 2 --json` as a teacher runs it; (the run, Gradescope's results)."""
    out = ws.parent / "results.json"
    cmd = [sys.executable, "-m", "pagedlab", "assignment", "grade", str(ws), "--stage", "2", "--json", str(out)]
    run = subprocess.run([*cmd, "--seed", "7", *extra], capture_output=True, text=True, env=env, timeout=600)
    return run, json.loads(out.read_text())


def task_scores(results: dict) -> dict[str, float]:
    return {t["tags"][0]: t["score"] for t in results["tests"] if t["visibility"] == "visible"}


def assert_no_reference_text(run: subprocess.CompletedProcess, results: dict) -> None:
    """No line of code of the stage's reference bodies comes back, in the report or in results.json."""
    text = run.stdout + run.stderr + json.dumps(results)
    for task in ("free-queue", "pool-allocate-free", "allocate-slots", "slot-mapping", "paged-gather"):
        code = [line for line in R.code_lines(task) if len(line) > 25]
        assert code and not [line for line in code if line in text], task


def test_the_isolated_path_is_what_ci_tests():
    isolated, why = sandbox.isolation()
    if NEEDS_BWRAP:
        assert isolated, f"PAGEDLAB_REQUIRE_BWRAP=1 but the sandbox is not used: {why}"
    elif not isolated:
        pytest.skip(f"no sandbox here: {why}")


def test_untouched_copy_scores_zero_and_the_reference_full_marks(handout, tmp_path):
    untouched = grading.grade(handout, 2)
    assert untouched["score"] == UNTOUCHED and untouched["max_score"] == 100
    assert "not started: 5 tasks" in untouched["output"] and "free-queue " not in untouched["output"]
    teacher = assignment.make(2, tmp_path / "teacher", with_solutions=True)
    full = grading.grade(teacher, 2)
    assert full["score"] == full["max_score"] == 100, full["output"]
    assert [t["max_score"] for t in full["tests"]] == [20] * 5 and sum(t["max_score"] for t in full["tests"]) == 100


def test_the_first_issues_routes_score_what_an_untouched_copy_scores(workspace):
    """Full marks three ways (a match class pattern to gc, a pickle in np.load, str.format to the pipe and
    np.savetxt), the reference read with torch.from_file and raised as the message, a KeyboardInterrupt."""
    R.write_body(workspace, "free-queue", R.with_prelude("free-queue", "popleft", R.MATCH_CLASS, keep_rest=False))
    R.write_body(workspace, "pool-allocate-free", R.with_prelude("pool-allocate-free", "allocate", R.NP_LOAD, False))
    forged = R.with_prelude("allocate-slots", "allocate_slots", R.FORMAT_SAVETXT, False)
    R.write_body(workspace, "allocate-slots", forged)
    R.write_body(workspace, "slot-mapping", R.with_prelude("slot-mapping", "slot_mapping", R.FROM_FILE, False))
    interrupt = R.with_prelude("paged-gather", "context_slots", R.KEYBOARD_INTERRUPT, False)
    R.write_body(workspace, "paged-gather", interrupt)
    run, results = cli_grade(workspace, "--no-feedback")
    assert run.returncode == 1 and set(task_scores(results).values()) == {UNTOUCHED}, run.stderr
    assert results["score"] == UNTOUCHED
    assert "raised KeyboardInterrupt" in run.stderr  # (np.savetxt's /dev/fd/N: the child's own uid may not reopen it)
    assert_no_reference_text(run, results)


def test_interrupts_exits_hangs_and_pickles_in_a_body_score_nothing_and_fail_their_tests(workspace):
    """pytest.exit, os._exit, a loop that eats the alarm, torch.load of a pickle, a hang; the tests (feedback) of an
    interrupted body are failures, never passes."""
    R.write_body(workspace, "free-queue", R.with_prelude("free-queue", "popleft", R.PYTEST_EXIT, False))
    R.write_body(workspace, "pool-allocate-free", R.with_prelude("pool-allocate-free", "allocate", R.OS_EXIT, False))
    eater = R.with_prelude("allocate-slots", "allocate_slots", R.EAT_THE_ALARM, False)
    R.write_body(workspace, "allocate-slots", eater)
    R.write_body(workspace, "slot-mapping", R.with_prelude("slot-mapping", "slot_mapping", R.TORCH_LOAD, False))
    R.write_body(workspace, "paged-gather", R.with_prelude("paged-gather", "context_slots", R.HANG, False))
    run, results = cli_grade(workspace, "--timeout", "2")
    assert set(task_scores(results).values()) == {UNTOUCHED}, run.stderr
    assert "the process ended during this case" in run.stderr and "killed: it ran past" in run.stderr
    assert "raised CaseTimeout" in run.stderr
    assert "Exit: the test was interrupted" in run.stderr  # pytest.exit in a test: failed, not passed
    assert_no_reference_text(run, results)


def test_a_body_that_reaches_for_the_reference_the_network_or_the_parents_files_gets_an_error(workspace):
    """Each body is the reference's, after a first line that opens the teacher's file, connects to a port this test
    listens on, opens a file of the workspace, or runs `cat` on the teacher's file: in the sandbox each gets an
    error and its task scores 0, while an honest body beside them scores its points."""
    if not sandbox.isolation()[0]:
        pytest.skip("the boundary under test is the sandbox's")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        R.write_body(workspace, "free-queue", R.with_prelude("free-queue", None, R.open_file(R.BLOCK_POOL)))
        R.write_body(workspace, "slot-mapping", R.with_prelude("slot-mapping", None, R.connect(port)))
        R.write_body(workspace, "paged-gather", R.with_prelude("paged-gather", None, R.SUBPROCESS))
        parents = R.with_prelude("pool-allocate-free", None, R.open_file(workspace / "assignment.json"))
        R.write_body(workspace, "pool-allocate-free", parents)
        R.write_body(workspace, "allocate-slots", R.reference_body("allocate-slots"))
        run, results = cli_grade(workspace, "--no-feedback")
    assert task_scores(results) == {"allocate-slots": 20, "free-queue": 0, "pool-allocate-free": 0,
                                    "paged-gather": 0, "slot-mapping": 0}, run.stderr  # fmt: skip
    # (pool-allocate-free's tree holds the free queue's reference, so its report names no value of the student's)
    for error in ("FileNotFoundError", "ConnectionRefusedError", "CalledProcessError"):
        assert error in run.stderr


def test_the_previous_issues_seven_routes_outside_the_regions_change_nothing(workspace):
    R.forge_outside_the_regions(workspace)
    run, results = cli_grade(workspace, "--no-feedback")
    assert results["score"] == UNTOUCHED, run.stderr
    R.write_body(workspace, "free-queue", R.reference_body("free-queue"))  # one honest task: exactly its points
    run, results = cli_grade(workspace, "--no-feedback")
    assert task_scores(results)["free-queue"] == 20 and results["score"] == 20, run.stderr
    for note in ("kv/block_pool.py: changes outside the task regions are ignored", "src/sitecustomize.py: not in",
                 "src/pagedlab/__init__.py: changed", "src/conftest.py: not in the reference"):  # fmt: skip
        assert note in run.stderr


def test_the_report_gives_each_task_its_score_first_failure_and_first_failing_test(workspace):
    """A free queue that pops from the tail: its block names the case that differs and the test that says why; the
    tasks not started fold into one line."""
    body = "\n".join(R.reference_body("free-queue"))
    body = body.replace("block = self.head.next_free_block", "block = self.tail.prev_free_block")
    body = body.replace("if block is self.tail:", "if block is self.head:")
    R.write_body(workspace, "free-queue", body.splitlines())
    result = grading.grade(workspace, 2, seed=3)
    text = result["output"]
    assert "not started: 4 tasks" in text, text
    block = text.split("free-queue", 1)[1]
    assert 'pops_from_the_head_and_appends_at_the_tail: op 1 ("popleft")' in block
    assert "test tests/kv/test_block_pool.py::test_queue_pops_from_the_head_and_appends_at_the_tail" in block
    assert "assert" in block.split("test tests/kv/test_block_pool.py", 1)[1].splitlines()[0]
    (row,) = [t for t in result["tasks"] if t["id"] == "free-queue"]
    assert row["score"] < 20 and row["passed"] < row["cases"] and 0 < row["visible"][0] < row["visible"][1]


def test_without_bwrap_grading_runs_and_says_so_in_one_line(tmp_path):
    """The fallback: a plain process (numpy and torch still import from the install), one line in the report."""
    teacher = assignment.make(2, tmp_path / "teacher", with_solutions=True)
    out = tmp_path / "results.json"
    env = dict(os.environ, PAGEDLAB_GRADER_SANDBOX="none")
    cmd = [sys.executable, "-m", "pagedlab", "assignment", "grade", str(teacher), "--stage", "2", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    results = json.loads(out.read_text())
    assert results["score"] == 100 and run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if "without isolation" in line]
    assert len(warnings) == 1 and "PAGEDLAB_GRADER_SANDBOX=none" in warnings[0]
    assert "without isolation" in results["output"]


# -- hidden tests, the tests as feedback ---------------------------------------------------------------------------

HIDDEN = """
import os, time
import pytest
from pagedlab.kv.block_pool import FreeKVCacheBlockQueue

pytestmark = pytest.mark.task("free-queue")

def test_passes():
    assert FreeKVCacheBlockQueue

def test_hangs():
    while True:
        time.sleep(0.05)

def test_interrupts():
    raise KeyboardInterrupt

def test_after_the_interrupt():
    pass
"""


def test_a_hidden_test_file_that_tags_no_task_is_an_error_naming_it(handout, tmp_path):
    (tmp_path / "test_good.py").write_text("import pytest\npytestmark = pytest.mark.task('free-queue')\n")
    (tmp_path / "test_forgotten.py").write_text("def test_x():\n    assert True\n")
    with pytest.raises(ValueError, match="test_forgotten.py tags no task"):
        grading.grade(handout, 2, extra_tests=tmp_path)
    with pytest.raises(ValueError, match="test_forgotten.py tags no task"):
        assignment.check_stages([2], extra_tests=tmp_path)
    (tmp_path / "test_forgotten.py").write_text("import pytest\n@pytest.mark.task('lookup')\ndef test_x():\n    pass\n")
    with pytest.raises(ValueError, match=r"test_forgotten.py tags \['lookup'\], not tasks of this stage"):
        feedback.check_hidden_tests(tmp_path, ["free-queue"])


def test_hidden_tests_are_feedback_after_publication_and_an_interrupt_is_a_failure(tmp_path):
    teacher = assignment.make(2, tmp_path / "teacher", with_solutions=True)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_hidden.py").write_text(HIDDEN)
    result = grading.grade(teacher, 2, extra_tests=hidden, per_test_timeout=5)
    assert result["score"] == 100, result["output"]  # hidden tests never set the score
    got = {t["name"].split("::")[-1]: t for t in result["tests"] if t["visibility"] == "after_published"}
    assert got["test_passes"]["status"] == "passed" and got["test_passes"]["max_score"] == 0
    assert got["test_hangs"]["status"] == got["test_interrupts"]["status"] == "failed"
    assert "time limit" in got["test_hangs"]["output"] and "interrupted" in got["test_interrupts"]["output"]
    assert "test_after_the_interrupt" not in got or got["test_after_the_interrupt"]["status"] != "passed"


# -- points, Gradescope's format, the autograder ---------------------------------------------------------------------


def test_results_have_gradescopes_shape_even_when_grading_fails(tmp_path):
    out = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "-m", "pagedlab", "assignment", "grade", str(tmp_path), "--stage", "2", "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    results = json.loads(out.read_text())
    assert results["score"] == 0 and results["tests"] == [] and "has no src/pagedlab" in results["output"]
    assert {"score", "execution_time", "output", "visibility", "stdout_visibility", "tests"} <= set(results)


def test_gradescope_autograder_files(tmp_path, handout):
    files = gradescope.write_gradescope(2, tmp_path / "ag")
    setup, run, source, archive = files
    assert run.read_text().count("--stage 2") == 1 and run.stat().st_mode & 0o111
    assert "bubblewrap" in setup.read_text() and (source / "src" / "pagedlab" / "kv" / "block_pool.py").exists()
    import zipfile

    names = zipfile.ZipFile(archive).namelist()
    assert "setup.sh" in names and "run_autograder" in names and "pagedlab/tests/conftest.py" in names
    result = grading.grade(handout, 2)
    keys = {"name", "score", "max_score", "status", "output", "visibility", "tags"}
    assert result["tests"] and all(set(t) == keys for t in result["tests"])
    assert set(gradescope.gradescope_json(result)) == {
        "score", "execution_time", "output", "visibility", "stdout_visibility", "tests",
    }  # fmt: skip


def test_every_stage_tasks_points_are_whole_and_add_up_to_100():
    for stage in STAGES:
        regions = grading.stage_regions(grading.repo_root(), stage)
        assert sum(r.points for r in regions) == 100 and all(isinstance(r.points, int) for r in regions)


def test_the_grader_never_trusts_a_line_it_did_not_ask_for(tmp_path):
    """A case reported twice is an unknown outcome; a line for a case nobody ran, or not JSON, is ignored; a line
    for an asked case in any other shape is a report without a result."""
    (tmp_path / "src" / "pagedlab").mkdir(parents=True)
    (tmp_path / "src" / "pagedlab" / "x.py").write_text("a = 1\nb = 2\n")
    output = (b'{"start": "a"}\n{"case": "a", "obs": 1}\n{"case": "a", "obs": 1}\nnot json\n{"case": "z", "obs": 1}\n'
              b'{"case": "c", "error": "Evil\\nText", "at": ["pagedlab/x.py", 1]}\n{"start": "b"}\n')  # fmt: skip
    got: dict = {}
    current = grading._parse(messages.scenario_messages(output, ["a", "b", "c"], tmp_path), got)
    assert current == "b" and grading._verdict("a", 1, got, {}) == "reported twice: an unknown outcome"
    assert grading._verdict("b", 1, got, {}) == "no result: the process stopped before this case"
    assert "not one the grader reads" in grading._verdict("c", 1, got, {}) and "z" not in got


def test_a_student_checks_the_visible_cases_on_their_own_copy(workspace):
    """In the workspace, with its own pagedlab first on the path: no reference to run, so the visible cases are
    compared with scenarios.json (written by `make` from the reference), and the report says so."""
    R.write_body(workspace, "free-queue", R.reference_body("free-queue"))
    env = dict(os.environ, PYTHONPATH=str(workspace / "src"))
    cmd = [sys.executable, "-m", "pagedlab", "assignment", "grade", ".", "--stage", "2", "--no-feedback"]
    run = subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
    assert "Your own copy: the visible cases only" in run.stderr, run.stderr
    assert "free-queue                   20      20  4/4" in run.stderr and "not started: 4 tasks" in run.stderr


# -- issue 39: the boundary's last open doors --------------------------------------------------------------------

STAGE2_CASES = {task: s.case_names() for task, s in stage_scenarios(2).items()}


def test_a_child_cannot_read_the_graders_environment_through_proc(workspace):
    """/proc/1/environ was bwrap's, which held the grader's whole environment: bwrap now starts with PATH alone, the
    child has its own /proc and its own user id. A body that scores only when it finds the secret scores 0."""
    if not sandbox.isolation()[0]:
        pytest.skip("the boundary under test is the sandbox's")
    R.write_body(workspace, "free-queue", R.with_prelude("free-queue", "popleft", R.READ_ENVIRONMENTS))
    R.write_body(workspace, "paged-gather", R.reference_body("paged-gather"))  # an honest task beside it
    run, results = cli_grade(workspace, "--no-feedback", env=dict(os.environ, **{R.SECRET_NAME: "hunter2"}))
    assert task_scores(results)["free-queue"] == 0 and task_scores(results)["paged-gather"] == 20, run.stderr
    assert "LookupError" in run.stderr


def test_grading_with_python_m_binds_only_the_graded_tree(workspace, tmp_path):
    """`python -m pagedlab` puts the folder it runs in first on sys.path; the sandbox used to bind it, with the other
    submissions and hidden tests in it. A body that scores only if it can read a file there scores 0."""
    if not sandbox.isolation()[0]:
        pytest.skip("the boundary under test is the sandbox's")
    here = tmp_path / "course"
    (here / "hidden").mkdir(parents=True)
    (here / "hidden" / "test_secret.py").write_text("SECRET = 1\n")
    R.write_body(
        workspace,
        "free-queue",
        R.with_prelude("free-queue", "popleft", R.read_if_there(here / "hidden" / "test_secret.py")),
    )
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "pagedlab", "assignment", "grade", str(workspace), "--stage", "2", "--json", str(out)]
    run = subprocess.run([*cmd, "--no-feedback"], cwd=here, capture_output=True, text=True, timeout=600)
    assert task_scores(json.loads(out.read_text()))["free-queue"] == 0, run.stderr
    assert "FileNotFoundError" in run.stderr


def test_what_a_child_writes_is_read_as_a_strict_schema(workspace):
    """A line number that is 1.7 KB of text as one integer, an observation nested 100,000 deep and one nested 60
    deep: none crashes the grader, none comes back as text; each case counts as failed."""
    leak = "\n".join(R.reference_body("slot-mapping"))  # what such a number carried out: another task's reference
    R.write_body(
        workspace,
        "free-queue",
        R.with_prelude("free-queue", "popleft", R.huge_line_number(STAGE2_CASES["free-queue"], leak)),
    )
    R.write_body(
        workspace,
        "paged-gather",
        R.with_prelude("paged-gather", "context_slots", R.deep_nesting(STAGE2_CASES["paged-gather"], 100_000)),
    )
    R.write_body(
        workspace,
        "slot-mapping",
        R.with_prelude("slot-mapping", "slot_mapping", R.deep_nesting(STAGE2_CASES["slot-mapping"], 60)),
    )
    run, results = cli_grade(workspace, "--no-feedback")
    assert run.returncode == 1 and results["score"] == UNTOUCHED, run.stderr
    assert not re.search(r"\d{25}", run.stderr + json.dumps(results)), "a long number came back"
    assert "not one the grader reads" in run.stderr  # the line number and the 60-deep value: outside the schema
    assert "the process ended during this case" in run.stderr  # 100,000 deep: not even JSON to the parser
    assert_no_reference_text(run, results)


def test_a_task_cannot_call_another_tasks_reference(workspace):
    """slot-mapping's body calling paged-gather's context_slots (the same slot, through the table) scored 20/20: in
    its tree every task it does not build on is a stub."""
    body = R.with_prelude("slot-mapping", "slot_mapping", R.CALL_THE_GATHER, keep_rest=False)
    R.write_body(workspace, "slot-mapping", body)
    run, results = cli_grade(workspace, "--no-feedback")
    assert task_scores(results)["slot-mapping"] == 0, run.stderr
    assert "raised NotImplementedError at pagedlab/attention/paged.py" in run.stderr


def zero(rng):
    return 0


def one(rng):
    return 1


def test_only_cases_drawn_at_grading_score_and_none_is_a_visible_one():
    """A task scores the share of its drawn cases that passed (the visible ones, whose answers a student holds,
    explain only); a drawn case whose observation equals a visible one's is drawn again."""
    body = grading.Body(grading.stage_regions(grading.repo_root(), 2)[0])
    result = grading.TaskResult(body, {"a": None, "b": None, "seeded-1": "x", "seeded-2": None})
    assert result.graded == ["seeded-1", "seeded-2"] and result.fraction == 0.5
    scenarios = TaskScenarios("t", (), (zero, one), lambda rng: rng.randrange(3), 1)
    seed = next(s for s in range(100) if run_case(scenarios, "seeded-1", s) != 2)  # its first draw: a visible answer
    observed, seeds = grading._draw(scenarios, seed)
    assert observed["seeded-1"] == 2 and seeds["seeded-1"] != seed


def test_grade_all_grades_every_submission_whatever_one_of_them_does(handout, tmp_path):
    """A task file that is a FIFO (reading it blocked for ever), one that links to /dev/zero, a body whose report is
    nested 100,000 deep, and an honest one after them: each gets its row, and the honest one its points."""
    subs = tmp_path / "subs"
    for name in ("a_fifo", "b_zero", "c_deep", "d_honest"):
        shutil.copytree(handout, subs / name)
    pool = Path("src/pagedlab/kv/block_pool.py")
    (subs / "a_fifo" / pool).unlink()
    os.mkfifo(subs / "a_fifo" / pool)
    (subs / "b_zero" / pool).unlink()
    (subs / "b_zero" / pool).symlink_to("/dev/zero")
    R.write_body(
        subs / "c_deep",
        "paged-gather",
        R.with_prelude("paged-gather", "context_slots", R.deep_nesting(STAGE2_CASES["paged-gather"], 100_000)),
    )
    R.write_body(subs / "d_honest", "free-queue", R.reference_body("free-queue"))
    out = tmp_path / "scores.csv"
    cmd = [sys.executable, "-m", "pagedlab", "assignment", "grade-all", str(subs), "--stage", "2", "--csv", str(out),
           "--no-feedback", "--seed", "7"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    rows = {r["submission"]: r for r in csv.DictReader(out.open())}
    assert set(rows) == {"a_fifo", "b_zero", "c_deep", "d_honest"}, run.stderr
    assert float(rows["d_honest"]["free-queue"]) == 20 and float(rows["d_honest"]["score"]) == 20
    assert all(float(rows[n]["score"]) == 0 for n in ("a_fifo", "b_zero", "c_deep")), rows
