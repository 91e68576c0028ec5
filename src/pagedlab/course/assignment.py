"""Course: `pagedlab assignment make N --out DIR` writes a student copy of stage N; `check` grades two copies.

Builds on: course/regions.py (regions, stubs), course/handout.py, course/grading.py (collect_tasks, grade).
Read with: chapters/98-assignments.md.

A student copy is built from an allow-list: the package's src/ with every
stage-N region stubbed, and every later stage's too (course/regions.py),
earlier stages' solutions kept; the tests of stage N and earlier and the
helpers they import (never the grader's own tests: they hold honest solutions
and mutants of the reference); the stage's chapter and notebook; a hand-out
(each task, its points, its file and line, what it builds on, how it is graded,
the written problems); and scenarios.json: the visible cases' observations, for
the student's own checks. `check_stages` grades an
untouched copy and the teacher's own for each stage: a teacher's first check
that the points add up and the grader gives the reference full marks.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from pagedlab.course import feedback, grading
from pagedlab.course.handout import builds_on, handout
from pagedlab.course.regions import (
    copy_student_tests,
    file_regions,
    repo_root,
    stage_regions,
    stub_source,
    unshipped_regions,
)
from pagedlab.course.submission import SRC_IGNORE
from pagedlab.stages import STAGE_NAMES, STAGES, parse_stage


def make(stage: int | str, out: str | Path, with_solutions: bool = False) -> Path:
    """Write a student workspace for `stage` into `out` (which must not exist or be empty).

    `with_solutions` keeps the regions (a teacher's copy, for checking that grading gives full marks).
    """
    number, out, root = parse_stage(stage), Path(out), repo_root()
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} exists and is not empty")
    regions = stage_regions(root, number)
    if not regions:
        raise ValueError(f"stage: stage {number} has no solution regions")
    tests_of = grading.collect_tasks(number)
    shutil.copytree(root / "src", out / "src", ignore=SRC_IGNORE)
    copy_student_tests(root, out / "tests", number)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, out / name)
    stubbed = [r for r in unshipped_regions(root, number) if not (with_solutions and r.stage == number)]
    for path in {r.path for r in stubbed}:
        target = out / path.relative_to(root)
        target.write_text(stub_source(path.read_text(), [r for r in stubbed if r.path == path]))
    _copy_reading(root, out, number)
    graph = builds_on(number)
    tasks = [
        {"id": r.task_id, "points": r.points, "file": str(r.path.relative_to(root)), "line": _line(out, root, r),
         "task": r.task, "launcher": r.launcher, "builds_on": graph[r.task_id], "tests": tests_of[r.task_id]}
        for r in regions
    ]  # fmt: skip
    (out / "assignment.json").write_text(
        json.dumps({"stage": number, "name": STAGE_NAMES[number], "tasks": tasks}, indent=2) + "\n"
    )
    (out / "HANDOUT.md").write_text(handout(number, tasks, root, out))
    (out / "scenarios.json").write_text(json.dumps(grading.visible_observations(number)) + "\n")
    return out


def _line(out: Path, root: Path, region) -> int:
    """The region's BEGIN line in the copy just written (stubs above it in the same file moved it up)."""
    path = out / region.path.relative_to(root)
    found = {r.task_id: r for r in file_regions(path, path.read_text())}
    return found[region.task_id].start + 1


def _copy_reading(root: Path, out: Path, number: int) -> None:
    notebook = root / STAGES[number].notebook
    if notebook.exists():
        (out / "notebooks").mkdir(exist_ok=True)
        shutil.copy(notebook, out / "notebooks" / notebook.name)
    chapter = root / STAGES[number].chapter
    if chapter.exists():
        (out / "chapters").mkdir(exist_ok=True)
        shutil.copy(chapter, out / "chapters" / chapter.name)


def check_stages(stages=tuple(STAGES), out=sys.stderr, extra_tests=None) -> list[dict]:
    """A teacher's check of every stage: an untouched copy should score <= 10 %, the reference 100 %; hidden tests
    (`extra_tests`) must each tag a task of a checked stage, before anything is graded, and pass on the reference.

    One row per stage: tasks, points, both scores, both grading times (seconds, this machine)."""
    root = repo_root()
    hidden = _hidden_by_stage(root, stages, extra_tests)
    rows = []
    for number in stages:
        with tempfile.TemporaryDirectory() as tmp:
            student = make(number, Path(tmp) / "student")
            teacher = make(number, Path(tmp) / "teacher", with_solutions=True)
            untouched = grading.grade(student, number)
            reference = grading.grade(teacher, number, extra_tests=hidden.get(number))
        rows.append(_row(number, untouched, reference))
        r = rows[-1]
        scores = f"untouched {r['untouched']:g} / {r['max_score']:g}, reference {r['reference']:g}"
        times = f"{r['cases']} drawn + {r['visible']} visible cases, {r['untouched_s']} s + {r['reference_s']} s"
        times += r["hidden_text"]
        print(f"stage {number}: {scores}, {times}", file=out)
    return rows


def _hidden_by_stage(root: Path, stages, extra_tests) -> dict:
    """{stage: the hidden tests' folder} for the one checked stage its files tag; a file that tags no task (or
    tasks of two stages) is a ValueError naming it, now."""
    if extra_tests is None:
        return {}
    ids = {n: [r.task_id for r in stage_regions(root, n)] for n in stages}
    fits = []
    for number in stages:
        try:
            feedback.check_hidden_tests(extra_tests, ids[number])
            fits.append(number)
        except ValueError as e:
            error = e
    if not fits:
        raise error
    return {fits[0]: extra_tests}


def _row(number: int, untouched: dict, reference: dict) -> dict:
    hidden = [t for t in reference["tests"] if t["visibility"] == "after_published"]
    failed = [t["name"] for t in hidden if t["status"] != "passed"]
    return {
        "stage": number,
        "tasks": [f"{t['id']} ({t['points']})" for t in reference["tasks"]],
        "cases": sum(t["cases"] for t in reference["tasks"]),  # drawn at grading: they score
        "visible": sum(t["visible"][1] for t in reference["tasks"]),
        "max_score": reference["max_score"],
        "untouched": untouched["score"],
        "reference": reference["score"] if not failed else 0.0,
        "untouched_s": untouched["execution_time"],
        "reference_s": reference["execution_time"],
        "hidden_failed": failed,
        "hidden_text": f", hidden tests failing on the reference: {failed}" if failed else "",
    }


def check_table(rows: list[dict]) -> str:
    """The check's rows as chapter 98's markdown table."""
    lines = [
        "| stage | tasks (points) | cases (drawn + visible) | untouched copy | reference "
        "| grading time (untouched / reference) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stage']} {STAGE_NAMES[r['stage']]} | {', '.join(r['tasks'])} | {r['cases']} + {r['visible']} "
            f"| {r['untouched']:g} / {r['max_score']:g} | {r['reference']:g} / {r['max_score']:g} "
            f"| {r['untouched_s']:.1f} s / {r['reference_s']:.1f} s |"
        )
    return "\n".join(lines)
