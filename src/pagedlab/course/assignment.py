"""Course: `pagedlab assignment make N --out DIR` writes a student copy of stage N; `check` grades two copies.

Builds on: course/regions.py (regions, stubs), course/grading.py (collect_tasks, grade).
Read with: chapters/98-assignments.md.

A student copy is the repository with every stage-N region stubbed
(course/regions.py), earlier stages' solutions kept, the stage's chapter and
notebook, and a handout listing each task, its points, its file and line, and
the tests that grade it. `check_stages` grades an untouched copy and the
teacher's own for each stage: a teacher's first check that the points add up.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from pagedlab.course import grading
from pagedlab.course.regions import copy_tests, repo_root, stage_regions, stub_source
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
    shutil.copytree(root / "src", out / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    copy_tests(root, out / "tests")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, out / name)
    for path in set() if with_solutions else {r.path for r in regions}:
        target = out / path.relative_to(root)
        target.write_text(stub_source(path.read_text(), [r for r in regions if r.path == path]))
    _copy_reading(root, out, number)
    tasks = [
        {"id": r.task_id, "points": r.points, "file": str(r.path.relative_to(root)), "line": r.start + 1,
         "task": r.task, "launcher": r.launcher, "tests": tests_of[r.task_id]}
        for r in regions
    ]  # fmt: skip
    (out / "assignment.json").write_text(
        json.dumps({"stage": number, "name": STAGE_NAMES[number], "tasks": tasks}, indent=2) + "\n"
    )
    (out / "HANDOUT.md").write_text(handout(number, tasks, root))
    return out


def _copy_reading(root: Path, out: Path, number: int) -> None:
    notebook = root / STAGES[number].notebook
    if notebook.exists():
        (out / "notebooks").mkdir(exist_ok=True)
        shutil.copy(notebook, out / "notebooks" / notebook.name)
    chapter = root / STAGES[number].chapter
    if chapter.exists():
        (out / "chapters").mkdir(exist_ok=True)
        shutil.copy(chapter, out / "chapters" / chapter.name)


def handout(number: int, tasks: list[dict], root: Path) -> str:
    """The student's README: the tasks and their points, where they are, the tests that grade each, the rules."""
    total = sum(t["points"] for t in tasks)
    files = sorted({test.split("::")[0] for t in tasks for test in t["tests"]})
    lines = [
        f"# pagedlab assignment: stage {number} ({STAGE_NAMES[number]}), {total} points",
        "",
        f"Read `{STAGES[number].chapter}` first. Each task below is a region between `# BEGIN SOLUTION`",
        "and `# END SOLUTION` whose code is a stub that raises `NotImplementedError` (inside a Triton kernel:",
        "`pass`, and its launcher raises; delete that line once the kernel is written). Earlier stages are complete.",
        "",
        "| task | points | file | line | what to write | graded by |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| `{t['id']}` | {t['points']} | `{t['file']}` | {t['line']} | {t['task']} | {len(t['tests'])} tests |"
        for t in tasks
    ]
    lines += [
        "",
        "## How it is graded",
        "",
        "Only the code between each region's markers is taken from your copy; it is put into the teacher's",
        "own copy of pagedlab and run against the teacher's tests (perhaps with hidden ones), so changes",
        "elsewhere (other files, the tests, `assignment.json`) are ignored. A task's points are split evenly",
        "over its tests. Before anything runs, each region is screened: it may use the names its file already",
        "has, its own local names, and plain builtins (`len`, `range`, `min`, `sorted`, ...); it may not",
        "import, use `exec`/`eval`/`open`/`getattr`, or touch `sys`, `os` or dunder attributes. A refused region",
        "scores zero for its task, with the reason. Each test has a time limit.",
        "",
        "Run the graded tests yourself:",
        "",
        "```bash",
        f"PYTHONPATH=src python -m pytest -q -m '{STAGES[number].marker} and task' {' '.join(files)}",
        "```",
        "",
        "and see your score as the grader computes it (the same screening, the same points):",
        "",
        "```bash",
        f"PYTHONPATH=src python -m pagedlab assignment grade . --stage {number}",
        "```",
        "",
        "## The tests of each task",
        "",
    ]
    for t in tasks:
        lines += [f"**`{t['id']}`** ({t['points']} points over {len(t['tests'])} tests):", ""]
        lines += [f"- `{test}`" for test in t["tests"]] + [""]
    chapter = root / STAGES[number].chapter
    if chapter.exists() and "## Exercises" in chapter.read_text():
        lines += ["## Exercises (from the chapter)", "", chapter.read_text().split("## Exercises", 1)[1].strip()]
    return "\n".join(lines) + "\n"


def check_stages(stages=tuple(STAGES), out=sys.stderr) -> list[dict]:
    """A teacher's check of every stage: an untouched copy should score <= 10 %, the reference 100 %.

    One row per stage: tasks, points, both scores, both grading times (seconds, this machine)."""
    rows = []
    for number in stages:
        with tempfile.TemporaryDirectory() as tmp:
            student = make(number, Path(tmp) / "student")
            teacher = make(number, Path(tmp) / "teacher", with_solutions=True)
            untouched, reference = grading.grade(student, number), grading.grade(teacher, number)
        row = {
            "stage": number,
            "tasks": [f"{t['id']} ({t['points']})" for t in reference["tasks"]],
            "tests": len(reference["tests"]),
            "blocked": sum(t["status"] == "blocked" for t in reference["tests"]),
            "max_score": reference["max_score"],
            "untouched": untouched["score"],
            "reference": reference["score"],
            "untouched_s": untouched["execution_time"],
            "reference_s": reference["execution_time"],
        }
        rows.append(row)
        print(
            f"stage {number}: untouched {row['untouched']:g} / {row['max_score']:g}, reference {row['reference']:g}, "
            f"{row['tests']} tests ({row['blocked']} blocked), {row['untouched_s']} s + {row['reference_s']} s",
            file=out,
        )
    return rows


def check_table(rows: list[dict]) -> str:
    """The check's rows as chapter 98's markdown table."""
    lines = [
        "| stage | tasks (points) | graded tests | untouched copy | reference | grading time (untouched / reference) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        blocked = f" (+{r['blocked']} blocked on a CPU)" if r["blocked"] else ""
        lines.append(
            f"| {r['stage']} {STAGE_NAMES[r['stage']]} | {', '.join(r['tasks'])} "
            f"| {r['tests'] - r['blocked']}{blocked} "
            f"| {r['untouched']:g} / {r['max_score']:g} | {r['reference']:g} / {r['max_score']:g} "
            f"| {r['untouched_s']:.0f} s / {r['reference_s']:.0f} s |"
        )
    return "\n".join(lines)
