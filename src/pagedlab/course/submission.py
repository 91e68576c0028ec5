"""Course: what the grader takes from a workspace (only its regions' bodies), and the trees it builds from them.

Builds on: course/regions.py (regions, stubs), course/screening.py (a body's shape).
Read with: chapters/98-assignments.md (Grading).

A workspace is read as text and never imported. Each region of the stage
gives one body, in one of four states:

    not started   the stub the hand-out gave (its task scores 0, nothing runs)
    accepted      a body of the right shape: it runs, in a sandbox
    refused       a body that would reach outside its region, or lacks a function it must define
    missing       the file or its markers are gone

Trees are copies of the teacher's src/ (and tests/, for feedback) with chosen
bodies spliced into chosen regions; everything outside the regions is always
the teacher's, so edits elsewhere in the workspace change nothing.
"""

from __future__ import annotations

import ast
import shutil
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from pagedlab.course.regions import Region, copy_tests, file_regions, stub_body, whole_functions
from pagedlab.course.screening import screen

_STUBBED_LAUNCHER = "(kernel stubbed: write it, then delete this line)"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis", "*.pyc", ".pytest_cache")


@dataclass
class Body:
    """One region's body as the student wrote it."""

    region: Region
    status: str = "not started"  # not started | accepted | refused | missing
    lines: list[str] = field(default_factory=list)  # the body (only used when accepted)
    reasons: list[str] = field(default_factory=list)  # why refused or missing
    line: int = 0  # its BEGIN line in the student's file (0: as in the teacher's)


def read_bodies(root: Path, ws: Path, regions: list[Region]) -> tuple[dict[str, Body], list[str]]:
    """{task id: its Body} for the stage's regions, and notes on what changed outside them (ignored)."""
    bodies, notes = {}, []
    for path in sorted({r.path for r in regions}):
        mine = [r for r in regions if r.path == path]
        ref_text = path.read_text()
        found = _student_file(ws / path.relative_to(root), mine, bodies)
        if found is None:
            continue
        text, theirs = found
        for r in mine:
            if r.task_id in theirs:
                bodies[r.task_id] = _judge(r, ref_text, theirs[r.task_id])
        if _outside(text, list(theirs.values())) != _outside(ref_text, mine):
            notes.append(f"{path.relative_to(root)}: changes outside the task regions are ignored")
    return bodies, notes + _other_changes(root, ws, {r.path.relative_to(root) for r in regions})


def _student_file(path: Path, regions: list[Region], bodies: dict) -> tuple[str, dict] | None:
    """(the file's text, {task id: its region there}); a file or marker that is gone makes its tasks missing."""
    try:
        text = path.read_text()
        found = {r.task_id: r for r in file_regions(path, text)}
    except (OSError, UnicodeDecodeError, ValueError) as e:
        for r in regions:
            bodies[r.task_id] = Body(r, "missing", reasons=[f"{path.name}: {e}"])
        return None
    for r in regions:
        if r.task_id not in found:
            bodies[r.task_id] = Body(r, "missing", reasons=[f"no region marked '# TASK {r.task_id}' in {path.name}"])
    return text, {t: (r, text.splitlines()) for t, r in found.items()}


def _judge(ref: Region, ref_text: str, theirs) -> Body:
    """Not started (the hand-out's stub), refused (the wrong shape), or accepted."""
    region, lines = theirs
    body = region.body(lines)
    ref_lines = ref_text.splitlines()
    if _same_code(body, stub_body(ref_lines, ref)):
        return Body(ref, line=region.start + 1)
    reasons = screen("\n".join(body), ref.indent(ref_lines), whole_functions(ref_lines, ref))
    return Body(ref, "refused" if reasons else "accepted", body, reasons, region.start + 1)


def _same_code(a: list[str], b: list[str]) -> bool:
    """Equal as code (comments, blank lines and docstring edits aside): an untouched stub."""
    try:
        return _code(a) == _code(b)
    except SyntaxError:
        return False


def _code(lines: list[str]) -> str:
    tree = ast.parse(textwrap.dedent("\n".join(lines)) or "pass")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _outside(text: str, regions) -> list[str]:
    """The file's lines outside region bodies (and without a stubbed launcher's raise), stripped."""
    lines = text.splitlines()
    regions = [r[0] if isinstance(r, tuple) else r for r in regions]
    inside = {i for r in regions for i in range(r.start + 1 + r.header, r.end)}
    return [line.strip() for i, line in enumerate(lines) if i not in inside and _STUBBED_LAUNCHER not in line]


def _other_changes(root: Path, ws: Path, task_files: set[Path]) -> list[str]:
    notes = []
    for path in sorted((ws / "src").rglob("*.py")):
        rel = path.relative_to(ws)
        if rel in task_files or "__pycache__" in rel.parts:
            continue
        ref = root / rel
        if not ref.exists():
            notes.append(f"{rel}: not in the reference; ignored")
        elif path.read_bytes() != ref.read_bytes():
            notes.append(f"{rel}: changed, but it holds no task of this stage; ignored")
    return notes


def build_tree(root: Path, dest: Path, regions: list[Region], bodies: dict[str, list[str]], tests=False, hidden=None):
    """The teacher's src/ in `dest`, each region in `bodies` ({task id: body lines}) spliced in, every other
    region of `regions` stubbed; the teacher's tests/ and pyproject.toml too when `tests` (and `hidden` as
    tests/hidden/). Regions outside `regions` keep the teacher's code."""
    shutil.copytree(root / "src", dest / "src", ignore=_IGNORE)
    for path in sorted({r.path for r in regions}):
        lines = path.read_text().splitlines()
        for r in sorted((r for r in regions if r.path == path), key=lambda r: r.start, reverse=True):
            body = bodies[r.task_id] if r.task_id in bodies else stub_body(lines, r)
            lines[r.start + 1 + r.header : r.end] = body
        (dest / path.relative_to(root)).write_text("\n".join(lines) + "\n")
    if tests:
        copy_tests(root, dest / "tests")
        shutil.copy(root / "pyproject.toml", dest / "pyproject.toml")
    if hidden is not None:
        shutil.copytree(hidden, dest / "tests" / "hidden", ignore=_IGNORE)
        (dest / "tests" / "hidden" / "__init__.py").touch()
    return dest
