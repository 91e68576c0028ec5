"""Course: the sandboxed child that runs a list of variants of the reference, one forked process each (a script).

Builds on: nothing of pagedlab before a fork (each fork imports the tree's, with its one mutated file).
Read with: course/mutation_grading.py, course/sandbox.py, chapters/98-assignments.md (Tests graded by the bugs
they catch).

    python -I <tree>/src/pagedlab/course/mutation_runner.py FD
        stdin: {"mode": "tests" | "scenarios", "variants": [{"id", "path"}], "limit", "warm", "isolated", ...}

The tree holds the reference in src/ and each variant's one file in
variants/<id>/<path>. This process imports only what every variant shares
(torch, pytest: the second or two a child's start costs), then for each variant
forks; the fork imports pagedlab from src/ with that one module taken from the
variant's file, and runs

    tests       the student's test files under pytest: each test's outcome
    scenarios   every task's cases (teacher's code only: no student file is in such a tree): the observations

and reports to this process on a pipe of its own: it never holds FD (closed
at the fork), and this process is not dumpable, so a fork cannot reach FD
through /proc. After each fork, inside the sandbox, every other process is
killed and /tmp emptied, so that no variant leaves anything for the next. To FD,
one line per variant (course/messages.py reads them as a strict schema):

    {"start": id}   {"variant": id, "verdict": "passed" | "failed" | "timeout" | "crashed", "seconds": s,
                     "tests": [[test id, outcome], ...] (tests)  or  "obs": {task: {case: ["ok", obs] | ["raised",
                     name]}} (scenarios)}
"""

import importlib.abc
import importlib.util
import json
import os
import select
import shutil
import signal
import sys
import time


def main() -> None:
    fd = int(sys.argv[1])
    tree = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    spec = json.loads(sys.stdin.readline())
    forbidden = [line.strip() for line in sys.stdin if line.strip()]  # the fallback's only
    _not_dumpable()
    src = os.path.join(tree, "src")
    sys.path[:] = [src, tree] + [p for p in sys.path if p and not os.path.isdir(os.path.join(p, "pagedlab"))]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    for module in spec.get("warm", []):
        if module.split(".")[0] == "pagedlab":
            continue  # pagedlab itself is imported by each fork, from its variant
        try:
            __import__(module)
        except Exception:
            pass  # the variant that needs it reports the error
    out = os.fdopen(fd, "w", buffering=1)
    sweep = spec.get("isolated") and _inside_bwrap()
    limit = float(spec["limit"])
    for variant in spec["variants"]:
        out.write(json.dumps({"start": variant["id"]}) + "\n")
        line = _run_variant(tree, spec, variant, fd, forbidden, limit)
        if spec.get("adaptive") and variant is spec["variants"][0] and line["verdict"] == "passed":
            limit = min(limit, 5.0 + 4 * line["seconds"])  # the first is the reference: the rest get a few times its
        out.write(json.dumps(line) + "\n")
        if sweep:
            _sweep()
    out.write(json.dumps({"done": True}) + "\n")
    out.flush()
    os._exit(0)


def _run_variant(tree: str, spec: dict, variant: dict, fd: int, forbidden: list, limit: float) -> dict:
    """Fork; the fork runs the variant and writes one JSON value to a pipe; it is killed at `limit` seconds."""
    read, write = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read)
            os.close(fd)
            os.close(0)
            os.setsid()
            _guard().install(forbidden)
            _use_variant(tree, variant)
            result = _tests(tree, spec) if spec["mode"] == "tests" else _scenarios(spec, variant.get("tasks"))
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(result))
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    data, timed_out = _read(read, started + limit)
    if timed_out:
        _kill(pid)
    os.waitpid(pid, 0)
    seconds = round(time.monotonic() - started, 3)
    line = {"variant": variant["id"], "seconds": seconds}
    if timed_out:
        return {**line, "verdict": "timeout"}
    try:
        result = json.loads(data)
    except ValueError:
        return {**line, "verdict": "crashed"}
    return {**line, **_verdict(spec["mode"], result)}


def _verdict(mode: str, result) -> dict:
    if not isinstance(result, dict):
        return {"verdict": "crashed"}
    if mode == "scenarios":
        return {"verdict": "passed", "obs": result.get("obs")}
    tests = result.get("tests")
    if not isinstance(tests, list):
        return {"verdict": "crashed"}
    failed = any(not isinstance(t, list) or len(t) != 2 or t[1] not in ("passed", "skipped") for t in tests)
    return {"verdict": "failed" if failed else "passed", "tests": tests}


def _read(fd: int, deadline: float) -> tuple[bytes, bool]:
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b"", True
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), False
            chunks.append(chunk)
    finally:
        os.close(fd)


class _Variant(importlib.abc.MetaPathFinder):
    """Finds the one mutated module in the variant's folder; every other module comes from src/ as usual."""

    def __init__(self, name: str, path: str):
        self.name, self.path = name, path

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path)


def _use_variant(tree: str, variant: dict) -> None:
    if not variant.get("path"):
        return  # the reference itself
    rel = variant["path"]
    name = "pagedlab." + rel[: -len(".py")].replace("/", ".")
    name = name[: -len(".__init__")] if name.endswith(".__init__") else name
    sys.meta_path.insert(0, _Variant(name, os.path.join(tree, "variants", variant["id"], rel)))


def _tests(tree: str, spec: dict) -> dict:
    """The student's tests under pytest: [[test id, outcome]] (a file that does not collect: [file, "failed"])."""
    import pytest

    outcomes: dict[str, str] = {}

    class Record:
        def pytest_collection_modifyitems(self, session, config, items):
            later = set(spec.get("later_tasks", []))  # their code is a stub in this tree
            drop = [i for i in items if any(m.args and m.args[0] in later for m in i.iter_markers("task"))]
            if drop:
                config.hook.pytest_deselected(items=drop)
                items[:] = [i for i in items if i not in drop]

        def pytest_collectreport(self, report):
            if report.failed:
                outcomes[report.nodeid or "collection"] = "failed"

        def pytest_runtest_logreport(self, report):
            if report.failed:
                outcomes[report.nodeid] = "failed"
            elif report.skipped and outcomes.get(report.nodeid) != "failed":
                outcomes[report.nodeid] = "skipped"
            elif report.when == "call" and report.nodeid not in outcomes:
                outcomes[report.nodeid] = "passed"

    args = ["-q", "-p", "no:cacheprovider", "-p", "no:stepwise", "-c", os.path.join(tree, "pyproject.toml")]
    args += ["--rootdir", tree, "-p", "_hypothesis_pytestplugin", "-o", "addopts=--strict-markers"]
    args += ["-x"] if spec.get("first_failure") else ["--continue-on-collection-errors"]
    args += [a for test in spec.get("deselect", []) for a in ("--deselect", test)]
    pytest.main(args + [os.path.join(tree, f) for f in spec["files"]], plugins=[Record()])
    return {"tests": [[test, outcome] for test, outcome in outcomes.items()]}


def _scenarios(spec: dict, tasks: list | None) -> dict:
    """Every asked case of `tasks` (None: of every task), on this variant: ["ok", observation] or ["raised", its
    type's name]."""
    import types

    src = sys.path[0]
    package = types.ModuleType("pagedlab")  # as course/run_scenarios.py: pagedlab/__init__.py is not needed
    package.__path__ = [os.path.join(src, "pagedlab")]
    sys.modules["pagedlab"] = package
    from pagedlab.course.scenarios import run_case, stage_scenarios

    scenarios = stage_scenarios(spec["stage"])
    obs: dict = {}
    for task, cases in spec["cases"].items():
        if tasks is not None and task not in tasks:
            continue
        obs[task] = {}
        for name in cases:
            try:
                value = run_case(scenarios[task], name, spec["seeds"][task].get(name))
                obs[task][name] = ["ok", json.loads(json.dumps(value, default=_plain))]
            except Exception as e:
                obs[task][name] = ["raised", type(e).__name__]
    return {"obs": obs}


def _plain(value):
    import numbers

    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not plain data")


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def _inside_bwrap() -> bool:
    """Only in the sandbox's own pid namespace (pid 1 is bwrap) may every other process be killed."""
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "bwrap"
    except OSError:
        return False


def _sweep() -> None:
    """Kill every process of the sandbox but this one and its parents; empty the sandbox's private /tmp."""
    keep = {1, os.getpid(), os.getppid()}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in keep:
            try:
                os.kill(int(name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for name in os.listdir("/tmp"):
        path = os.path.join("/tmp", name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): a fork of the same user id can no longer open /proc/<this>/fd or trace it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _guard():
    """course/child_guard.py, loaded by its path (nothing of the tree is importable yet)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child_guard.py")
    spec = importlib.util.spec_from_file_location("pagedlab_child_guard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
