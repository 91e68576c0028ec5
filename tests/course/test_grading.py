"""The grader a course can trust: screening, a tree the teacher builds, isolation, points per task, Gradescope.

Each forging route a student tried (chapters/98-assignments.md, What the grader trusts) is here, with the
score it must get: what the teacher's tests give the regions' bodies, and nothing else.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import pagedlab
from pagedlab.course import assignment, gradescope, grading, regions
from pagedlab.course.screening import screen
from pagedlab.stages import STAGES

SRC = Path(pagedlab.__file__).parent
ROOT = SRC.parents[1]
FAST = "test_block_pool"  # stage 2's free-queue and pool tests: a grading run in seconds


@pytest.fixture(scope="module")
def handout(tmp_path_factory) -> Path:
    """An untouched stage-2 student copy (copied per test, so each test may forge its own)."""
    return assignment.make(2, tmp_path_factory.mktemp("handout") / "hw2")


@pytest.fixture
def workspace(handout, tmp_path) -> Path:
    return Path(shutil.copytree(handout, tmp_path / "hw2"))


def region(task_id: str) -> regions.Region:
    return next(r for r in regions.find_regions(SRC) if r.task_id == task_id)


def write_body(ws: Path, task_id: str, body: list[str]) -> None:
    """Replace the body of one region in the workspace's copy."""
    r = region(task_id)
    path = ws / r.path.relative_to(ROOT)
    lines = path.read_text().splitlines()
    mine = next(m for m in regions.file_regions(path, "\n".join(lines)) if m.task_id == task_id)
    lines[mine.start + 1 + mine.header : mine.end] = body
    path.write_text("\n".join(lines) + "\n")


def reference_body(task_id: str) -> list[str]:
    r = region(task_id)
    return r.body(r.path.read_text().splitlines())


def by_task(result: dict) -> dict[str, dict]:
    return {t["id"]: t for t in result["tasks"]}


# -- screening ----------------------------------------------------------------------------------------


def test_every_reference_body_passes_screening():
    for r in regions.find_regions(SRC):
        text = r.path.read_text()
        lines = text.splitlines()
        assert screen("\n".join(r.body(lines)), r.indent(lines), text, regions.whole_functions(lines, r)) == [], r.label


FILE = "import torch\nimport numpy as np\nfrom pagedlab.kv.block_pool import KVCacheBlock\n\ndef f(x):\n    return x\n"


@pytest.mark.parametrize(
    "body, why",
    [
        ("import pagedlab", "imports are not accepted"),
        ("from pagedlab.kv import block_pool", "imports are not accepted"),
        ("y = __import__('pagedlab')", "'__import__' is not accepted"),
        ("exec(open('/ref/block_pool.py').read())", "'exec' is not accepted"),
        ("y = eval('1')", "'eval' is not accepted"),
        ("c = compile('1', 'x', 'eval')", "'compile' is not accepted"),
        ("y = getattr(torch, 'load')", "'getattr' is not accepted"),
        ("g = globals()", "'globals' is not accepted"),
        ("y = sys.modules", "'sys' is not accepted"),
        ("y = torch.os.system('x')", "'os' is not accepted"),
        ("y = np.sys", "'sys' is not accepted"),
        ("y = x.__class__.__mro__", "'__class__' is not accepted"),
        ("y = f.__globals__", "'__globals__' is not accepted"),
        ("y = frame.f_back.f_globals", "'f_back' is not accepted"),
        ("y = torch._C", "below a module's public names"),
        ("y = torch.utils.cpp_extension", "'utils' is not accepted"),
        ("y = __builtins__", "'__builtins__' is not accepted"),
        ("y = undefined_thing(1)", "'undefined_thing' is neither in this file"),
        ("class Sneaky:\n    pass", "ClassDef is not accepted"),
        ("global x", "global is not accepted"),
        ("y = (lambda: 0).__code__", "'__code__' is not accepted"),
        ("y = x.__", "'__' is not accepted"),
    ],
)
def test_screening_refuses_each_way_out(body, why):
    reasons = screen(textwrap.indent(body, "    "), "    ", FILE)
    assert reasons and any(why in r for r in reasons), reasons


def test_the_safe_builtins_are_builtins_and_none_is_forbidden():
    import builtins

    from pagedlab.course.screening import FORBIDDEN_NAMES, SAFE_BUILTINS

    assert all(hasattr(builtins, name) for name in SAFE_BUILTINS) and not SAFE_BUILTINS & FORBIDDEN_NAMES


def test_screening_refuses_code_outside_the_region_and_a_missing_function():
    assert "indented less than the region" in screen("    x = 1\ny = 2", "    ", FILE)[0]
    assert "does not parse" in screen("    x = (1,", "    ", FILE)[0]
    reasons = screen("    def g(self):\n        return 1", "    ", FILE, whole_functions=["popleft", "g"])
    assert reasons == ["line 1: the region must define popleft"]


def test_screening_accepts_an_honest_body_with_its_own_names():
    body = "    total = 0\n    for i, v in enumerate(x):\n        total += len([v]) * KVCacheBlock(i).block_id\n"
    assert screen(body + "    return sorted({total, np.int64(1)})", "    ", FILE) == []
    # a class's private attribute (Python renames self.__next to self._Class__next): kv/cow.py binds super()'s
    assert screen("    return x.__next_allocate_slots(x, 1)", "    ", FILE) == []


# -- the tree the teacher builds ------------------------------------------------------------------------


def test_untouched_copy_scores_zero_and_the_reference_full_marks(handout, tmp_path):
    untouched = grading.grade(handout, 2)
    assert untouched["score"] == 0 and untouched["max_score"] == 100
    assert {t["status"] for t in untouched["tests"]} == {"failed"}
    assert "NotImplementedError: TASK free-queue" in " ".join(t["output"] for t in untouched["tests"])
    teacher = assignment.make(2, tmp_path / "teacher", with_solutions=True)
    full = grading.grade(teacher, 2)
    assert full["score"] == full["max_score"] == 100, full["output"]
    assert [t["score"] for t in full["tasks"]] == [t["points"] for t in full["tasks"]]


def test_every_forging_route_outside_the_regions_is_ignored(workspace):
    ws = workspace
    # 1. the workspace's tests, replaced by ones that pass, with a conftest that turns failures into passes
    shutil.rmtree(ws / "tests")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_block_pool.py").write_text(
        "def test_queue_pops_from_the_head_and_appends_at_the_tail():\n    pass\n"
    )
    (ws / "tests" / "conftest.py").write_text(
        "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    # 2. a sitecustomize.py and a conftest.py in src/, an atexit hook rewriting any report, the stage changed
    (ws / "src" / "sitecustomize.py").write_text("import atexit, os\natexit.register(lambda: os._exit(0))\n")
    (ws / "src" / "conftest.py").write_text("raise SystemExit(0)\n")
    spec = json.loads((ws / "assignment.json").read_text())
    (ws / "assignment.json").write_text(json.dumps(dict(spec, stage=1)))
    # 3. every test unmarked (the workspace's pytest config), and the package pointed at the installed reference
    (ws / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-m nothing'\n")
    init = ws / "src" / "pagedlab" / "__init__.py"
    init.write_text(init.read_text() + f"\nimport sys\nsys.path.insert(0, {str(SRC.parent)!r})\n")
    pool = ws / "src" / "pagedlab" / "kv" / "block_pool.py"
    pool.write_text(pool.read_text() + f"\nexec(open({str(SRC / 'kv' / 'block_pool.py')!r}).read())\n")
    result = grading.grade(ws, 2, keyword=FAST)
    assert result["score"] == 0 and result["max_score"] == 40, result["output"]
    notes = " ".join(result["notes"])
    assert "kv/block_pool.py: changes outside the task regions are ignored" in notes
    assert "src/pagedlab/__init__.py: changed" in notes and "src/sitecustomize.py: not in the reference" in notes


def test_a_body_that_reaches_the_reference_is_refused_and_an_honest_one_scores(workspace):
    write_body(workspace, "free-queue", reference_body("free-queue"))  # honest
    write_body(  # the reference's pool, one import away
        workspace,
        "pool-allocate-free",
        [
            "    import importlib",
            "    _ref = importlib.import_module('pagedlab.kv.block_pool')",
            "    allocate = _ref.BlockPool.allocate",
        ],
    )
    result = grading.grade(workspace, 2, keyword=FAST)
    tasks = by_task(result)
    assert tasks["pool-allocate-free"]["status"] == "refused" and tasks["pool-allocate-free"]["score"] == 0
    assert any("imports are not accepted" in r for r in tasks["pool-allocate-free"]["reasons"])
    # free-queue's own two tests pass; the pool's state machine (tagged with both tasks) fails with the stub
    assert tasks["free-queue"]["status"] == "accepted" and tasks["free-queue"]["score"] == pytest.approx(
        20 * 2 / 3, abs=0.01
    )
    assert result["score"] == pytest.approx(13.33, abs=0.01) and result["max_score"] == 40
    refused = [t for t in result["tests"] if "pool-allocate-free" in t["tags"]]
    assert all(t["status"] == "failed" and "task pool-allocate-free refused" in t["output"] for t in refused)


def test_a_missing_region_scores_zero_for_its_task_only(workspace):
    path = workspace / "src" / "pagedlab" / "kv" / "block_pool.py"
    text = path.read_text()
    first = text.index(regions.BEGIN)
    path.write_text(text[:first] + text[first:].replace(regions.BEGIN, "# (markers removed)", 1))
    with pytest.raises(ValueError):
        regions.file_regions(path, path.read_text())
    result = grading.grade(workspace, 2, keyword=FAST)
    assert {t["id"]: t["status"] for t in result["tasks"]}["free-queue"] == "missing"
    assert result["score"] == 0


# -- isolation: hangs, exits, the pipe ----------------------------------------------------------------------

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

def test_eats_the_alarm():
    while True:
        try:
            time.sleep(0.05)
        except BaseException:
            pass

def test_exits_the_process():
    os._exit(0)

def test_reads_the_reference():
    open(os.environ.get("PAGEDLAB_SOURCE", "{source}")).read()

def test_starts_a_process():
    import subprocess
    subprocess.run(["true"])

def test_after_the_exit():
    assert "pagedlab" in FreeKVCacheBlockQueue.__module__
"""


def test_a_hang_an_exit_and_an_escape_fail_only_their_own_tests(tmp_path):
    teacher = assignment.make(2, tmp_path / "teacher", with_solutions=True)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "test_hidden.py").write_text(HIDDEN.replace("{source}", str(SRC / "kv" / "block_pool.py")))
    result = grading.grade(teacher, 2, extra_tests=hidden, keyword="hidden", per_test_timeout=2, total_timeout=200)
    got = {t["name"].split("::")[-1]: t for t in result["tests"]}
    assert set(got) == {
        "test_passes", "test_hangs", "test_eats_the_alarm", "test_exits_the_process",
        "test_reads_the_reference", "test_starts_a_process", "test_after_the_exit",
    }  # fmt: skip
    assert got["test_passes"]["status"] == got["test_after_the_exit"]["status"] == "passed"
    assert "time limit" in got["test_hangs"]["output"]
    assert "killed" in got["test_eats_the_alarm"]["output"]
    assert "exited during this test" in got["test_exits_the_process"]["output"]
    assert "PermissionError" in got["test_reads_the_reference"]["output"]
    assert "PermissionError" in got["test_starts_a_process"]["output"]
    for t in got.values():  # hidden tests: after publication, and no line of their source
        assert t["visibility"] == "after_published" and "time.sleep" not in t["output"]


def test_the_grader_never_trusts_a_line_without_the_nonce(tmp_path):
    """The child's pipe is the only report; a forged line (wrong nonce) is dropped."""
    read, write = __import__("os").pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    with open(write, "wb", closefd=True) as w:
        w.write(b'{"result": "x", "outcome": "passed", "nonce": "forged"}\n{"done": true, "nonce": "good"}\n')
    msgs = list(grading._messages(proc, read, "good", idle_limit=10, deadline=__import__("time").monotonic() + 10))
    assert msgs == [{"done": True}]


# -- points, Gradescope's format, the autograder -------------------------------------------------------------


def test_points_are_split_over_each_tasks_tests():
    tests_of = grading.collect_tasks(2)
    stage2 = {r.task_id: r for r in regions.stage_regions(ROOT, 2)}
    assert set(tests_of) == set(stage2) and all(tests_of.values())
    assert sum(r.points for r in stage2.values()) == 100
    for stage in STAGES:  # every task of every stage has its points and at least one test
        assert sum(r.points for r in regions.stage_regions(ROOT, stage)) == 100


def test_every_task_tag_names_a_task():
    ids = {r.task_id for r in regions.find_regions(SRC)}
    import re

    for path in (ROOT / "tests").rglob("test_*.py"):
        for name in re.findall(r'mark\.task\("([^"]+)"\)', path.read_text()):
            assert name in ids, f"{path.name}: @pytest.mark.task({name!r}) names no task"


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
    assert "pip install -q -e" in setup.read_text() and (source / "src" / "pagedlab" / "kv" / "block_pool.py").exists()
    names = zipfile.ZipFile(archive).namelist()
    assert "setup.sh" in names and "run_autograder" in names and "pagedlab/tests/conftest.py" in names
    result = grading.grade(handout, 2, keyword="test_queue_pops")
    tests = result["tests"]
    assert tests and all(
        set(t) == {"name", "score", "max_score", "status", "output", "visibility", "tags"} for t in tests
    )
    assert set(gradescope.gradescope_json(result)) == {
        "score", "execution_time", "output", "visibility", "stdout_visibility", "tests",
    }  # fmt: skip
