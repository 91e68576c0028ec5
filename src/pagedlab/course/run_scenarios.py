"""Course: the sandboxed child that runs one task's scenarios on the tree it is given (run as a script).

Builds on: course/scenarios/ (imported from the tree, after sys.path is set).
Read with: course/sandbox.py, chapters/98-assignments.md (The boundary).

    python -I <tree>/src/pagedlab/course/run_scenarios.py FD      stdin: {"stage", "task", "cases", "seeds", "timeout"}

Without "stage" and "task", each case names its own: "suite|task|case" (a stage number or "drills", a task of
it, a case of that task), as a drill's grader asks for cases of many tasks in one child.

It imports pagedlab from <tree>/src only (as a namespace, so pagedlab/__init__.py and torch load only where a
case needs them), runs each case and writes one JSON line per case to FD:

    {"start": name}  then  {"case": name, "obs": ...}  or  {"case": name, "error": "TypeName", "at": [file, line]}

It holds nothing that decides a score: no expected observation, no reference of the task it runs. The parent
reads what arrives as a strict schema (course/messages.py) and compares it; a case that never reports (a hang, an
exit, a crash) has failed.
"""

import importlib
import json
import numbers
import os
import signal
import sys
import traceback
import types


class CaseTimeout(BaseException):
    """SIGALRM: the case ran past its time (the parent kills the whole child later if this is caught)."""


def main() -> None:
    fd = int(sys.argv[1])
    src = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
    spec = json.loads(sys.stdin.readline())
    _guard().install([line.strip() for line in sys.stdin if line.strip()])  # the fallback's only
    sys.path[:] = [src] + [p for p in sys.path if p and not os.path.isdir(os.path.join(p, "pagedlab"))]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()]
    package = types.ModuleType("pagedlab")
    package.__path__ = [os.path.join(src, "pagedlab")]
    sys.modules["pagedlab"] = package  # pagedlab/__init__.py imports torch: only cases that need it do
    out = os.fdopen(fd, "w", buffering=1)
    emit = lambda obj: out.write(json.dumps(obj, default=_plain) + "\n")  # noqa: E731
    from pagedlab.course.scenarios import run_case, stage_scenarios

    def resolve(name: str):  # (its task's scenarios, the case's own name)
        if "stage" in spec:
            return stage_scenarios(spec["stage"])[spec["task"]], name
        suite, task, case = name.split("|")
        return stage_scenarios(int(suite) if suite.isdigit() else suite)[task], case

    warm = []
    for name in spec["cases"]:
        try:
            warm += [m for m in resolve(name)[0].warm if m not in warm]
        except Exception:
            pass  # the case reports it
    for module in warm:  # torch's import is no case's time (the parent's wall clock still bounds it)
        try:
            importlib.import_module(module)
        except Exception:
            pass  # the case that needs it reports the error
    signal.signal(signal.SIGALRM, _alarm)
    for name in spec["cases"]:
        emit({"start": name})
        signal.setitimer(signal.ITIMER_REAL, float(spec["timeout"]))
        try:
            scenarios, case = resolve(name)
            obs = run_case(scenarios, case, spec["seeds"].get(name))
            signal.setitimer(signal.ITIMER_REAL, 0)
            line = json.dumps({"case": name, "obs": obs}, default=_plain)
        except BaseException as e:  # an interrupt, an exit, a timeout: no observation, the case fails
            signal.setitimer(signal.ITIMER_REAL, 0)
            line = json.dumps({"case": name, "error": type(e).__name__, "at": _where(e, src)})
        out.write(line + "\n")
    emit({"done": True})
    out.flush()
    os._exit(0)  # no atexit hook or finalizer of the tested code runs after the report


def _plain(value):
    """numpy's ints and floats count as numbers; anything else is not plain data."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{type(value).__name__} is not plain data")


def _where(error: BaseException, src: str) -> list:
    """The innermost frame inside the tree's pagedlab (the line of the region that raised), as [file, line]."""
    inside = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(src + os.sep)]
    inside = [f for f in inside if "/course/" not in f.filename] or inside
    return [os.path.relpath(inside[-1].filename, src), inside[-1].lineno] if inside else ["", 0]


def _alarm(signum, frame):
    raise CaseTimeout("the case ran past its time limit")


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
