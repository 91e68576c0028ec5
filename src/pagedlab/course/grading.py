"""Course: grading a workspace: `pagedlab assignment grade DIR --stage N [--json [FILE]]`.

Builds on: course/submission.py (bodies, trees), course/scenarios/ (what grades a task), course/sandbox.py (where
student code runs), course/compare.py, course/feedback.py (the tests, for feedback), course/report.py.
Read with: chapters/98-assignments.md (Grading, The boundary).

A workspace is the student's; nothing in it is trusted, not even the stage it
claims. The score is decided here, in the trusted process, from plain data:

    1. read each region's body as text (course/submission.py); an untouched stub scores 0 and never runs
    2. draw a seed; run every task's scenarios on the teacher's reference, here, in this process; a drawn case
       whose observation equals a visible case's is drawn again, so no visible answer is ever a graded one
    3. for each started task, build a tree: the teacher's src/ with that task's body spliced in, the tasks its
       scenarios build on with the teacher's code (so each task earns its points alone), and every other task
       of the stage stubbed (no other task's reference within its reach); run the same scenarios there in a
       sandbox that holds no secret (course/sandbox.py), the seeds given only at run time
    4. read what the child wrote as a strict schema (course/messages.py); a case passes when the student's
       observation equals the reference's (course/compare.py); a task scores its points times the share of its
       drawn cases that passed (the visible cases, whose answers the student has, only explain); a case that
       hung, crashed or never reported failed
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

from pagedlab.course import feedback, messages, report, sandbox
from pagedlab.course.compare import first_difference
from pagedlab.course.regions import repo_root, stage_regions, unshipped_regions
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
    "TOKENIZERS_PARALLELISM": "false",  # no thread pool of one per core: a child's processes and threads are bounded
    "HYPOTHESIS_STORAGE_DIRECTORY": "/tmp/.hypothesis",
}
NUMERICS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR")  # the parent's choice of CPU kernels, passed on: same numbers both sides
_EXPECTED: dict = {}  # (root, stage, seed, task) -> ({case: observation}, {case: its seed}): computed once a batch
REDRAWS = 8  # draws of a case at most, until its observation is no visible case's
_COLLECTED: dict = {}  # (root, stage) -> {task: test ids}


def child_env() -> dict:
    """CHILD_ENV, plus the variables that choose torch's CPU kernels when the parent has them (no secret: the child
    computes the same numbers as the reference, run here)."""
    return CHILD_ENV | {name: os.environ[name] for name in NUMERICS if name in os.environ}


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
    def graded(self) -> list[str]:
        """The cases that count: those drawn at grading (a student's own copy has only the visible ones)."""
        drawn = [name for name in self.cases if name.startswith("seeded-")]
        return drawn or list(self.cases)

    @property
    def fraction(self) -> float:
        graded = self.graded
        return sum(self.cases[name] is None for name in graded) / len(graded) if graded else 0.0


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
    expected, seeds = reference_observations(root, number, None if local else seed, started_tasks)
    limits = Limits(per_test_timeout, started + total_timeout, forbidden_folders(root, ws))
    with tempfile.TemporaryDirectory(prefix="pagedlab-grade-") as tmp:
        results = _run_tasks(root, Path(tmp), number, bodies, expected, seeds, limits)
        hidden_tests = []
        if run_feedback:
            hidden_tests = feedback.attach(root, Path(tmp), number, results, hidden, child_env(), limits)
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
            _COLLECTED[key] = feedback.collect_tasks(root, number, ids, child_env(), Path(tmp))
    return {task: list(tests) for task, tests in _COLLECTED[key].items()}


def reference_observations(root: Path, number: int, seed: int | None, tasks: list[str]) -> tuple[dict, dict]:
    """({task: {case: observation}}, {task: {case: its seed}}) of the teacher's reference for `tasks`, run here (the
    rest: the case names only); a student's copy has no reference, only the visible cases' observations its
    hand-out ships (scenarios.json)."""
    scenarios = stage_scenarios(number)
    if seed is None:
        shipped = root / "scenarios.json"
        if not shipped.is_file():
            raise ValueError(f"scenarios.json: {root} is a student's copy without it (made by an older grader)")
        return json.loads(shipped.read_text()), {task: {} for task in scenarios}
    out = {task: dict.fromkeys(s.case_names()) for task, s in scenarios.items()}
    seeds = {task: {} for task in scenarios}
    for task in tasks:
        key = (str(root), number, seed, task)
        if key not in _EXPECTED:
            kernels_on_cpu(number)
            _EXPECTED[key] = _draw(scenarios[task], seed)
            while len(_EXPECTED) > 64:
                _EXPECTED.pop(next(iter(_EXPECTED)))
        out[task], seeds[task] = _EXPECTED[key]
    return out, seeds


def _draw(scenarios, seed: int) -> tuple[dict, dict]:
    """The reference's observation of every case of one task, and each drawn case's seed: the grading's seed, or
    the next of its REDRAWS while the observation is a visible case's (whose answer the student holds)."""
    observed = {name: as_json(run_case(scenarios, name, None)) for name in scenarios.case_names(seeded=False)}
    visible, seeds = list(observed.values()), {}
    for name in scenarios.case_names()[len(observed) :]:
        for attempt in range(REDRAWS):
            seeds[name] = (seed + attempt * 1_000_003) % (1 << 31)
            observed[name] = as_json(run_case(scenarios, name, seeds[name]))
            if observed[name] not in visible:
                break
    return observed, seeds


def kernels_on_cpu(number: int) -> None:
    """Stage 6's scenarios run Triton's kernels: without a GPU, under its interpreter (chosen before the import)."""
    if number == 6 and "TRITON_INTERPRET" not in os.environ and not _has_cuda():
        os.environ["TRITON_INTERPRET"] = "1"


def visible_observations(stage: int) -> dict:
    """The fixed cases' observations of the reference (a hand-out ships them for the student's own checks)."""
    kernels_on_cpu(stage)
    return {task: {name: as_json(run_case(s, name, None)) for name in s.case_names(seeded=False)}
            for task, s in stage_scenarios(stage).items()}  # fmt: skip


def as_json(obs):
    """As JSON sees it (tuples are lists, numpy's numbers plain): what the sandbox's observations will look like."""
    return json.loads(json.dumps(obs, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def _run_tasks(root, tmp, number, bodies, expected, seeds, limits: Limits) -> dict[str, TaskResult]:
    """Each started task's scenarios in its own sandboxed tree, several at a time."""
    results = {task: TaskResult(body) for task, body in bodies.items()}
    started = [t for t, b in bodies.items() if b.status == "accepted"]
    jobs = max(1, min(len(started), os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        runs = {t: pool.submit(_run_task, root, tmp, number, bodies[t], expected[t], seeds[t], limits)
                for t in started}  # fmt: skip
        for task, future in runs.items():
            results[task].cases = future.result()
    for task, result in results.items():
        if result.body.status != "accepted":
            result.cases = {name: result.body.status for name in expected[task]}
    return results


def task_tree(root: Path, dest: Path, number: int, task: str, body: list[str]) -> Path:
    """The tree one task is graded in: its body, the teacher's code for the tasks its scenarios build on, and every
    other task of the stage (and of later stages) stubbed, so that no other task's reference is within its reach."""
    builds_on = set(stage_scenarios(number)[task].builds_on)
    stubbed = [r for r in unshipped_regions(root, number) if r.task_id not in builds_on]
    return build_tree(root, dest, stubbed, {task: body})


def _run_task(root, tmp, number, body: Body, expected: dict, seeds: dict, limits: Limits) -> dict:
    """{case: None if its observation equals the reference's, else why not}, from sandboxed children."""
    task = body.region.task_id
    tree = task_tree(root, tmp / f"task-{task}", number, task, body.lines)
    echo = not stage_scenarios(number)[task].builds_on  # no other task's reference in reach: its values may show
    spec = {"stage": number, "task": task}
    return run_cases(tree, spec, expected, seeds, limits, tmp / f"log-{task}.txt", echo)


def run_cases(tree: Path, spec: dict, expected: dict, seeds: dict, limits: Limits, log: Path, echo=True) -> dict:
    """Run the cases `expected` names ({case: the reference's observation}) in `tree`, in sandboxed children
    (course/run_scenarios.py; `spec` says whose cases they are), a new child after one that died mid-case; {case:
    None if its observation equals the reference's, else why not}."""
    got: dict[str, dict] = {}
    why: dict[str, str] = {}
    remaining = list(expected)
    while remaining and time.monotonic() < limits.deadline:
        asked = spec | {"cases": remaining, "seeds": seeds, "timeout": limits.per_item}
        run = sandbox.run(tree, "src/pagedlab/course/run_scenarios.py", json.dumps(asked).encode() + b"\n",
                          child_env(), limits.deadline - time.monotonic(), log, limits.forbidden,
                          item_limit=limits.per_item + 3)  # fmt: skip
        current = _parse(messages.scenario_messages(run.output, remaining, tree), got)
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
    return {name: _verdict(name, expected[name], got, why, echo) for name in expected}


def _parse(found: list[dict], got: dict) -> str | None:
    """Record each case's observation or error in `got` (`found`: messages.scenario_messages' valid lines); a case
    reported twice is unknown. Returns the case that started last without a result (the one running when the
    child stopped), or None."""
    current = None
    for msg in found:
        if "start" in msg:
            current = msg["start"]
        elif "case" in msg:
            name = msg["case"]
            got[name] = {"twice": True} if name in got else msg
            current = None
    return current


def _verdict(name: str, want, got: dict, why: dict, echo: bool = True) -> str | None:
    if name in why:
        return why[name]
    msg = got.get(name)
    if msg is None:
        return "no result: the process stopped before this case"
    if msg.get("twice"):
        return "reported twice: an unknown outcome"
    if msg.get("unreadable"):
        return "its report was not one the grader reads (a line outside the schema): no result"
    if "error" in msg:
        return _error_text(msg, echo)
    return first_difference(want, msg.get("obs"), echo)


def _error_text(msg: dict, echo: bool = True) -> str:
    """ "raised NotImplementedError at kv/block_pool.py:62": a type name and a place (both checked by
    messages.scenario_messages: an identifier, a line of a file of the tree), never the message. Without `echo`
    only a well-known exception's name is shown (a name of the student's own making could carry text)."""
    file, line = msg["at"]
    name = msg["error"] if echo or msg["error"] in messages.KNOWN_ERRORS else "an exception"
    return f"raised {name}" + (f" at {file}:{line}" if file else "")


def forbidden_folders(root: Path, ws: Path) -> list[str]:
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
