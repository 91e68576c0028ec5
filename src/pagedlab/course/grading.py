"""Course: grading a workspace: `pagedlab assignment grade DIR --stage N [--json [FILE]]`.

Builds on: course/submission.py (bodies, trees), course/scenarios/ (what grades a task), course/sandbox.py (where
student code runs), course/compare.py, course/feedback.py (the tests, for feedback), course/report.py.
Read with: chapters/98-assignments.md (Grading, The boundary).

A workspace is the student's; nothing in it is trusted, not even the stage it
claims. The score is decided here, in the trusted process, from plain data:

    1. read each region's body as text (course/submission.py); an untouched stub scores 0 and never runs
    2. draw a seed; run every task's scenarios on the teacher's reference, here, in this process
    3. for each started task, build a tree: the teacher's src/ with only that task's body spliced in (every
       other task keeps the teacher's code, so each task earns its points alone), and run the same scenarios
       there in a sandbox that holds no secret (course/sandbox.py), the seed given only at run time
    4. a case passes when the student's observations equal the reference's (course/compare.py); a task scores
       its points times the share of its cases that passed; a case that hung, crashed or never reported failed
    5. for a task that lost points, run its tests in the student's own tree (all their bodies), sandboxed, and
       show the first failing assertion: feedback only (course/feedback.py)
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pagedlab.course import feedback, report, sandbox
from pagedlab.course.compare import first_difference
from pagedlab.course.regions import repo_root, stage_regions
from pagedlab.course.scenarios import run_case, stage_scenarios
from pagedlab.course.submission import Body, build_tree, read_bodies
from pagedlab.stages import parse_stage

PER_TEST_TIMEOUT = 60.0  # seconds one scenario case or one test may run
TOTAL_TIMEOUT = 900.0  # seconds for the whole grading
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TRITON_INTERPRET": "1",  # no GPU in the sandbox: Triton's interpreter, on the CPU
    "MPLBACKEND": "Agg",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "HYPOTHESIS_STORAGE_DIRECTORY": "/tmp/.hypothesis",
}
_EXPECTED: dict = {}  # (root, stage, seed, task) -> {case: observation}: a batch computes the reference once
_COLLECTED: dict = {}  # (root, stage) -> {task: test ids}


@dataclass(frozen=True)
class Limits:
    """What bounds every child of one grading."""

    per_item: float  # seconds one case or one test may run
    deadline: float  # time.monotonic() at which the whole grading stops
    forbidden: list  # folders the fallback's audit hook refuses (the teacher's checkout, the workspace)


@dataclass
class TaskResult:
    """One task as graded."""

    body: Body
    cases: dict[str, str | None] = field(default_factory=dict)  # case -> None (passed) or why it failed
    feedback: str = ""  # the first failing test and its assertion, in one or two lines

    @property
    def fraction(self) -> float:
        return sum(why is None for why in self.cases.values()) / len(self.cases) if self.cases else 0.0


def grade(workspace, stage, extra_tests=None, per_test_timeout=PER_TEST_TIMEOUT, total_timeout=TOTAL_TIMEOUT,
          seed: int | None = None, run_feedback: bool = True) -> dict:  # fmt: skip
    """Grade `workspace` as stage `stage` (the teacher's word); Gradescope's results, plus `max_score`, `tasks`,
    `seed` and `isolation`. `seed` fixes the seeded cases (default: drawn now)."""
    started = time.monotonic()
    number, ws, root = parse_stage(stage), _workspace(Path(workspace)), repo_root()
    regions = stage_regions(root, number)
    if not regions:
        raise ValueError(f"stage: stage {number} has no tasks")
    hidden = feedback.check_hidden_tests(extra_tests, [r.task_id for r in regions])
    bodies, notes = read_bodies(root, ws, regions)
    for r in regions:
        bodies.setdefault(r.task_id, Body(r))
    seed = secrets.randbelow(1 << 31) if seed is None else seed
    local = (root / "assignment.json").exists()  # a student's copy grading itself: only the visible cases
    started_tasks = [t for t, b in bodies.items() if b.status == "accepted"]
    expected = _expected(root, number, None if local else seed, started_tasks)
    limits = Limits(per_test_timeout, started + total_timeout, _forbidden(root, ws))
    with tempfile.TemporaryDirectory(prefix="pagedlab-grade-") as tmp:
        results = _run_tasks(root, Path(tmp), number, bodies, expected, seed, limits)
        hidden_tests = []
        if run_feedback:
            hidden_tests = feedback.attach(root, Path(tmp), regions, results, hidden, CHILD_ENV, limits)
    out = report.results(root, number, results, hidden_tests, notes, seed, local, sandbox.isolation())
    out["execution_time"] = round(time.monotonic() - started, 1)
    return out


def collect_tasks(stage) -> dict[str, list[str]]:
    """{task id: the ids of the teacher's tests that check it} (the hand-out lists them; they are feedback).
    Collected once per process and stage: the teacher's tests do not change under a running grader."""
    number, root = parse_stage(stage), repo_root()
    key = (str(root), number)
    if key not in _COLLECTED:
        ids = [r.task_id for r in stage_regions(root, number)]
        with tempfile.TemporaryDirectory(prefix="pagedlab-collect-") as tmp:
            _COLLECTED[key] = feedback.collect_tasks(root, ids, CHILD_ENV, Path(tmp))
    return {task: list(tests) for task, tests in _COLLECTED[key].items()}


def _expected(root: Path, number: int, seed: int | None, tasks: list[str]) -> dict:
    """{task: {case: observation}} of the teacher's reference for `tasks`, run here (the rest: the case names only);
    a student's copy has no reference, only the visible cases' observations its hand-out ships (scenarios.json)."""
    scenarios = stage_scenarios(number)
    if seed is None:
        shipped = root / "scenarios.json"
        if not shipped.is_file():
            raise ValueError(f"scenarios.json: {root} is a student's copy without it (made by an older grader)")
        return json.loads(shipped.read_text())
    out = {task: dict.fromkeys(s.case_names()) for task, s in scenarios.items()}
    for task in tasks:
        key = (str(root), number, seed, task)
        if key not in _EXPECTED:
            kernels_on_cpu(number)
            _EXPECTED[key] = {name: _plain(run_case(scenarios[task], name, seed)) for name in out[task]}
            while len(_EXPECTED) > 64:
                _EXPECTED.pop(next(iter(_EXPECTED)))
        out[task] = _EXPECTED[key]
    return out


def kernels_on_cpu(number: int) -> None:
    """Stage 6's scenarios run Triton's kernels: without a GPU, under its interpreter (chosen before the import)."""
    if number == 6 and "TRITON_INTERPRET" not in os.environ and not _has_cuda():
        os.environ["TRITON_INTERPRET"] = "1"


def visible_observations(stage: int) -> dict:
    """The fixed cases' observations of the reference (a hand-out ships them for the student's own checks)."""
    kernels_on_cpu(stage)
    return {task: {name: _plain(run_case(s, name, None)) for name in s.case_names(seeded=False)}
            for task, s in stage_scenarios(stage).items()}  # fmt: skip


def _plain(obs):
    """As JSON sees it (tuples are lists, numpy's numbers plain): what the sandbox's observations will look like."""
    return json.loads(json.dumps(obs, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def _run_tasks(root, tmp, number, bodies, expected, seed, limits: Limits) -> dict[str, TaskResult]:
    """Each started task's scenarios in its own sandboxed tree, several at a time."""
    results = {task: TaskResult(body) for task, body in bodies.items()}
    started = [t for t, b in bodies.items() if b.status == "accepted"]
    jobs = max(1, min(len(started), os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        runs = {t: pool.submit(_run_task, root, tmp, number, bodies[t], expected[t], seed, limits) for t in started}
        for task, future in runs.items():
            results[task].cases = future.result()
    for task, result in results.items():
        if result.body.status != "accepted":
            result.cases = {name: result.body.status for name in expected[task]}
    return results


def _run_task(root, tmp, number, body: Body, expected: dict, seed, limits: Limits) -> dict[str, str | None]:
    """{case: None if its observation equals the reference's, else why not}, from sandboxed children."""
    task = body.region.task_id
    tree = build_tree(root, tmp / f"task-{task}", [body.region], {task: body.lines})
    got: dict[str, dict] = {}
    why: dict[str, str] = {}
    remaining = list(expected)
    while remaining and time.monotonic() < limits.deadline:
        spec = {"stage": number, "task": task, "cases": remaining, "seed": seed, "timeout": limits.per_item}
        run = sandbox.run(tree, "src/pagedlab/course/run_scenarios.py", json.dumps(spec).encode() + b"\n", CHILD_ENV,
                          limits.deadline - time.monotonic(), tmp / f"log-{task}.txt", limits.forbidden,
                          item_limit=limits.per_item + 3)  # fmt: skip
        current = _parse(run.output, got)
        if current is not None and current not in got:
            why[current] = (f"killed: it ran past {run.killed}" if run.killed
                            else f"the process ended during this case (exit code {run.returncode})")  # fmt: skip
        left = [c for c in remaining if c not in got and c not in why]
        if run.killed and current is not None:  # it outlived its own alarm: the body ignores time limits
            why.update({c: f"not run: case {current} had to be killed" for c in left})
            break
        if len(left) == len(remaining):
            break
        remaining = left
    return {name: _verdict(name, expected[name], got, why) for name in expected}


def _parse(output: bytes, got: dict) -> str | None:
    """Record each case's observation or error in `got`; a case reported twice is unknown. Returns the case that
    started last without a result (the one running when the child stopped), or None."""
    current = None
    for line in output.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        if isinstance(msg.get("start"), str):
            current = msg["start"]
        elif isinstance(msg.get("case"), str):
            name = msg["case"]
            got[name] = {"twice": True} if name in got else msg
            current = None
    return current


def _verdict(name: str, want, got: dict, why: dict) -> str | None:
    if name in why:
        return why[name]
    msg = got.get(name)
    if msg is None:
        return "no result: the process stopped before this case"
    if msg.get("twice"):
        return "reported twice: an unknown outcome"
    if "error" in msg:
        return _error_text(msg)
    return first_difference(want, msg.get("obs"))


def _error_text(msg: dict) -> str:
    """ "raised NotImplementedError at kv/block_pool.py:62": a type name and a place, never the message."""
    kind = msg.get("error") if isinstance(msg.get("error"), str) and msg["error"].isidentifier() else "an exception"
    at = msg.get("at")
    ok = isinstance(at, list) and len(at) == 2 and isinstance(at[0], str) and isinstance(at[1], int)
    place = f" at {at[0]}:{at[1]}" if ok and at[0].endswith(".py") and len(at[0]) < 80 and at[0].isascii() else ""
    return f"raised {kind[:60]}{place}"


def _forbidden(root: Path, ws: Path) -> list[str]:
    """What the fallback's audit hook refuses to open: the teacher's source, tests and reading, the workspace, any
    installed pagedlab (the Python install, even inside the checkout, stays readable)."""
    folders = [root / part for part in ("src", "tests", "chapters", "notebooks")] + [ws]
    folders += [Path(p) / "pagedlab" for p in sys.path if p and (Path(p) / "pagedlab").is_dir()]
    return sorted({str(f.resolve()) for f in folders})


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _workspace(path: Path) -> Path:
    """The folder holding src/pagedlab: `path` or its one subfolder that has it (an uploaded zip's top folder)."""
    path = path.resolve()
    if (path / "src" / "pagedlab").is_dir():
        return path
    inner = [d for d in sorted(path.iterdir()) if (d / "src" / "pagedlab").is_dir()] if path.is_dir() else []
    if len(inner) == 1:
        return inner[0]
    raise ValueError(f"workspace: {path} has no src/pagedlab (not a folder written by `assignment make`)")


def failed_grading(message: str) -> dict:
    """Gradescope's results when grading itself could not run: zero, with the reason for the student."""
    return {"score": 0, "max_score": 0, "execution_time": 0, "output": f"Grading failed: {message}",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": []}  # fmt: skip


def print_grades(result: dict, out=None) -> None:
    print(result["output"], file=out or sys.stderr)
