"""Course: the solution regions marked in src/, and the stubs a student copy gets in their place.

Builds on: nothing of pagedlab (it reads source files as text).
Read with: chapters/98-assignments.md, chapters/97-architecture.md (Assignments).

A region belongs to the stage named by its module's docstring ("Stage N: ..."),
or by its marker's own `stage N`. Its first line names the task and its points:

    # BEGIN SOLUTION                                             (the marker, alone on its line)
    # TASK free-queue (20 pts): the free-block queue: O(1) popleft, append and remove ...
    # TASK prefill-tile (30 pts, launcher=paged_prefill): ...      a region inside a @triton.jit body
    # TASK slot-mapping (20 pts, stage 2): ...                     a stage-2 task in a stage-1 file
    ...
    # END SOLUTION                                               (alone on its line)

In a student copy for stage N every stage-N region keeps its markers and its
task line, and its code becomes a stub (so do later stages' regions: their
answers are not handed out yet); earlier stages keep their solutions, so the
student builds on working code:

    def allocate(self, n): ...        ->      def allocate(self, n):
                                                  \"\"\"docstring kept\"\"\"
                                                  raise NotImplementedError("TASK pool-allocate-free: ...")

A region of whole functions keeps each signature and docstring; a region of
statements becomes one `raise`. Inside a `@triton.jit` body a stub cannot raise,
so the region becomes `pass` and the launcher named in `launcher=NAME` raises
instead (the student removes that line once the kernel is written; the grader
uses the teacher's launcher whatever the student does to it).
"""

from __future__ import annotations

import ast
import re
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"

_TASK = re.compile(r"#\s*TASK\s+([a-z0-9][a-z0-9-]*)\s+\((\d+)\s+pts?((?:,\s*[a-z]+[ =]\w+)*)\):\s*(.*)")


_STAGE = re.compile(r'"""Stage (\d):')


@dataclass
class Region:
    """One marked solution region: a task."""

    path: Path  # the source file
    stage: int  # from the marker, else the module docstring
    start: int  # line index of BEGIN (0-based)
    end: int  # line index of END
    task_id: str  # e.g. "free-queue": tests name it in @pytest.mark.task("free-queue")
    points: int
    task: str  # the hint
    launcher: str | None  # for a region inside a @triton.jit body: the launcher that raises instead
    header: int = 1  # lines of the task comment after BEGIN

    @property
    def label(self) -> str:
        return f"{self.path.name}:{self.start + 1}"

    def body(self, lines: list[str]) -> list[str]:
        """The region's code: the lines after its task comment, up to END."""
        return lines[self.start + 1 + self.header : self.end]

    def indent(self, lines: list[str]) -> str:
        return lines[self.start][: len(lines[self.start]) - len(lines[self.start].lstrip())]


def find_regions(src: Path) -> list[Region]:
    """Every region under `src`; malformed markers are a ValueError naming the file and line."""
    regions = []
    for path in sorted(src.rglob("*.py")):
        regions += file_regions(path, path.read_text())
    seen: dict[str, Region] = {}
    for r in regions:
        if r.task_id in seen:
            raise ValueError(f"{r.path}:{r.start + 2}: task {r.task_id!r} is also at {seen[r.task_id].label}")
        seen[r.task_id] = r
    return regions


def file_regions(path: Path, text: str) -> list[Region]:
    """The regions of one file's text (its own markers, in order)."""
    lines = text.splitlines()
    stage = _module_stage(lines)
    regions, begin = [], None
    for i, line in enumerate(lines):
        if line.strip() == BEGIN:
            if begin is not None:
                raise ValueError(f"{path}:{i + 1}: nested {BEGIN}")
            begin = i
        elif line.strip() == END:
            if begin is None:
                raise ValueError(f"{path}:{i + 1}: {END} without {BEGIN}")
            regions.append(_region(path, stage, lines, begin, i))
            begin = None
    if begin is not None:
        raise ValueError(f"{path}:{begin + 1}: {BEGIN} without {END}")
    return regions


def _module_stage(lines: list[str]) -> int | None:
    match = _STAGE.match(lines[0]) if lines else None
    return int(match.group(1)) if match else None


def _region(path: Path, stage: int | None, lines: list[str], begin: int, end: int) -> Region:
    match = _TASK.match(lines[begin + 1].strip()) if begin + 1 < end else None
    if match is None:
        raise ValueError(f"{path}:{begin + 2}: a region must start with a '# TASK name (P pts): ...' line")
    task_id, points, options, task = match.groups()
    opts = dict(re.split(r"[ =]", o.strip(), maxsplit=1) for o in options.split(",")[1:])
    if set(opts) - {"stage", "launcher"}:
        raise ValueError(f"{path}:{begin + 2}: unknown option in the task line: {sorted(set(opts))}")
    stage = int(opts["stage"]) if "stage" in opts else stage
    if stage is None:
        raise ValueError(f"{path}:1: a file with solution regions needs a 'Stage N:' module docstring")
    header = 1
    for line in lines[begin + 2 : end]:  # a hint may continue on further comment lines
        if not line.strip().startswith("#"):
            break
        task += " " + line.strip().lstrip("#").strip()
        header += 1
    return Region(path, stage, begin, end, task_id, int(points), task, opts.get("launcher"), header)


def stage_regions(root: Path, number: int) -> list[Region]:
    return [r for r in find_regions(root / "src" / "pagedlab") if r.stage == number]


def unshipped_regions(root: Path, number: int) -> list[Region]:
    """The regions a stage-N student copy stubs: stage N's tasks, and every later stage's (not yet handed out:
    their answers are not shipped either). Earlier stages keep their solutions."""
    return [r for r in find_regions(root / "src" / "pagedlab") if r.stage >= number]


def stub_source(text: str, regions: list[Region]) -> str:
    """The file's text with the given regions (all from this file) replaced by stubs; the markers stay."""
    lines = text.splitlines()
    launchers = {r.launcher for r in regions if r.launcher}
    for region in sorted(regions, key=lambda r: r.start, reverse=True):
        lines[region.start : region.end + 1] = _stub_lines(lines, region)
    out = "\n".join(lines) + "\n"
    for name in launchers:
        r = next(r for r in regions if r.launcher == name)
        out = _raise_in_function(
            out, name, f"TASK {r.task_id}: {r.task} (kernel stubbed: write it, then delete this line)"
        )
    return out


def stub_body(lines: list[str], region: Region) -> list[str]:
    """What a region's code becomes in the student's copy (also what the grader runs for a refused task)."""
    indent = region.indent(lines)
    hint = f"TASK {region.task_id}: {region.task}"
    body = textwrap.dedent("\n".join(region.body(lines)))
    if region.launcher:
        return [f"{indent}pass"]
    tree = ast.parse(body)
    if all(isinstance(node, ast.FunctionDef) for node in tree.body):
        return _stub_functions(body, tree, indent, hint)
    return [f"{indent}raise NotImplementedError({hint!r})"]


def whole_functions(lines: list[str], region: Region) -> list[str] | None:
    """The functions a region of whole functions defines; None for a region of statements."""
    tree = ast.parse(textwrap.dedent("\n".join(region.body(lines))))
    if tree.body and all(isinstance(node, ast.FunctionDef) for node in tree.body):
        return [node.name for node in tree.body]
    return None


def _stub_lines(lines: list[str], region: Region) -> list[str]:
    head = lines[region.start : region.start + 1 + region.header]
    return [*head, *stub_body(lines, region), lines[region.end]]


def _stub_functions(body: str, tree: ast.Module, indent: str, hint: str) -> list[str]:
    """Keep each function's decorators, signature and docstring; its body raises."""
    src = body.splitlines()
    out = []
    for fn in tree.body:
        first_stmt = fn.body[0]
        doc = ast.get_docstring(fn, clean=False)
        keep_to = first_stmt.end_lineno if doc is not None else first_stmt.lineno - 1
        start = min([d.lineno for d in fn.decorator_list] + [fn.lineno]) - 1
        inner = src[first_stmt.lineno - 1][: first_stmt.col_offset]
        out += [indent + line if line else line for line in src[start:keep_to]]
        out += [f"{indent}{inner}raise NotImplementedError({hint!r})", ""]
    return out[:-1]


def _raise_in_function(text: str, name: str, message: str) -> str:
    """Insert `raise NotImplementedError(message)` as the first statement of top-level function `name`."""
    tree = ast.parse(text)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = text.splitlines()
    first = fn.body[0]
    at = first.end_lineno if ast.get_docstring(fn) is not None else first.lineno - 1
    pad = " " * first.col_offset
    lines.insert(at, f"{pad}raise NotImplementedError({message!r})")
    return "\n".join(lines) + "\n"


def copy_tests(root: Path, out: Path) -> None:
    """The checkout's tests/ into `out`, less tests/scripts/: those test the maintainers' scripts/, which no
    workspace or autograder holds. (The teacher's autograder only: a student's tree gets `student_tests`.)"""
    skip = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder).resolve() == (root / "tests").resolve()
        return set(skip(folder, names)) | ({"scripts"} if top else set())

    shutil.copytree(root / "tests", out, ignore=ignore)


def student_tests(root: Path, number: int) -> list[Path]:
    """The test files a stage-N student may hold, an allow-list: those tagged with a task of stage N or earlier,
    the helpers they import from tests/ (followed through), conftest.py and the packages' __init__.py. Never the
    grader's own tests (tests/course/: honest solutions, mutants of the reference) nor the maintainers'."""
    tests = root / "tests"
    tasks = {r.task_id for r in find_regions(root / "src" / "pagedlab") if r.stage <= number}
    grader = (tests / "course", tests / "scripts")
    keep, todo = set(), [tests / "conftest.py", *(p for p in tests.rglob("test_*.py") if _task_marks(p) & tasks)]
    while todo:
        path = todo.pop()
        if path in keep or not path.is_file() or any(path.is_relative_to(g) for g in grader):
            continue
        keep.add(path)
        todo += _test_imports(root, path)
    packages = {parent / "__init__.py" for p in keep for parent in p.parents if parent.is_relative_to(tests)}
    return sorted(keep | {p for p in packages if p.is_file()})


def copy_student_tests(root: Path, out: Path, number: int) -> None:
    """`student_tests(root, number)` into `out` (a tree's tests/), in their folders."""
    for path in student_tests(root, number):
        target = out / path.relative_to(root / "tests")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _task_marks(path: Path) -> set[str]:
    return set(re.findall(r"""mark\.task\(\s*["']([a-z0-9-]+)["']""", path.read_text()))


def _test_imports(root: Path, path: Path) -> list[Path]:
    """The modules of tests/ that `path` imports (`from tests.a.b import c` may name tests/a/b/c.py too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tests":
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] == "tests"]
        for name in names:
            base = root.joinpath(*name.split("."))
            found += [base.with_suffix(".py"), base / "__init__.py"]
    return found


def repo_root() -> Path:
    """The source checkout holding src/, tests/, notebooks/ and chapters/ (assignments need all four)."""
    root = Path(__file__).resolve().parents[3]
    for part in ("src", "tests", "chapters"):
        if not (root / part).is_dir():
            raise ValueError(f"assignment: needs a source checkout of pagedlab; {root / part} is missing")
    return root
