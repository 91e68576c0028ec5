"""Course: what both sandboxed children share: the fallback's audit hook (loaded by path, before pagedlab is).

Builds on: nothing (the children load it with importlib before sys.path points at the tree).
Read with: course/sandbox.py (the fallback), course/run_scenarios.py, course/grading_runner.py.

Inside bwrap the teacher's folders are simply absent. Without bwrap (the fallback, which every report flags)
this hook refuses to open them and to start a process: a best effort, since an audit hook in the same process
as the code it watches can be worked around.
"""

import os
import sys


def install(forbidden: list[str]) -> None:
    """Refuse `open` inside the `forbidden` folders and every way of starting a process (none given: nothing)."""
    if not forbidden:
        return
    forbidden = [os.path.realpath(p) for p in forbidden]

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, bytes)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if any(path == p or path.startswith(p + os.sep) for p in forbidden):
                raise PermissionError(f"grading: {path} may not be opened by graded code")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
            raise PermissionError(f"grading: {event} is not allowed in graded code")

    sys.addaudithook(audit)
