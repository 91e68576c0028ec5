"""The grading child: run the teacher's tests in the assembled tree and report each one down a pipe.

Builds on: nothing of pagedlab (it must not import the package before the tree is on sys.path).
Read with: course/grading.py, which copies this file into its private folder and runs it as

    python -I run_tests.py SPEC_JSON FD        (stdin: a nonce, then the folders no test may open)

-I: no PYTHON* variables, no user site, no script folder or cwd on sys.path. This
file puts only the tree's src/ and the tree itself first on sys.path, takes out
any other folder that holds a pagedlab package and the editable-install finders,
and installs an audit hook that refuses to open a file in the folders named on
stdin (the reference, the workspace, any installed pagedlab) and to start a
process. Every line it writes to FD is one JSON object carrying the nonce:

    {"collected": [{"id", "tasks", "gpu"}]}   (collect mode)
    {"start": nodeid}                          before a test
    {"result": nodeid, "outcome", "message", "longrepr", "duration", "foreign"}
    {"done": true}

The grader trusts a result only from this pipe, and only with the nonce; a test
that started and never reported (a hang, os._exit, a crash) is a failure there.
"""

import json
import os
import signal
import sys
import time


class GradingTimeout(BaseException):
    """Raised in the test by SIGALRM when it runs past its time (a BaseException: `except Exception` cannot eat it)."""


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    fd = int(sys.argv[2])
    nonce = sys.stdin.readline().strip()
    forbidden = [os.path.realpath(p) for p in json.loads(sys.stdin.readline())]
    tree = os.path.realpath(spec["tree"])
    src = os.path.join(tree, "src")

    def emit(obj: dict) -> None:
        os.write(fd, (json.dumps(dict(obj, nonce=nonce)) + "\n").encode())

    _isolate(tree, src, forbidden)
    import pytest

    _Plugin.pytest_runtest_protocol = pytest.hookimpl(wrapper=True)(_Plugin.pytest_runtest_protocol)
    plugin = _Plugin(emit, spec, src)
    args = [
        "-q",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:stepwise",
        "-c",
        os.path.join(tree, "pyproject.toml"),
    ]
    args += ["--rootdir", tree, "-p", "_hypothesis_pytestplugin", "-o", "addopts=--strict-markers"]
    args += ["--collect-only"] if spec["collect"] else []
    pytest.main(args + [os.path.join(tree, f) for f in spec["files"]], plugins=[plugin])
    emit({"done": True})
    os._exit(0)  # no atexit hook of the tested code runs after the report


def _isolate(tree: str, src: str, forbidden: list[str]) -> None:
    """Only the tree's pagedlab can be imported; no test may read the reference or start a process."""
    sys.path[:] = [src, tree] + [
        p for p in sys.path if p and not os.path.isdir(os.path.join(p, "pagedlab")) and os.path.realpath(p) != tree
    ]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    sys.path_importer_cache.clear()
    for p in list(forbidden):
        if os.path.commonpath([p, tree]) == tree or os.path.commonpath([p, tree]) == p:
            forbidden.remove(p)  # never the tree itself (a reference folder above it would hide it)

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if any(path == p or path.startswith(p + os.sep) for p in forbidden):
                raise PermissionError(f"grading: {path} may not be opened by the tested code")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
            raise PermissionError(f"grading: {event} is not allowed in a graded test")

    sys.addaudithook(audit)


class _Plugin:
    def __init__(self, emit, spec: dict, src: str):
        self.emit, self.spec, self.src = emit, spec, src
        self.tasks = set(spec["tasks"])
        self.only = None if spec.get("only") is None else set(spec["only"])
        self.reports: dict = {}

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        keep, drop = [], []
        for item in items:
            mine = [m.args[0] for m in item.iter_markers("task") if m.args and m.args[0] in self.tasks]
            wanted = mine and (self.only is None or item.nodeid in self.only)
            (keep if wanted else drop).append(item)
            item.user_properties.append(("tasks", sorted(set(mine))))
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
        if self.spec["collect"]:
            self.emit({"collected": [{"id": i.nodeid, "tasks": dict(i.user_properties)["tasks"],
                                      "gpu": i.get_closest_marker("gpu") is not None} for i in keep]})  # fmt: skip

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.emit({"collect_error": report.nodeid, "longrepr": str(report.longrepr)[-2000:]})

    def pytest_runtest_protocol(self, item, nextitem):  # a wrapper around pytest's own (see main)
        self.emit({"start": item.nodeid})
        self.reports[item.nodeid] = {"outcome": "passed", "message": "", "longrepr": ""}
        start = time.monotonic()
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, float(self.spec["timeout"]))
        try:
            return (yield)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            foreign = sorted(
                name
                for name, module in list(sys.modules.items())
                if name.split(".")[0] == "pagedlab"
                and not os.path.realpath(getattr(module, "__file__", None) or "?").startswith(self.src + os.sep)
            )
            result = dict(self.reports[item.nodeid], duration=time.monotonic() - start, foreign=foreign)
            self.emit({"result": item.nodeid, **result})

    def pytest_runtest_logreport(self, report) -> None:
        entry = self.reports.get(report.nodeid)
        if entry is None or entry["outcome"] == "failed":
            return
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            entry.update(outcome="failed", message=crash.message if crash else str(report.longrepr)[-300:])
            entry["longrepr"] = str(report.longrepr)[-3000:]
        elif report.skipped and entry["outcome"] == "passed":
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            entry.update(outcome="skipped", message=str(reason)[-300:])


def _alarm(signum, frame):
    raise GradingTimeout("the test ran past its time limit")


if __name__ == "__main__":
    main()
