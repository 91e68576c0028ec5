"""Course: a stage's HANDOUT.md: the tasks, where they are, what builds on what, how it is graded, the written part.

Builds on: course/scenarios/ (each task's cases and what it builds on), course/written.py.
Read with: chapters/98-assignments.md (Handing out).

Every link in the hand-out resolves inside the workspace it is written into,
and every line number is the task's `# BEGIN SOLUTION` line in the student's
own (stubbed) file: a stub is shorter than its solution, so later regions of a
file move up.
"""

from __future__ import annotations

import re
from pathlib import Path

from pagedlab.course import written
from pagedlab.course.scenarios import stage_scenarios
from pagedlab.stages import STAGE_NAMES, STAGES

_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def handout(number: int, tasks: list[dict], root: Path, out: Path) -> str:
    """The student's README for the workspace `out`. `tasks`: assignment.json's entries (file, line in `out`)."""
    total = sum(t["points"] for t in tasks)
    chapter = STAGES[number].chapter
    lines = [
        f"# pagedlab assignment: stage {number} ({STAGE_NAMES[number]}), {total} points",
        "",
        f"Read [{chapter}]({chapter}) first. Each task below is a region between `# BEGIN SOLUTION` and",
        "`# END SOLUTION` whose code is a stub that raises `NotImplementedError` (inside a Triton kernel: `pass`,",
        "and its launcher raises; delete that line once the kernel is written). Earlier stages are complete.",
        "The stub's docstrings state every contract the grader checks: what each function returns (its type),",
        "when it returns `None`, and which exception it raises, with the exact message where one is checked.",
        "",
        "| task | points | where | what to write | builds on |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| `{t['id']}` | {t['points']} | [{t['file']}:{t['line']}]({t['file']}#L{t['line']}) | {t['task']} "
        f"| {', '.join(f'`{b}`' for b in t['builds_on']) or '(none)'} |"
        for t in tasks
    ]
    lines += ["", *build_on_lines(tasks), "", *_grading(number, tasks), *written.handout_section(number)]
    lines += _tests(tasks) + _exercises(root, number, out)
    return "\n".join(lines) + "\n"


def builds_on(number: int) -> dict[str, list[str]]:
    """{task: the stage's other tasks its scenarios run}: the hand-out's build-on graph."""
    return {task: list(s.builds_on) for task, s in stage_scenarios(number).items()}


def build_on_lines(tasks: list[dict]) -> list[str]:
    """One sentence on the graph: who uses whom, and that each task is graded alone anyway."""
    uses = [f"`{t['id']}` uses {', '.join(f'`{b}`' for b in t['builds_on'])}" for t in tasks if t["builds_on"]]
    graph = "; ".join(uses) if uses else "no task uses another"
    return [
        f"Tasks build on each other: {graph}. Each task is graded with the teacher's code for the tasks it builds",
        "on (every other task is a stub there), so a correct task earns its points alone, whatever state the",
        "others are in; your own runs of the tests use your own code for all of them.",
    ]


def _grading(number: int, tasks: list[dict]) -> list[str]:
    files = sorted({test.split("::")[0] for t in tasks for test in t["tests"]})
    return [
        "## How it is graded",
        "",
        "Only the code between each region's markers is taken from your copy; changes elsewhere (other files,",
        "the tests, `assignment.json`) are ignored. Each task is graded by its scenarios, in",
        f"[src/pagedlab/course/scenarios/stage{number}.py](src/pagedlab/course/scenarios/stage{number}.py): a few",
        "fixed, visible cases and several cases drawn from a seed chosen when grading starts. Your body runs in",
        "a sandbox (no network, none of the teacher's files), the tasks it builds on with the teacher's code;",
        "what it returns, the block ids, queue orders, ref counts, hashes and tensors it produces are compared",
        "with what the teacher's code produces on the same cases. A task scores its points times the share of",
        "its drawn cases whose observations are equal (the visible ones are for your own checks: they are",
        "reported, and never score). A case that raises, hangs, or never reports scores nothing. The tests",
        "below do not set the score: when a task loses points, the report shows the first of its tests that",
        "fails, with its assertion, to say why.",
        "",
        "Check the visible cases and run the tests yourself (the seeded cases run only in the teacher's grading):",
        "",
        "```bash",
        f"PYTHONPATH=src python -m pagedlab assignment grade . --stage {number}   # compares with scenarios.json",
        f"PYTHONPATH=src python -m pytest -q -m '{STAGES[number].marker} and task' {' '.join(files)}",
        "```",
        "",
    ]


def _tests(tasks: list[dict]) -> list[str]:
    lines = ["## The tests of each task (feedback)", ""]
    for t in tasks:
        lines += [f"**`{t['id']}`** ({len(t['tests'])} tests):", ""]
        lines += [f"- `{test}`" for test in t["tests"]] + [""]
    return lines


def _exercises(root: Path, number: int, out: Path) -> list[str]:
    """The chapter's exercises, each relative link rewritten to the workspace's top folder (or dropped where its
    target is not in the workspace)."""
    chapter = root / STAGES[number].chapter
    if not chapter.exists() or "## Exercises" not in chapter.read_text():
        return []
    text = chapter.read_text().split("## Exercises", 1)[1].strip()
    base = chapter.parent.relative_to(root)
    return ["## Exercises (from the chapter)", "", _relink(text, base, out)]


def _relink(text: str, base: Path, out: Path) -> str:
    def fix(match: re.Match) -> str:
        label, target = match.groups()
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        rel = Path(_normalize(base / path))
        if (out / rel).exists():
            return f"[{label}]({rel}{'#' + anchor if anchor else ''})"
        return label  # not in the workspace (another stage's chapter): the words stay, the link goes

    return _LINK.sub(fix, text)


def _normalize(path: Path) -> str:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            parts = parts[:-1]
        elif part != ".":
            parts.append(part)
    return "/".join(parts)
