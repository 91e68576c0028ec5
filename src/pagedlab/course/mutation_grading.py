"""Course: grading a student's tests by the mutants they kill: `pagedlab assignment grade DIR --stage N --tests`.

Builds on: course/mutation.py (the mutants), course/mutation_runner.py (the child), course/mutation_report.py,
course/sandbox.py, course/messages.py, course/grading.py (the reference's observations, the child's environment).
Read with: chapters/98-assignments.md (Tests graded by the bugs they catch).

A workspace is the student's; only its tests/ is read, as bounded text, and
the kind of assignment is the teacher's word (`--tests`), never assignment.json's:

    1. read every .py file under tests/ (regular files inside the folder, within size and count limits); the
       teacher's tests/conftest.py stands in for the student's
    2. run them on the reference, sandboxed; a test that fails there (or a file that does not collect) is
       dropped and reported: it would "kill" every mutant and tell nothing; with no test left, the score is 0
    3. draw the mutants with the grading's seed (course/mutation.py) and the drills' faults
    4. the equivalent-mutant filter: run every task's scenarios (the cases that grade the code assignment, seeds
       drawn as grading.py draws them) on each mutant, sandboxed; a mutant whose every observation equals the
       reference's is one no test can be blamed for missing: it leaves the denominator
    5. run the kept tests on each other mutant, several mutants to a sandboxed child (one fork each); a mutant
       is killed when a test fails or errors, or the run crashes or times out. Each child also runs the
       reference at a place only the grader knows: should it fail there, that child's mutants count as
       survived (a flaky test, or one that keeps state between runs, kills nothing)
    6. score = points x killed / counted; the report names what survived by kind, file and task, never a line
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pagedlab.course import grading, messages, mutation_report, sandbox
from pagedlab.course.compare import first_difference
from pagedlab.course.mutation import Mutant, draw
from pagedlab.course.regions import repo_root, stage_regions, unshipped_regions
from pagedlab.course.scenarios import stage_scenarios
from pagedlab.course.submission import build_tree
from pagedlab.model.files import model_file, read_bounded
from pagedlab.stages import parse_stage

COUNT = 36  # mutants drawn per grading (the drills' faults come on top)
MAX_FILES = 40  # .py files read from the student's tests/
FILE_LIMIT = 256 << 10  # bytes per file
TOTAL_LIMIT = 2 << 20  # bytes in all
WARM = ("torch", "numpy", "pytest", "hypothesis")  # imported once per child, before its forks
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EQUIVALENT: dict = {}  # (root, stage, seed, labels) -> the labels of the equivalent mutants


def grade_tests(workspace, stage, seed: int | None = None, count: int = COUNT,
                per_test_timeout: float = grading.PER_TEST_TIMEOUT,
                total_timeout: float = grading.TOTAL_TIMEOUT) -> dict:  # fmt: skip
    """Grade the tests in `workspace`/tests as stage `stage`'s tests assignment (the teacher's word); Gradescope's
    keys, plus `mutants` (drawn, equivalent, counted, killed), `survived`, `dropped`, `seed` and `isolation`."""
    started = time.monotonic()
    number, root = parse_stage(stage), repo_root()
    regions = stage_regions(root, number)
    if not regions:
        raise ValueError(f"stage: stage {number} has no tasks")
    files, notes = read_tests(Path(workspace))
    seed = secrets.randbelow(1 << 31) if seed is None else seed
    limits = grading.Limits(per_test_timeout, started + total_timeout, grading.forbidden_folders(root, Path(workspace)))
    mutants = draw(root, number, seed, count)
    with tempfile.TemporaryDirectory(prefix="pagedlab-mutants-") as tmp:
        tmp = Path(tmp)
        reference = _reference_run(root, tmp, number, files, limits) if _test_files(files) else None
        kept = [t for t, outcome in (reference or {}).get("tests", []) if outcome == "passed"]
        dropped = [[t, o] for t, o in (reference or {}).get("tests", []) if o not in ("passed", "skipped")]
        equivalent = equivalent_mutants(root, number, seed, mutants, limits, tmp)
        counted = [m for m in mutants if m.label not in equivalent]
        killed, void = {}, 0
        if kept and counted:
            limit = min(per_test_timeout, 5.0 + 3 * reference["seconds"])
            killed, void = _mutant_runs(root, tmp, number, files, dropped, counted, limit, limits)
    found = {"equivalent": equivalent, "counted": counted, "killed": killed, "void": void, "dropped": dropped,
             "kept": kept}  # fmt: skip
    out = mutation_report.report(number, regions, mutants, found, notes, bool(_test_files(files)))
    out.update(seed=seed, isolation=_isolation(), execution_time=round(time.monotonic() - started, 1))
    return out


def read_tests(ws: Path) -> tuple[dict[str, str], list[str]]:
    """{path under tests/: text} of the workspace's .py files (regular files inside it, plain names, bounded);
    notes on what was left out. The top conftest.py is the teacher's, always."""
    top, files, notes, total = ws / "tests", {}, [], 0
    if not top.is_dir() or top.is_symlink():
        return {}, ["no tests/ folder: nothing to grade"]
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if _NAME.fullmatch(d))
        for name in sorted(n for n in names if n.endswith(".py")):
            rel = (Path(folder) / name).relative_to(top).as_posix()
            if not _NAME.fullmatch(name[:-3]):
                notes.append(f"tests/{rel}: not a plain module name; ignored")
                continue
            if len(files) >= MAX_FILES:
                return files, notes + [f"more than {MAX_FILES} files under tests/: the rest ignored"]
            try:
                data = read_bounded(model_file(ws, f"tests/{rel}", "test file", kind="workspace"), "test file",
                                    FILE_LIMIT)  # fmt: skip
                text = data.decode()
            except (ValueError, UnicodeDecodeError) as e:
                notes.append(f"tests/{rel}: ignored ({str(e)[-160:]})")
                continue
            if rel == "conftest.py":
                if data != _teachers_conftest():
                    notes.append("tests/conftest.py: changed, but the teacher's is used (fixtures go in test files)")
                continue
            total += len(data)
            if total > TOTAL_LIMIT:
                return files, notes + [f"more than {TOTAL_LIMIT >> 20} MiB under tests/: the rest ignored"]
            files[rel] = text
    return files, notes


def _teachers_conftest() -> bytes:
    path = repo_root() / "tests" / "conftest.py"
    return path.read_bytes() if path.is_file() else b""


def equivalent_mutants(root: Path, number: int, seed: int, mutants: list[Mutant], limits, tmp: Path) -> set[str]:
    """The labels of the mutants whose every scenario observation equals the reference's (computed once per
    seed and draw: they depend on the teacher's code only). A reference run that does not equal its own
    observations in the sandbox is the teacher's problem: a RuntimeError."""
    key = (str(root), number, seed, tuple(m.label for m in mutants))
    if key in _EQUIVALENT:
        return _EQUIVALENT[key]
    scenarios = stage_scenarios(number)
    expected, seeds = grading.reference_observations(root, number, seed, list(scenarios))
    warm = sorted({m.split(".")[0] for s in scenarios.values() for m in s.warm} - {"pagedlab"})
    spec = {"mode": "scenarios", "stage": number, "cases": {t: list(c) for t, c in expected.items()},
            "seeds": seeds, "adaptive": True, "warm": warm}  # fmt: skip
    batches = _batches(mutants)
    with ThreadPoolExecutor(len(batches) or 1) as pool:
        runs = [pool.submit(_child, root, tmp / f"equivalence-{i}", number, None, b, spec, limits.per_item, limits,
                            control_first=True) for i, b in enumerate(batches)]  # fmt: skip
        found = [run.result() for run in runs]
    same = set()
    for batch, (verdicts, control) in zip(batches, found):
        if control is None or not _observes(expected, control, list(expected)):
            raise RuntimeError(f"stage {number}: the reference's scenarios differ in the sandbox: {control}")
        same |= {m.label for m in batch if _observes(expected, verdicts.get(m.label), _observers(scenarios, m))}
    _EQUIVALENT[key] = same
    while len(_EQUIVALENT) > 16:
        _EQUIVALENT.pop(next(iter(_EQUIVALENT)))
    return same


def _observers(scenarios: dict, mutant: Mutant) -> list[str] | None:
    """The tasks whose scenarios can reach the mutant's code: its own, and those built on it (the others' cases
    never run it: at grading their trees hold it as a stub). None (every task) for one outside the regions."""
    if not mutant.task:
        return None
    return [t for t, s in scenarios.items() if t == mutant.task or mutant.task in s.builds_on]


def _observes(expected: dict, msg: dict | None, tasks: list[str] | None) -> bool:
    """Whether a scenarios run saw exactly the reference's observations (of `tasks`; None: all)."""
    if msg is None or msg["verdict"] != "passed" or not isinstance(msg.get("obs"), dict):
        return False
    obs = msg["obs"]
    for task in tasks if tasks is not None else list(expected):
        for name, want in expected[task].items():
            got = obs.get(task, {}).get(name) if isinstance(obs.get(task), dict) else None
            if not (isinstance(got, list) and len(got) == 2 and got[0] == "ok"):
                return False
            if first_difference(want, got[1]) is not None:
                return False
    return True


def _reference_run(root: Path, tmp: Path, number: int, files: dict, limits) -> dict | None:
    """The student's tests on the reference: {"tests": [[id, outcome]], "seconds": s}; None if it never reported."""
    spec = {"mode": "tests", "files": _test_files(files), "warm": list(WARM), "later_tasks": _later(root, number)}
    verdicts, control = _child(root, tmp / "reference", number, files, [], spec, limits.per_item * 5, limits)
    return control


def _mutant_runs(root, tmp, number, files, dropped, counted, limit, limits) -> tuple[dict, int]:
    """{label: killed?} for every counted mutant, and how many were voided by a failing reference run."""
    broken = {t for t, _ in dropped if "::" not in t}  # files that do not collect on the reference
    spec = {"mode": "tests", "files": [f for f in _test_files(files) if f not in broken], "warm": list(WARM),
            "first_failure": True, "deselect": [t for t, _ in dropped if "::" in t],
            "later_tasks": _later(root, number)}  # fmt: skip
    batches = _batches(counted)
    with ThreadPoolExecutor(len(batches)) as pool:
        runs = [pool.submit(_child, root, tmp / f"mutants-{i}", number, files, b, spec, limit, limits)
                for i, b in enumerate(batches)]  # fmt: skip
        found = [run.result() for run in runs]
    killed, void = {}, 0
    for batch, (verdicts, control) in zip(batches, found):
        fair = control is not None and control["verdict"] == "passed"
        void += 0 if fair else len(batch)
        for m in batch:
            msg = verdicts.get(m.label)
            killed[m.label] = fair and msg is not None and msg["verdict"] in ("failed", "timeout", "crashed")
    return killed, void


def _batches(mutants: list[Mutant]) -> list[list[Mutant]]:
    jobs = max(1, min(len(mutants), os.cpu_count() or 1, 4))
    return [b for b in (mutants[i::jobs] for i in range(jobs)) if b]


def _child(root, dest, number, files, mutants, spec, limit, limits, control_first=False) -> tuple[dict, dict | None]:
    """Run `mutants` and the reference (first, or at a random place) in sandboxed children on one tree, until
    each has a verdict or the grading's time is up. ({mutant label: its message}, the reference's message).
    A variant that started and never reported crashed (killed: it is what a crash looks like)."""
    ids = {secrets.token_hex(6): m for m in mutants}
    observers = (
        {v: _observers(stage_scenarios(number), m) for v, m in ids.items()} if spec["mode"] == "scenarios" else {}
    )
    control = secrets.token_hex(6)
    order = list(ids)
    order.insert(0 if control_first else secrets.randbelow(len(order) + 1), control)
    tree = _tree(root, dest, number, files, ids)
    test_files = spec.get("files", [])
    got: dict[str, dict] = {}
    remaining = order
    while remaining and time.monotonic() < limits.deadline:
        variants = [{"id": v, "path": ids[v].path if v in ids else ""} for v in remaining]
        for variant in variants:
            if observers.get(variant["id"]) is not None:
                variant["tasks"] = observers[variant["id"]]
        full = {**spec, "variants": variants, "limit": limit, "isolated": sandbox.isolation()[0]}
        run = sandbox.run(tree, "src/pagedlab/course/mutation_runner.py", json.dumps(full).encode() + b"\n",
                          grading.child_env(), limits.deadline - time.monotonic(), dest.parent / f"{dest.name}.log",
                          limits.forbidden, item_limit=limit + 15)  # fmt: skip
        current = None
        for msg in messages.variant_messages(run.output, remaining, test_files):
            if "start" in msg:
                current = msg["start"]
            else:
                got.setdefault(msg["variant"], msg)
                current = None
        if current is not None and current not in got:
            got[current] = {"variant": current, "verdict": "crashed", "seconds": 0.0}
        left = [v for v in remaining if v not in got]
        if len(left) == len(remaining):
            break
        remaining = left
    shutil.rmtree(tree, ignore_errors=True)
    return {ids[v].label: msg for v, msg in got.items() if v in ids}, got.get(control)


def _tree(root: Path, dest: Path, number: int, files: dict | None, ids: dict[str, Mutant]) -> Path:
    """The reference as a stage-N tests copy holds it (later stages stubbed), each mutant's file in
    variants/<id>/, and (for the tests) pyproject.toml, the teacher's tests/conftest.py and the student's files."""
    later = [r for r in unshipped_regions(root, number) if r.stage > number]
    build_tree(root, dest, later, {})
    shutil.rmtree(dest / "src" / "pagedlab" / "course" / "drills", ignore_errors=True)  # the faults: not in reach
    for vid, m in ids.items():
        target = dest / "variants" / vid / m.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(m.text)
    if files is not None:
        shutil.copy(root / "pyproject.toml", dest / "pyproject.toml")
        (dest / "tests").mkdir()
        for name in ("conftest.py", "__init__.py"):
            if (root / "tests" / name).is_file():
                shutil.copy(root / "tests" / name, dest / "tests" / name)
        for rel, text in files.items():
            target = dest / "tests" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            for parent in target.parents:  # a package per folder, as tests/ is one
                if parent == dest / "tests":
                    break
                (parent / "__init__.py").touch()
    return dest


def _later(root: Path, number: int) -> list[str]:
    """The later stages' tasks: a test tagged with one (`pytest.mark.task`) tests a stub here, and is not run."""
    return [r.task_id for r in unshipped_regions(root, number) if r.stage > number]


def _test_files(files: dict) -> list[str]:
    return [f"tests/{rel}" for rel in sorted(files) if Path(rel).name.startswith("test_")]


def _isolation() -> str:
    isolated, why = sandbox.isolation()
    return f"bwrap: {why}" if isolated else f"none: {why}"
