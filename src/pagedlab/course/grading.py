"""Grading a course assignment: `pagedlab assignment grade DIR --stage N [--json [FILE]]`.

Builds on: course/regions.py (regions, stubs), course/screening.py, course/grading_runner.py.
Read with: chapters/98-assignments.md (Grading, What the grader trusts).

A workspace is the student's; nothing in it is trusted, not even the stage it
claims. The grader

    1. assembles a fresh tree from the teacher's reference (src/, tests/, pyproject.toml)
       in a new temporary folder, and collects the teacher's tests tagged with the
       stage's tasks (@pytest.mark.task("free-queue")) there, before any student code;
    2. takes from the workspace only the bodies of the stage's regions, screens each
       (course/screening.py) and splices the accepted ones in; a refused or missing
       body leaves the stub, so that task scores zero; changes anywhere else are
       reported and ignored;
    3. runs the tests in an isolated interpreter (course/grading_runner.py: `-I`, a clean
       environment, an audit hook), reading each result down a pipe with a nonce;
       a test that hangs past its time, crashes or calls os._exit fails, and the
       others run on in a fresh process; a total time limit bounds it all;
    4. scores per task: a task's points are split evenly over its tests; tests that
       need a GPU are "blocked" on a machine without one (neither passed nor zero);
    5. returns Gradescope's results format (score, execution_time, output,
       visibility, stdout_visibility, tests[] with name, score, max_score, status,
       output, visibility, tags); hidden tests are "after_published" and show no source.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from pagedlab.course.regions import copy_tests, file_regions, repo_root, stage_regions, stub_body, whole_functions
from pagedlab.course.screening import screen
from pagedlab.stages import STAGE_NAMES, parse_stage

PER_TEST_TIMEOUT = 120.0  # seconds one test may run (the SIGALRM in the child; a kill 15 s later)
TOTAL_TIMEOUT = 900.0  # seconds for the whole grading
_KILL_GRACE = 15.0
_STUBBED_LAUNCHER = "(kernel stubbed: write it, then delete this line)"


@dataclass
class Task:
    """One region of the stage, as the grader sees it."""

    id: str
    points: int
    file: str  # relative to the tree
    line: int
    status: str = "accepted"  # accepted | refused | missing
    reasons: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)


def grade(
    workspace: str | Path,
    stage: int | str,
    extra_tests: str | Path | None = None,
    keyword: str | None = None,
    per_test_timeout: float = PER_TEST_TIMEOUT,
    total_timeout: float = TOTAL_TIMEOUT,
    gpu: bool | None = None,
) -> dict:
    """Grade `workspace` as stage `stage` (the teacher's word); Gradescope's results, plus `max_score` and `tasks`.

    `keyword` keeps only tests whose id contains it (a quick check, never a grade); `gpu` overrides the
    machine's CUDA check (tests marked gpu are blocked without one).
    """
    started = time.monotonic()
    number, ws, root = parse_stage(stage), _workspace(Path(workspace)), repo_root()
    regions = stage_regions(root, number)
    if not regions:
        raise ValueError(f"stage: stage {number} has no tasks")
    gpu = _has_cuda() if gpu is None else gpu
    tree = Path(tempfile.mkdtemp(prefix="pagedlab-tree-"))
    private = Path(tempfile.mkdtemp(prefix="pagedlab-grader-"))
    try:
        _copy_reference(root, tree, extra_tests)
        tasks = {r.task_id: Task(r.task_id, r.points, str(r.path.relative_to(root)), r.start + 1) for r in regions}
        files = _test_files(tree)
        env = _clean_env(private)
        forbidden = _forbidden_folders(root, ws)
        collected = _collect(tree, private, files, tasks, env, forbidden, per_test_timeout)
        if keyword:
            collected = [c for c in collected if keyword in c["id"]]
        for c in collected:
            for t in c["tasks"]:
                tasks[t].tests.append(c["id"])
        notes = _splice(root, ws, tree, regions, tasks)
        notes += [
            f"hidden test file {path.name} tags no task (@pytest.mark.task): not run"
            for path in sorted((tree / "tests" / "hidden").rglob("test_*.py"))
            if str(path.relative_to(tree)) not in files
        ]
        runnable = [c["id"] for c in collected if gpu or not c["gpu"]]
        deadline = started + total_timeout
        results = _run(tree, private, files, list(tasks), runnable, env, forbidden, per_test_timeout, deadline)
        out = _report(number, tasks, collected, results, notes)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    out["execution_time"] = round(time.monotonic() - started, 1)
    return out


def collect_tasks(stage: int | str) -> dict[str, list[str]]:
    """{task id: the ids of the teacher's tests that grade it}, collected in a fresh reference tree."""
    number, root = parse_stage(stage), repo_root()
    regions = stage_regions(root, number)
    tree = Path(tempfile.mkdtemp(prefix="pagedlab-tree-"))
    private = Path(tempfile.mkdtemp(prefix="pagedlab-grader-"))
    try:
        _copy_reference(root, tree, None)
        tasks = {r.task_id: None for r in regions}
        collected = _collect(tree, private, _test_files(tree), tasks, _clean_env(private), [], PER_TEST_TIMEOUT)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(private, ignore_errors=True)
    return {t: [c["id"] for c in collected if t in c["tasks"]] for t in tasks}


def failed_grading(message: str) -> dict:
    """Gradescope's results when grading itself could not run: zero, with the reason for the student."""
    return {
        "score": 0,
        "max_score": 0,
        "execution_time": 0,
        "output": f"Grading failed: {message}",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": [],
    }


def _workspace(path: Path) -> Path:
    """The folder holding src/pagedlab: `path` or its one subfolder that has it (an uploaded zip's top folder)."""
    path = path.resolve()
    if (path / "src" / "pagedlab").is_dir():
        return path
    inner = [d for d in sorted(path.iterdir()) if (d / "src" / "pagedlab").is_dir()] if path.is_dir() else []
    if len(inner) == 1:
        return inner[0]
    raise ValueError(f"workspace: {path} has no src/pagedlab (not a folder written by `assignment make`)")


# -- 1. the tree -----------------------------------------------------------------------------------


def _copy_reference(root: Path, tree: Path, extra_tests: str | Path | None) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis", "*.pyc")
    shutil.copytree(root / "src", tree / "src", ignore=ignore)
    copy_tests(root, tree / "tests")
    shutil.copy(root / "pyproject.toml", tree / "pyproject.toml")
    if extra_tests is not None:
        hidden = Path(extra_tests)
        if not hidden.is_dir():
            raise ValueError(f"--extra-tests: {hidden} is not a folder")
        shutil.copytree(hidden, tree / "tests" / "hidden", ignore=ignore)
        (tree / "tests" / "hidden" / "__init__.py").touch()


def _test_files(tree: Path) -> list[str]:
    """The teacher's test files that tag a task (only those are collected)."""
    return sorted(
        str(path.relative_to(tree)) for path in (tree / "tests").rglob("test_*.py") if "mark.task(" in path.read_text()
    )


def _splice(root: Path, ws: Path, tree: Path, regions: list, tasks: dict[str, Task]) -> list[str]:
    """Put each accepted body of the student's regions into the tree; what else changed, as notes."""
    notes = []
    for path in sorted({r.path for r in regions}):
        rel = path.relative_to(root)
        ref_text = path.read_text()
        ref_lines = ref_text.splitlines()
        mine = sorted((r for r in regions if r.path == path), key=lambda r: r.start, reverse=True)
        student = _student_regions(ws / rel, mine, tasks)
        for region in mine:
            task = tasks[region.task_id]
            body = student[0].get(region.task_id) if student else None
            if body is not None:
                wanted = whole_functions(ref_lines, region)
                task.reasons = screen("\n".join(body), region.indent(ref_lines), ref_text, wanted)
                task.status = "refused" if task.reasons else "accepted"
            if task.status != "accepted":
                body = stub_body(ref_lines, region)
            ref_lines[region.start + 1 + region.header : region.end] = body
        (tree / rel).write_text("\n".join(ref_lines) + "\n")
        if student and student[1] != _outside(ref_text, mine):
            notes.append(f"{rel}: changes outside the task regions are ignored")
    notes += _other_changes(root, ws, {r.path.relative_to(root) for r in regions})
    return notes


def _student_regions(path: Path, regions: list, tasks: dict[str, Task]):
    """({task id: body lines}, the file outside its regions), or None when the file or its markers are gone."""
    try:
        text = path.read_text()
        found = file_regions(path, text)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        for r in regions:
            tasks[r.task_id].status, tasks[r.task_id].reasons = "missing", [f"{path.name}: {e}"]
        return None
    lines = text.splitlines()
    bodies = {r.task_id: r.body(lines) for r in found}
    for r in regions:
        if r.task_id not in bodies:
            tasks[r.task_id].status = "missing"
            tasks[r.task_id].reasons = [f"no region marked '# TASK {r.task_id}' in {path.name}"]
    return bodies, _outside(text, found)


def _outside(text: str, regions: list) -> list[str]:
    """The file's lines outside region bodies (and without a stubbed launcher's raise), stripped."""
    lines = text.splitlines()
    inside = {i for r in regions for i in range(r.start + 1 + r.header, r.end)}
    return [line.strip() for i, line in enumerate(lines) if i not in inside and _STUBBED_LAUNCHER not in line]


def _other_changes(root: Path, ws: Path, task_files: set[Path]) -> list[str]:
    notes = []
    for path in sorted((ws / "src").rglob("*.py")):
        rel = path.relative_to(ws)
        ref = root / rel
        if rel in task_files:
            continue
        if not ref.exists():
            notes.append(f"{rel}: not in the reference; ignored")
        elif path.read_bytes() != ref.read_bytes():
            notes.append(f"{rel}: changed, but it holds no task of this stage; ignored")
    return notes


# -- 3. the isolated run --------------------------------------------------------------------------------


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _clean_env(private: Path) -> dict:
    """Only what the tests need: no PYTHON*, no PAGEDLAB_*, a private HOME and TMPDIR."""
    home = private / "home"
    (home / "tmp").mkdir(parents=True)
    env = {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "TRITON_INTERPRET"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _forbidden_folders(root: Path, ws: Path) -> list[str]:
    """What no graded test may open: the reference's source and tests, the workspace, any installed pagedlab."""
    folders = [root / "src", root / "tests", root / "chapters", root / "notebooks", ws]
    for entry in sys.path:
        if entry and (Path(entry) / "pagedlab").is_dir():
            folders.append(Path(entry) / "pagedlab")
    return sorted({str(Path(f).resolve()) for f in folders})


def _child(tree: Path, private: Path, spec: dict, env: dict, forbidden: list[str]):
    """Start the runner; return (process, read end of its report pipe, nonce)."""
    runner = private / "run_tests.py"
    if not runner.exists():
        shutil.copy(Path(__file__).with_name("grading_runner.py"), runner)
    spec_file = private / f"spec-{secrets.token_hex(4)}.json"
    spec_file.write_text(json.dumps(spec))
    read, write = os.pipe()
    nonce = secrets.token_hex(16)
    log = open(private / "log.txt", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-I", str(runner), str(spec_file), str(write)],
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tree,
        env=env,
        pass_fds=(write,),
        start_new_session=True,
    )
    os.close(write)
    log.close()
    proc.stdin.write(f"{nonce}\n{json.dumps(forbidden)}\n".encode())
    proc.stdin.close()
    return proc, read, nonce


def _messages(proc, read: int, nonce: str, idle_limit: float, deadline: float):
    """Yield the child's verified messages; kill it when a test runs `idle_limit` past its start, or at `deadline`."""
    sel = selectors.DefaultSelector()
    sel.register(read, selectors.EVENT_READ)
    buf, test_started = b"", None
    try:
        while True:
            now = time.monotonic()
            if now > deadline or (test_started is not None and now - test_started > idle_limit):
                _kill(proc)
                yield {"killed": "the total time limit" if now > deadline else "the per-test time limit"}
                return
            if not sel.select(timeout=min(1.0, max(0.01, deadline - now))):
                continue
            chunk = os.read(read, 65536)
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict) and msg.pop("nonce", None) == nonce:
                    if "start" in msg:
                        test_started = time.monotonic()
                    elif "result" in msg:
                        test_started = None
                    yield msg
    finally:
        sel.close()
        os.close(read)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill(proc)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _collect(tree, private, files, tasks, env, forbidden, per_test_timeout) -> list[dict]:
    """The tests tagged with the stage's tasks, collected in the pure reference tree (before any student code)."""
    spec = {"tree": str(tree), "files": files, "tasks": list(tasks), "collect": True, "timeout": per_test_timeout}
    proc, read, nonce = _child(tree, private, spec, env, forbidden)
    collected, errors = None, []
    for msg in _messages(proc, read, nonce, idle_limit=300, deadline=time.monotonic() + 300):
        if "collected" in msg:
            collected = msg["collected"]
        elif "collect_error" in msg:
            errors.append(f"{msg['collect_error']}: {msg['longrepr'][-600:]}")
    if collected is None or errors:
        log = (private / "log.txt").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"the teacher's tests do not collect: {' '.join(errors)[-1500:]} {log}")
    return collected


def _run(tree, private, files, task_ids, runnable, env, forbidden, per_test_timeout, deadline) -> dict:
    """{test id: result}: run in a fresh child until every test reported; a test that never did has failed."""
    results: dict[str, dict] = {}
    remaining = list(runnable)
    while remaining:
        if time.monotonic() > deadline:
            for nid in remaining:
                results[nid] = _failure("not run: the grading ran out of its total time")
            break
        spec = {"tree": str(tree), "files": files, "tasks": task_ids, "collect": False, "only": remaining}
        proc, read, nonce = _child(tree, private, dict(spec, timeout=per_test_timeout), env, forbidden)
        current, killed = None, None
        grace = min(_KILL_GRACE, max(2.0, per_test_timeout))  # after the child's own alarm has had its chance
        for msg in _messages(proc, read, nonce, per_test_timeout + grace, deadline):
            if "start" in msg:
                current = msg["start"]
            elif "result" in msg:
                results[msg.pop("result")] = msg
                current = None
            elif "killed" in msg:
                killed = msg["killed"]
        if current is not None:
            why = (
                f"killed: it ran past {killed}"
                if killed
                else f"the test process exited during this test (code {proc.returncode})"
            )
            results[current] = _failure(why)
        left = [nid for nid in remaining if nid not in results]
        if len(left) == len(remaining):  # no progress: the child cannot even start its tests
            log = (private / "log.txt").read_text(errors="replace")[-800:]
            for nid in left:
                results[nid] = _failure(f"not run: the test process stopped before it ({log.strip()})")
            break
        remaining = left
    return results


def _failure(message: str) -> dict:
    return {"outcome": "failed", "message": message, "longrepr": message, "duration": 0.0, "foreign": []}


# -- 4, 5. scores and Gradescope's results -----------------------------------------------------------------


def _report(number: int, tasks: dict[str, Task], collected: list[dict], results: dict, notes: list) -> dict:
    share = {t.id: (t.points / len(t.tests) if t.tests else 0.0) for t in tasks.values()}
    tests, by_task = [], {t: [0.0, 0.0] for t in tasks}
    foreign = sorted({m for r in results.values() for m in r.get("foreign", [])})
    for c in collected:
        hidden = c["id"].startswith("tests/hidden/")
        worth = sum(share[t] for t in c["tasks"])
        r = results.get(c["id"])
        refused = [t for t in c["tasks"] if tasks[t].status != "accepted"]
        if r is None or (r["outcome"] == "skipped" and _needs_gpu(r["message"])):
            status, text = "blocked", "needs a GPU: not run on this machine (its points are left out of the total)"
        elif foreign or r.get("foreign"):
            status, text = "failed", f"a pagedlab module was loaded from outside the grading tree: {foreign}"
        elif r["outcome"] == "passed":
            status, text = "passed", ""
        elif r["outcome"] == "skipped":
            status, text = "failed", f"skipped ({r['message']}): a graded test must run"
        else:
            status = "failed"
            text = f"{r['message']}" if hidden else f"{r['message']}\n\n{r['longrepr'][-1500:]}"
        if refused:
            why = "; ".join(f"task {t} {tasks[t].status}: {'; '.join(tasks[t].reasons)[:500]}" for t in refused)
            text = f"{why}\n(the stub ran in its place)\n{text}"
        score = worth if status == "passed" else 0.0
        max_score = 0.0 if status == "blocked" else worth
        for t in c["tasks"]:
            by_task[t][0] += share[t] if status == "passed" else 0.0
            by_task[t][1] += 0.0 if status == "blocked" else share[t]
        tests.append(
            {
                "name": f"{', '.join(c['tasks'])}: {c['id']}",
                "score": round(score, 4),
                "max_score": round(max_score, 4),
                "status": status,
                "output": text.strip() if not hidden or status != "passed" else "",
                "visibility": "after_published" if hidden else "visible",
                "tags": c["tasks"],
            }
        )
    score = round(sum(by_task[t][0] for t in tasks), 2)
    max_score = round(sum(by_task[t][1] for t in tasks), 2)
    task_rows = [
        {"id": t.id, "points": t.points, "file": t.file, "line": t.line, "status": t.status, "reasons": t.reasons,
         "score": round(by_task[t.id][0], 2), "max_score": round(by_task[t.id][1], 2), "tests": len(t.tests)}
        for t in tasks.values()
    ]  # fmt: skip
    out = {
        "score": score,
        "max_score": max_score,
        "stage": number,
        "output": _summary(number, task_rows, notes, score, max_score, sum(t["status"] == "blocked" for t in tests)),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "tasks": task_rows,
        "notes": notes,
    }
    return out


def _needs_gpu(message: str) -> bool:
    return any(word in message for word in ("CUDA", "GPU", "cuda"))


def _summary(number, task_rows, notes, score, max_score, blocked: int) -> str:
    lines = [f"Stage {number} ({STAGE_NAMES[number]}): {score:g} / {max_score:g}", ""]
    lines.append(f"{'task':24} {'points':>6} {'score':>14}  status")
    for t in task_rows:
        lines.append(f"{t['id']:24} {t['points']:>6} {t['score']:>6g} / {t['max_score']:<6g} {t['status']}")
        lines += [f"    refused: {why}" for why in t["reasons"][:8]] if t["status"] != "accepted" else []
    if blocked:
        lines.append(f"{blocked} tests need a GPU: blocked on this machine, neither passed nor counted.")
    lines += ["", *[f"note: {n}" for n in notes]] if notes else []
    return "\n".join(lines)


def print_grades(result: dict, out=sys.stderr) -> None:
    """The task table, then the first failures with their messages."""
    print(result["output"], file=out)
    failed = [t for t in result["tests"] if t["status"] == "failed"]
    for t in failed[:8]:
        print(f"\nFAILED {t['name']}\n{textwrap.indent(t['output'][:700], '    ')}", file=out)
    if len(failed) > 8:
        print(f"\n... and {len(failed) - 8} more failed tests", file=out)
