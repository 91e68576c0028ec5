"""Course: the teacher's tests as feedback: why a task lost points, in the student's own tree, sandboxed.

Builds on: course/submission.py (build_tree), course/sandbox.py, course/grading_runner.py (the child).
Read with: chapters/98-assignments.md (Feedback, Hidden tests).

The scenarios decide the score; the tests say why. For every task that lost
points, its tests run once in a tree holding all of the student's bodies (the
tree the student works in: no reference code of the stage), and the report
shows the first failing test of the task and its assertion. Hidden tests
(`--extra-tests`) run in a tree of their own, after the visible ones, and are
shown only after publication: they are feedback too, never a score, since the
code they test can read them.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

from pagedlab.course import messages, sandbox
from pagedlab.course.regions import unshipped_regions
from pagedlab.course.submission import build_tree


def check_hidden_tests(extra_tests, task_ids: list[str]) -> Path | None:
    """The hidden tests' folder, once every test_*.py in it tags a task of the stage; else a ValueError naming the
    file (a hidden test that tags nothing would never run, and nobody would notice)."""
    if extra_tests is None:
        return None
    folder = Path(extra_tests)
    if not folder.is_dir():
        raise ValueError(f"--extra-tests: {folder} is not a folder")
    files = sorted(folder.rglob("test_*.py"))
    if not files:
        raise ValueError(f"--extra-tests: {folder} holds no test_*.py file")
    for path in files:
        tags = _task_tags(path)
        unknown = sorted(tags - set(task_ids))
        if unknown:
            raise ValueError(f"--extra-tests: {path.name} tags {unknown}, not tasks of this stage ({task_ids})")
        if not tags:
            raise ValueError(
                f'--extra-tests: {path.name} tags no task: add pytestmark = pytest.mark.task("{task_ids[0]}") '
                "(or mark each test); an untagged hidden test would never run"
            )
    return folder


def _task_tags(path: Path) -> set[str]:
    """The task ids in the file's `*.mark.task("id")` calls (a file that does not parse: a ValueError)."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as e:
        raise ValueError(f"--extra-tests: {path.name} does not parse: {e}") from None
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "task"
        and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
    }  # fmt: skip


def attach(root: Path, tmp: Path, number: int, results: dict, hidden: Path | None, env: dict, limits) -> list[dict]:
    """Set `feedback` (the first failing test) on every task that lost points; run the hidden tests (if any) and
    return them as Gradescope test entries (worth nothing, shown after publication). The tree is the student's
    copy as they hold it: their bodies, stubs for the rest of the stage and the stages after it, the student
    tests (so no reference of the stage is in it, and a message may be shown whole)."""
    bodies = {t: r.body.lines for t, r in results.items() if r.body.status == "accepted"}
    losing = [t for t, r in results.items() if r.body.status == "accepted" and r.fraction < 1]
    isolated = sandbox.isolation()[0]  # without the sandbox, a message could carry a file the body read
    regions = unshipped_regions(root, number)
    if losing:
        tree = build_tree(root, tmp / "student", regions, bodies, tests=number)
        for outcome in _run_tests(tree, tmp / "log-tests.txt", losing, env, limits):
            message = _first_lines(outcome["message"]) if isolated else "(messages are shown only when isolated)"
            for task in outcome["tasks"]:
                if not results[task].feedback and _counts(outcome):
                    results[task].feedback = f"{outcome['id']}: {message}"
    if hidden is None:
        return []
    tree = build_tree(root, tmp / "hidden", regions, bodies, tests=number, hidden=hidden)
    found = _run_tests(tree, tmp / "log-hidden.txt", list(results), env, limits, only_hidden=True)
    return [_hidden_entry(o, isolated) for o in found]


def _run_tests(tree: Path, log: Path, tasks: list[str], env: dict, limits, only_hidden=False) -> list[dict]:
    """Every tagged test of `tasks` in `tree`, as [{"id", "outcome", "message", "tasks", "gpu"}]; one that never
    reported (the child was killed or crashed in it) has failed."""
    paths = [p for p in sorted((tree / "tests").rglob("test_*.py")) if "mark.task(" in p.read_text()]
    files = [str(p.relative_to(tree)) for p in paths if (p.relative_to(tree).parts[1] == "hidden") == only_hidden]
    left = limits.deadline - time.monotonic()
    if not files or left <= 1:
        return []
    spec = {"files": files, "tasks": tasks, "timeout": limits.per_item, "all": only_hidden}
    spec = json.dumps(spec).encode() + b"\n"
    run = sandbox.run(tree, "src/pagedlab/course/grading_runner.py", spec, env, left, log, limits.forbidden,
                      item_limit=limits.per_item + 10)  # fmt: skip
    outcomes, current = [], None
    for msg in messages.test_messages(run.output, files, tasks):
        if "start" in msg:
            current = msg["start"]
        elif "result" in msg:
            outcomes.append({**msg, "id": msg["result"]})
            current = None
    if current is not None:
        why = f"killed: it ran past {run.killed}" if run.killed else "the test process ended during this test"
        outcomes.append({"id": current, "outcome": "failed", "message": why, "tasks": [], "gpu": False})
    return outcomes


def collect_tasks(root: Path, number: int, task_ids: list[str], env: dict, tmp: Path) -> dict[str, list[str]]:
    """{task id: the ids of the teacher's tests tagged with it}, collected in a copy of the teacher's tree."""
    tree = build_tree(root, tmp / "collect", [], {}, tests=number)
    paths = sorted((tree / "tests").rglob("test_*.py"))
    files = [str(p.relative_to(tree)) for p in paths if "mark.task(" in p.read_text()]
    spec = json.dumps({"files": files, "tasks": task_ids, "timeout": 60, "collect": True}).encode() + b"\n"
    run = sandbox.run(tree, "src/pagedlab/course/grading_runner.py", spec, env, 300, tmp / "log-collect.txt")
    for msg in messages.test_messages(run.output, files, task_ids):
        if "collected" in msg:
            return {t: [c["id"] for c in msg["collected"] if t in c["tasks"]] for t in task_ids}
        if "collect_error" in msg:
            raise RuntimeError(f"the teacher's tests do not collect: {msg['collect_error']}: {msg['longrepr'][-800:]}")
    raise RuntimeError(f"the teacher's tests do not collect: {run.killed} {run.log[-1500:]}")


def _counts(outcome: dict) -> bool:
    """A failure worth showing: not a pass, and not a GPU test skipped on a machine without one."""
    blocked = outcome.get("gpu") and outcome.get("outcome") == "skipped"
    return outcome.get("outcome") != "passed" and not blocked


def _first_lines(message: str, lines: int = 2, width: int = 220) -> str:
    kept = [line.strip() for line in str(message).splitlines() if line.strip()][:lines]
    text = " / ".join(kept) or "(no message)"
    return text if len(text) <= width else text[: width - 3] + "..."


def _hidden_entry(outcome: dict, isolated: bool) -> dict:
    status = "passed" if outcome.get("outcome") == "passed" else "failed"
    message = _first_lines(outcome.get("message", ""), 1) if isolated else "(shown only when isolated)"
    return {
        "name": f"hidden: {outcome['id'].split('/', 2)[-1]}",
        "score": 0.0,
        "max_score": 0.0,
        "status": status,
        "output": "" if status == "passed" else message,
        "visibility": "after_published",
        "tags": outcome.get("tasks", []),
    }
