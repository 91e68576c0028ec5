"""Course: the tests assignment: `pagedlab assignment make N --tests --out DIR`, a copy in which the student writes
tests for stage N's components, and the teacher's check of it.

Builds on: course/regions.py (regions, stubs, the tests' imports), course/mutation_grading.py (the grader).
Read with: chapters/98-assignments.md (Tests graded by the bugs they catch).

The copy holds the full reference of stage N and earlier (the student tests
working code), later stages' regions stubbed as in any copy, the teacher's
tests/conftest.py, a starting tests/test_mine.py with no assertion, the
stage's chapter and notebook, and a hand-out saying what is graded. It holds
none of the project's tests (they would be the answer), none of the grader's,
and not course/drills/ (the drills' faults are among the graded mutants).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from pagedlab.course import mutation_grading
from pagedlab.course.regions import _task_marks, _test_imports, repo_root, stage_regions, stub_source, unshipped_regions
from pagedlab.course.submission import SRC_IGNORE
from pagedlab.stages import STAGE_NAMES, STAGES, parse_stage

STARTER = '''"""My tests for stage {number} ({name}): each passes on this copy, and fails on a copy with a bug."""

from {module} import {symbol}  # noqa: F401  (an example import: the component under test)


def test_example():
    pass  # replace with a small story: a fresh {symbol}, a few operations, the exact result asserted
'''


def make_tests(stage: int | str, out: str | Path) -> Path:
    """Write a tests-assignment workspace for `stage` into `out` (which must not exist or be empty)."""
    number, out, root = parse_stage(stage), Path(out), repo_root()
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} exists and is not empty")
    regions = stage_regions(root, number)
    if not regions:
        raise ValueError(f"stage: stage {number} has no solution regions")
    shutil.copytree(root / "src", out / "src", ignore=SRC_IGNORE)
    later = [r for r in unshipped_regions(root, number) if r.stage > number]
    for path in {r.path for r in later}:
        target = out / path.relative_to(root)
        target.write_text(stub_source(path.read_text(), [r for r in later if r.path == path]))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, out / name)
    (out / "tests").mkdir()
    for name in ("conftest.py", "__init__.py"):
        if (root / "tests" / name).is_file():
            shutil.copy(root / "tests" / name, out / "tests" / name)
    first = next((r for r in regions if "/kv/" in str(r.path) or "/sched/" in str(r.path)), regions[0])
    module = "pagedlab." + str(first.path.relative_to(root / "src" / "pagedlab"))[:-3].replace("/", ".")
    (out / "tests" / "test_mine.py").write_text(
        STARTER.format(number=number, name=STAGE_NAMES[number], module=module, symbol=_symbol(first))
    )
    _copy_reading(root, out, number)
    components = [{"task": r.task_id, "file": str(r.path.relative_to(root)), "line": r.start + 1, "what": r.task}
                  for r in regions]  # fmt: skip
    info = {"stage": number, "name": STAGE_NAMES[number], "kind": "tests", "components": components,
            "mutants": mutation_grading.COUNT}  # fmt: skip
    (out / "assignment.json").write_text(json.dumps(info, indent=2) + "\n")
    (out / "HANDOUT.md").write_text(handout(number, components))
    return out


def _symbol(region) -> str:
    """The class (or function) the region's code sits in: a name worth importing in the starter file."""
    import ast

    tree = ast.parse(region.path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.lineno <= region.start + 1 <= node.end_lineno:
            return node.name
    return next(n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)))


def _copy_reading(root: Path, out: Path, number: int) -> None:
    for attr, folder in (("notebook", "notebooks"), ("chapter", "chapters")):
        source = root / getattr(STAGES[number], attr)
        if source.exists():
            (out / folder).mkdir(exist_ok=True)
            shutil.copy(source, out / folder / source.name)


def handout(number: int, components: list[dict]) -> str:
    rows = "\n".join(f"| `{c['task']}` | `{c['file']}` line {c['line']} | {c['what']} |" for c in components)
    return f"""# Stage {number} ({STAGE_NAMES[number]}): tests graded by the bugs they catch

This copy holds the working code of stage {number}. Your task is to write the tests: put them in
`tests/` (start from `tests/test_mine.py`; any `test_*.py` file there counts, and helper modules beside them).

| component | where | what it does |
|---|---|---|
{rows}

## How it is graded

1. Your tests run on the reference (this code). A test that fails there is dropped and listed; a file that does
   not import is dropped whole. With no test passing, the score is 0.
2. The grader makes about {mutation_grading.COUNT} **mutants** of the code above, drawn when grading starts: one
   small slip each (an operator swapped, `<` for `<=`, `+` for `-`, `and` for `or`; a constant or a slice bound
   off by one; a statement removed; a condition negated), plus some realistic faults.
3. A mutant that no grading scenario can tell from the reference does not count (no test could be blamed).
4. Your tests run on every other mutant: it is **killed** when a test fails or errors (or the run hangs).
   Score = points x killed / counted. The report tells you which kinds of mutant survived, in which file.

Run `pytest tests/` here: every test must pass. Tests that read the source code instead of running it, or that
pass or fail by chance, score nothing: a run of your tests on the reference, hidden among the mutants, must pass.
`tests/conftest.py` is the teacher's (a fixed hypothesis profile): put your fixtures in your test files.
"""


def project_tests(root: Path, number: int) -> list[Path]:
    """The project's own test files for stage `number`'s tasks (those tagging one), and the tests/ modules they
    import: what a teacher compares a student's tests with."""
    tasks = {r.task_id for r in stage_regions(root, number)}
    tests = root / "tests"
    keep, todo = set(), [p for p in tests.rglob("test_*.py") if _task_marks(p) & tasks]
    while todo:
        path = todo.pop()
        if path in keep or not path.is_file() or path.is_relative_to(tests / "course"):
            continue
        keep.add(path)
        todo += _test_imports(root, path)
    return sorted(p for p in keep if p.name != "__init__.py")


def check_tests_stages(stages, count: int = mutation_grading.COUNT, seed: int = 0, out=None) -> list[dict]:
    """Grade, for each stage, a copy holding only the starter file and one holding the project's own tests for the
    stage: a teacher's check that an empty file scores 0 and good tests near the top. One row per stage."""
    root, rows = repo_root(), []
    for number in stages:
        with tempfile.TemporaryDirectory() as tmp:
            empty = make_tests(number, Path(tmp) / "empty")
            ours = make_tests(number, Path(tmp) / "ours")
            (ours / "tests" / "test_mine.py").unlink()
            for path in project_tests(root, number):
                target = ours / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            results = [mutation_grading.grade_tests(ws, number, seed=seed, count=count) for ws in (empty, ours)]
        rows.append({"stage": number, "files": [str(p.relative_to(root)) for p in project_tests(root, number)],
                     "empty": results[0], "ours": results[1]})  # fmt: skip
        if out is not None:
            print(check_tests_table(rows[-1:]).splitlines()[-1], file=out, flush=True)
            for result in results:
                print(result["output"], file=out, flush=True)
    return rows


def check_tests_table(rows: list[dict]) -> str:
    """The check's rows as chapter 98's markdown table."""
    lines = ["| stage | mutants (drawn / equivalent / counted) | empty file | the project's tests | dropped "
             "| grading time (empty / project) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        e, o = r["empty"], r["ours"]
        m = o["mutants"]
        lines.append(
            f"| {r['stage']} {STAGE_NAMES[r['stage']]} | {m['drawn']} / {m['equivalent']} / {m['counted']} "
            f"| {e['score']:g} / {e['max_score']} | {o['score']:g} / {o['max_score']} ({m['killed']} killed) "
            f"| {len(o['dropped'])} of {o['kept'] + len(o['dropped'])} "
            f"| {e['execution_time']:.0f} s / {o['execution_time']:.0f} s |"
        )
    return "\n".join(lines)
