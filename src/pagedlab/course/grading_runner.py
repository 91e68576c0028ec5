"""Course: the sandboxed child that runs the teacher's tests for feedback, and reports each outcome (a script).

Builds on: nothing of pagedlab before sys.path is set (the tree's tests import it).
Read with: course/feedback.py, course/sandbox.py.

    python -I <tree>/src/pagedlab/course/grading_runner.py FD      stdin: {"files", "tasks", "timeout", "collect"}

It runs pytest on the tree's test files, keeping only tests tagged with the
given tasks, and writes to FD one JSON line per event:

    {"start": nodeid}   {"result": nodeid, "outcome", "message", "longrepr", "tasks", "gpu"}   {"done": true}
    {"collected": [{"id", "tasks"}]}   (with "collect": true, instead of running them)

These outcomes are feedback, never a score, and the parent reads them as a
strict schema (course/messages.py). A test is "passed" only if its call
reported a pass and nothing failed; an interrupted one (KeyboardInterrupt,
pytest.exit), one that skipped, and one that never reported are not.
"""

import json
import os
import signal
import sys
import time


class GradingTimeout(BaseException):
    """SIGALRM: the test ran past its time (a BaseException: `except Exception` cannot eat it)."""


def main() -> None:
    fd = int(sys.argv[1])
    tree = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    spec = json.loads(sys.stdin.readline())
    _guard().install([line.strip() for line in sys.stdin if line.strip()])  # the fallback's only
    src = os.path.join(tree, "src")
    sys.path[:] = [src, tree] + [p for p in sys.path if p and not os.path.isdir(os.path.join(p, "pagedlab"))]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    out = os.fdopen(fd, "w", buffering=1)
    emit = lambda obj: out.write(json.dumps(obj) + "\n")  # noqa: E731
    import pytest

    _Plugin.pytest_runtest_protocol = pytest.hookimpl(wrapper=True)(_Plugin.pytest_runtest_protocol)
    plugin = _Plugin(emit, spec)
    args = ["-q", "--tb=short", "-p", "no:cacheprovider", "-p", "no:stepwise"]
    args += ["-c", os.path.join(tree, "pyproject.toml")]
    args += ["--rootdir", tree, "-p", "_hypothesis_pytestplugin", "-o", "addopts=--strict-markers"]
    args += ["--collect-only"] if spec.get("collect") else []
    try:
        pytest.main(args + [os.path.join(tree, f) for f in spec["files"]], plugins=[plugin])
    except BaseException as e:  # pytest.exit or an interrupt from a test: what did not report has failed
        emit({"stopped": type(e).__name__})
    emit({"done": True})
    out.flush()
    os._exit(0)  # no atexit hook of the tested code runs after the report


class _Plugin:
    def __init__(self, emit, spec: dict):
        self.emit, self.spec = emit, spec
        self.tasks = set(spec["tasks"])
        self.reports: dict = {}
        self.failed: set[str] = set()  # tasks with a failing test already

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        keep, drop = [], []
        for item in items:
            mine = sorted({m.args[0] for m in item.iter_markers("task") if m.args and m.args[0] in self.tasks})
            (keep if mine else drop).append(item)
            item.user_properties.append(("tasks", mine))
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        if self.spec.get("collect"):
            self.emit({"collected": [{"id": i.nodeid, "tasks": dict(i.user_properties)["tasks"]} for i in keep]})

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.emit({"collect_error": report.nodeid, "longrepr": str(report.longrepr)[-2000:]})

    def pytest_runtest_protocol(self, item, nextitem):  # a wrapper around pytest's own (see main)
        mine = dict(item.user_properties)["tasks"]
        if not self.spec.get("all") and mine and all(task in self.failed for task in mine):
            item.add_marker(_skip_mark(item))  # feedback needs one failure per task: the rest is time
            return (yield)
        self.emit({"start": item.nodeid})
        entry = self.reports[item.nodeid] = {"outcome": "unknown", "message": "no outcome reported", "longrepr": ""}
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, float(self.spec["timeout"]))
        start = time.monotonic()
        try:
            return (yield)
        except BaseException as e:  # an interrupt raised by the test: a failure, then pytest stops
            entry.update(outcome="failed", message=f"{type(e).__name__}: the test was interrupted")
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            gpu = item.get_closest_marker("gpu") is not None
            if entry["outcome"] != "passed" and not (gpu and entry["outcome"] == "skipped"):
                self.failed.update(mine)
            self.emit({"result": item.nodeid, **entry, "tasks": mine, "gpu": gpu, "duration": time.monotonic() - start})

    def pytest_runtest_logreport(self, report) -> None:
        entry = self.reports.get(report.nodeid)
        if entry is None or entry["outcome"] == "failed":
            return
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            entry.update(outcome="failed", message=(crash.message if crash else str(report.longrepr)[-300:])[:2000])
            entry["longrepr"] = str(report.longrepr)[-3000:]
        elif report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            entry.update(outcome="skipped", message=str(reason)[-300:])
        elif report.when == "call" and entry["outcome"] == "unknown":
            entry.update(outcome="passed", message="")


def _skip_mark(item):
    import pytest

    return pytest.mark.skip(reason="an earlier test of its task failed")


def _alarm(signum, frame):
    raise GradingTimeout("the test ran past its time limit")


def _guard():
    """course/child_guard.py, loaded by its path (nothing of the tree is importable yet)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child_guard.py")
    spec = importlib.util.spec_from_file_location("pagedlab_child_guard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
