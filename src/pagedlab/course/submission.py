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
import os
import shutil
import stat
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from pagedlab.course.regions import (
    Region,
    copy_student_tests,
    file_regions,
    stub_body,
    stub_source,
    unshipped_regions,
    whole_functions,
)
from pagedlab.course.screening import screen
from pagedlab.model.files import model_file, read_bounded

_STUBBED_LAUNCHER = "(kernel stubbed: write it, then delete this line)"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis", "*.pyc", ".pytest_cache")
# src/ as a student's copy or a graded tree holds it: without course/drills/, whose faults and post-mortems quote
# lines of the reference's regions
SRC_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis", "*.pyc", ".pytest_cache", "drills")
SOURCE_LIMIT = 1 << 20  # bytes: the largest source file of the package is ~30 KiB
MAX_NOTES = 50


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
    later = [r for r in unshipped_regions(root, regions[0].stage) if r not in regions] if regions else []
    for path in sorted({r.path for r in regions}):
        mine = [r for r in regions if r.path == path]
        ref_text = handed_out(path, later)
        found = _student_file(ws, path.relative_to(root), mine, bodies)
        if found is None:
            continue
        text, theirs = found
        for r in mine:
            if r.task_id in theirs:
                bodies[r.task_id] = _judge(r, ref_text, theirs[r.task_id])
        if _outside(text, list(theirs.values())) != _outside(ref_text, mine):
            notes.append(f"{path.relative_to(root)}: changes outside the task regions are ignored")
    return bodies, notes + _other_changes(root, ws, {r.path.relative_to(root) for r in regions}, later)


def handed_out(path: Path, later: list[Region]) -> str:
    """The reference file as a student copy holds it outside the stage's own regions: later stages' stubbed."""
    return stub_source(path.read_text(), [r for r in later if r.path == path])


def _student_file(ws: Path, rel: Path, regions: list[Region], bodies: dict) -> tuple[str, dict] | None:
    """(the file's text, {task id: its region there}); a file or marker that is gone makes its tasks missing, as
    does a file that is not a regular file inside the workspace or is larger than any source file (a FIFO, a link
    to /dev/zero or out of the workspace: read from nobody's folder, never opened)."""
    path = ws / rel
    try:
        text = read_bounded(model_file(ws, str(rel), "task file", kind="workspace"), "task file", SOURCE_LIMIT).decode()
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


def _other_changes(root: Path, ws: Path, task_files: set[Path], later: list[Region]) -> list[str]:
    """Notes on the workspace's other .py files (ignored): new ones, changed ones. Walked without following links,
    read only if regular and of a source file's size; at most MAX_NOTES of them."""
    notes = []
    for folder, dirs, files in os.walk(ws / "src"):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(folder) / name
            rel = path.relative_to(ws)
            if rel not in task_files:
                notes += _other_change(path, rel, root / rel, later)
            if len(notes) >= MAX_NOTES:
                return notes[:MAX_NOTES] + ["(more files changed; not listed)"]
    return notes


def _other_change(path: Path, rel: Path, ref: Path, later: list[Region]) -> list[str]:
    if not ref.exists():
        return [f"{rel}: not in the reference; ignored"]
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > SOURCE_LIMIT:
        return [f"{rel}: not a regular source file; ignored"]
    if path.read_text(errors="replace") != handed_out(ref, later):
        return [f"{rel}: changed, but it holds no task of this stage; ignored"]
    return []


def build_tree(root: Path, dest: Path, regions: list[Region], bodies: dict[str, list[str]], tests=None, hidden=None):
    """The teacher's src/ in `dest`, each region in `bodies` ({task id: body lines}) spliced in, every other
    region of `regions` stubbed; when `tests` is a stage number, that stage's student tests (never the grader's
    own) and pyproject.toml too (and `hidden` as tests/hidden/). Regions outside `regions` keep the teacher's
    code."""
    shutil.copytree(root / "src", dest / "src", ignore=SRC_IGNORE)
    for path in sorted({r.path for r in regions}):
        lines = path.read_text().splitlines()
        for r in sorted((r for r in regions if r.path == path), key=lambda r: r.start, reverse=True):
            body = bodies[r.task_id] if r.task_id in bodies else stub_body(lines, r)
            lines[r.start + 1 + r.header : r.end] = body
        (dest / path.relative_to(root)).write_text("\n".join(lines) + "\n")
    if tests is not None:
        copy_student_tests(root, dest / "tests", tests)
        shutil.copy(root / "pyproject.toml", dest / "pyproject.toml")
    if hidden is not None:
        shutil.copytree(hidden, dest / "tests" / "hidden", ignore=_IGNORE)
        (dest / "tests" / "hidden" / "__init__.py").touch()
    return dest
