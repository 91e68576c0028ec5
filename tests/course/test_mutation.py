"""The tests assignment: mutants are deterministic, parse and differ from the reference; the student's copy ships no
later answer, no project test and no drill; the grader reads tests/ bounded, drops a test that fails on the
reference, filters equivalent mutants by the scenarios, scores an empty file 0 and the project's own tests near the
top, and never reports a mutant's text."""

from __future__ import annotations

import ast
import difflib
import json
import os
import time
from pathlib import Path

import pytest

from pagedlab.course import mutation, mutation_grading, regions, tests_assignment
from pagedlab.course.drills import Fault, faults
from pagedlab.course.mutation import Mutant
from tests.course.test_assignment import reference_bodies_in

ROOT = regions.repo_root()
SEED, COUNT = 0, 8  # few mutants: the whole file stays within CI's time


def test_mutants_are_deterministic_parse_and_differ_from_the_reference():
    for stage in (2, 3, 4, 5):
        found = mutation.candidates(ROOT, stage)
        assert {m.kind for m in found} == set(mutation.KINDS), stage
        tasks = {r.task_id for r in regions.stage_regions(ROOT, stage)}
        dumps = {p: ast.dump(ast.parse((ROOT / "src" / "pagedlab" / p).read_text())) for p in {m.path for m in found}}
        for m in found:
            assert m.task in tasks
            assert ast.dump(ast.parse(m.text)) != dumps[m.path], m.label
    first = mutation.draw(ROOT, 2, SEED, 20)
    assert [m.label for m in first] == [m.label for m in mutation.draw(ROOT, 2, SEED, 20)]
    assert [m.label for m in first] != [m.label for m in mutation.draw(ROOT, 2, SEED + 1, 20)]
    total = 20 + len(faults(2))  # the drills' faults come on top of those drawn
    assert len(first) == total and len({m.label for m in first}) == total
    assert {m.task for m in first} == {r.task_id for r in regions.stage_regions(ROOT, 2)}  # spread over the tasks


def test_a_mutant_changes_only_its_own_characters():
    # block_pool.py's free queue: one operator, one constant, one statement; every other line the reference's
    for m in [m for m in mutation.candidates(ROOT, 2) if m.path == "kv/block_pool.py"][:12]:
        reference = (ROOT / "src" / "pagedlab" / m.path).read_text().splitlines()
        changed = [line for line in difflib.ndiff(reference, m.text.splitlines()) if line[:2] in ("- ", "+ ")]
        assert len(changed) == 2, (m.label, changed)


def test_the_drills_faults_are_always_among_the_mutants(monkeypatch):
    from pagedlab.course import drills

    region = next(r for r in regions.stage_regions(ROOT, 2) if r.task_id == "free-queue")
    text = region.path.read_text()
    old = next(line + "\n" for line in region.body(text.splitlines()) if "-=" in line and text.count(line + "\n") == 1)
    fault = Fault(str(region.path.relative_to(ROOT / "src" / "pagedlab")), old, "\n", "drill")
    monkeypatch.setattr(drills, "faults", lambda stage: [fault] if stage == 2 else [])
    for seed in (1, 2):
        drawn = mutation.draw(ROOT, 2, seed, 3)
        assert len(drawn) == 4 and drawn[-1].kind == "drill" and drawn[-1].task == "free-queue"
        assert drawn[-1].text == fault.apply(text)


def test_the_tests_copy_ships_no_later_answer_no_project_test_and_no_drill(tmp_path):
    out = tests_assignment.make_tests(2, tmp_path / "copy")
    later = [r for r in regions.unshipped_regions(ROOT, 2) if r.stage > 2]
    assert reference_bodies_in(out, later) == []
    assert reference_bodies_in(out, regions.stage_regions(ROOT, 2))  # stage 2's own code is whole: it is tested
    assert sorted(p.name for p in (out / "tests").iterdir()) == ["__init__.py", "conftest.py", "test_mine.py"]
    assert not (out / "src" / "pagedlab" / "course" / "drills").exists()
    for path in (out / "src").rglob("*.py"):  # nothing imports the drills when imported (mutation.py: in a function)
        tree = ast.parse(path.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not any("drills" in ast.unparse(n) for n in top), path
    info = json.loads((out / "assignment.json").read_text())
    assert info["kind"] == "tests" and [c["task"] for c in info["components"]] == [
        r.task_id for r in regions.stage_regions(ROOT, 2)
    ]
    assert "mutants" in (out / "HANDOUT.md").read_text()
    ast.parse((out / "tests" / "test_mine.py").read_text())


def test_the_student_tests_are_read_bounded(tmp_path):
    ws = tmp_path / "ws"
    (ws / "tests" / "sub").mkdir(parents=True)
    (ws / "tests" / "test_a.py").write_text("def test_a():\n    assert 1\n")
    (ws / "tests" / "sub" / "helper.py").write_text("X = 1\n")
    (ws / "tests" / "test_big.py").write_text("#" * (mutation_grading.FILE_LIMIT + 1))
    (ws / "tests" / "test-odd.py").write_text("")
    (ws / "tests" / "conftest.py").write_text("import os\n")
    (tmp_path / "secret.py").write_text("SECRET = 1\n")
    (ws / "tests" / "test_link.py").symlink_to(tmp_path / "secret.py")
    os.mkfifo(ws / "tests" / "test_fifo.py")
    files, notes = mutation_grading.read_tests(ws)
    assert sorted(files) == ["sub/helper.py", "test_a.py"]
    assert mutation_grading._test_files(files) == ["tests/test_a.py"]
    text = "\n".join(notes)
    for name in ("test_big.py", "test-odd.py", "test_link.py", "test_fifo.py", "conftest.py"):
        assert name in text, name


def _workspace(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    ws = tests_assignment.make_tests(2, tmp_path / name)
    (ws / "tests" / "test_mine.py").unlink()
    for rel, text in files.items():
        target = ws / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return ws


def _shows_no_mutant(report: dict, mutants: list[Mutant]) -> None:
    text = json.dumps(report)
    for m in mutants:
        reference = (ROOT / "src" / "pagedlab" / m.path).read_text().splitlines()
        for line in difflib.ndiff(reference, m.text.splitlines()):
            if line[:2] in ("- ", "+ ") and len(line[2:].strip()) > 12:
                assert line[2:].strip() not in text, m.kind


@pytest.mark.slow
def test_an_empty_file_scores_zero_and_a_test_failing_on_the_reference_is_dropped(tmp_path):
    starter = tests_assignment.STARTER.format(number=2, name="paged", module="pagedlab.kv.block_pool",
                                              symbol="BlockPool")  # fmt: skip
    wrong = "\n\ndef test_wrong():\n    assert 1 + 1 == 3\n"
    ws = _workspace(tmp_path, "empty", {"tests/test_mine.py": starter + wrong, "tests/test_broken.py": "import nope\n"})
    started = time.monotonic()
    report = mutation_grading.grade_tests(ws, 2, seed=SEED, count=COUNT)
    print(
        f"\nstage 2, the starter file: {report['score']:g} / {report['max_score']}, {time.monotonic() - started:.1f} s"
    )
    assert report["score"] == 0 and report["mutants"]["killed"] == 0
    assert report["kept"] == 1  # test_example: passes, kills nothing
    assert sorted(t for t, _ in report["dropped"]) == ["tests/test_broken.py", "tests/test_mine.py::test_wrong"]
    assert "Dropped, failing on the reference" in report["output"] and "Survived" in report["output"]
    assert sum(report["survived"]["by_kind"].values()) == report["mutants"]["counted"] > 0
    _shows_no_mutant(report, mutation.draw(ROOT, 2, SEED, COUNT))


@pytest.mark.slow
def test_the_projects_own_tests_score_near_the_top(tmp_path):
    files = {str(p.relative_to(ROOT)): p.read_text() for p in tests_assignment.project_tests(ROOT, 2)}
    assert "tests/kv/test_block_pool.py" in files and "tests/worker/test_slot_mapping.py" in files
    ws = _workspace(tmp_path, "ours", files)
    started = time.monotonic()
    report = mutation_grading.grade_tests(ws, 2, seed=SEED, count=COUNT)
    m = report["mutants"]
    print(
        f"\nstage 2, the project's tests: {report['score']:g} / {report['max_score']} ({m['killed']} of {m['counted']}"
        f" killed, {m['equivalent']} equivalent), {time.monotonic() - started:.1f} s"
    )
    assert report["score"] >= 0.8 * report["max_score"], report["output"]
    assert report["dropped"] == [], report["dropped"]  # later stages' tests (Triton's) are deselected, not failed
    _shows_no_mutant(report, mutation.draw(ROOT, 2, SEED, COUNT))


@pytest.mark.slow
def test_the_filter_leaves_out_a_mutant_no_scenario_observes(tmp_path):
    path = ROOT / "src" / "pagedlab" / "kv" / "block_pool.py"
    text = path.read_text()
    region = next(r for r in regions.stage_regions(ROOT, 2) if r.task_id == "free-queue")
    lines = text.splitlines(keepends=True)
    at = region.start + 1 + region.header  # the region's first code line: a no-op assignment before it
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    quiet = "".join(lines[:at] + [f"{indent}_unseen = 0\n"] + lines[at:])
    ast.parse(quiet)
    loud = next(m for m in mutation.candidates(ROOT, 2) if m.task == "free-queue" and m.kind == "dropped statement")
    mutants = [Mutant("kv/block_pool.py", quiet, "operator swap", "free-queue", "quiet"), loud]
    limits = mutation_grading.grading.Limits(60.0, time.monotonic() + 300, [])
    assert mutation_grading.equivalent_mutants(ROOT, 2, SEED, mutants, limits, tmp_path) == {"quiet"}
