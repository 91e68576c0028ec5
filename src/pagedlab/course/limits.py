"""Course: what bounds a sandboxed child: rlimits, a user id of its own, and a cgroup where one can be made.

Builds on: nothing of pagedlab (it writes shell words and cgroup files).
Read with: course/sandbox.py, chapters/98-assignments.md (The boundary).

    per process     address space 4 GiB, CPU seconds, 512 open files, 64 MiB per file, no core (rlimits)
    per child       /tmp: a 256 MiB tmpfs (sandbox.py)
                    processes and threads: at most 64, counted per user id, so the child runs as a user id
                    of its own (only root can give it one; RLIMIT_NPROC does not bind root)
                    memory: 4 GiB for all its processes together, where a memory cgroup can be made

A grader that is not root cannot change user id: its child then keeps the
teacher's (a fork bomb is stopped by the time limits only), and `bounds()`
says so. A machine whose cgroups are read-only (a container) bounds each
process's memory, not their sum; `bounds()` says that too.
"""

from __future__ import annotations

import itertools
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path

MEMORY_BYTES = 4 << 30  # address space per process, and all of a child's processes together (cgroup)
OPEN_FILES = 512
FILE_BYTES = 64 << 20  # the largest file the child may write (its log, anything under /tmp)
TMP_BYTES = 256 << 20  # the sandbox's /tmp, all files together
PROCESSES = 64  # processes and threads of the child's own user id (torch and Triton start a few threads)
FIRST_UID = 3_000_000_000  # the children's user ids: far above any a system gives out, one per child
_UIDS = itertools.count(secrets.randbelow(1_000_000) * 1000)


def child_uid() -> int | None:
    """A user id no process has, for one child (its process count is then its own); None when not root."""
    return FIRST_UID + next(_UIDS) % 1_000_000_000 if os.geteuid() == 0 else None


def shell_words(timeout: float, uid: int | None, cgroup: Cgroup | None) -> list[str]:
    """A POSIX shell that joins the cgroup, sets the rlimits, then execs the command (bwrap passes them on):
    memory (KiB), CPU seconds, open files, file size (512-byte blocks), no core, and processes when the child
    gets a user id of its own. (Not preexec_fn: the grader runs children from several threads, and a fork
    there must not run Python.)"""
    values = {"v": MEMORY_BYTES >> 10, "t": int(timeout) + 5, "n": OPEN_FILES, "f": FILE_BYTES >> 9, "c": 0}
    if uid is not None:
        values["p"] = PROCESSES  # dash's name for RLIMIT_NPROC
    steps = [f"echo $$ > {path}" for path in (cgroup.procs if cgroup else [])]
    steps += [f"ulimit -{flag} {value}" for flag, value in values.items()]  # dash takes one at a time
    return ["/bin/sh", "-c", " && ".join(steps) + ' && exec "$@"', "sh"]


def drop_to(uid: int) -> list[str]:
    """util-linux's setpriv: the command runs as `uid`, no group, no capability, no way back (no_new_privs)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--bounding-set=-all", "--inh-caps=-all"]  # fmt: skip


@dataclass
class Cgroup:
    """One child's cgroups (memory and pids), made for it and removed after it."""

    folders: list[Path]  # the cgroup folders made for the child (one, or one per v1 hierarchy)

    @property
    def procs(self) -> list[Path]:
        return [folder / "cgroup.procs" for folder in self.folders]

    def remove(self) -> None:
        """Kill what is left in it, then remove it (best effort: a cgroup with a process left stays)."""
        for folder in self.folders:
            try:
                pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except OSError:
                    os.sched_yield()


def make_cgroup(name: str) -> Cgroup | None:
    """Memory and pids cgroups for one child under this process's own (cgroup v2, or v1's two hierarchies), or
    None where they cannot be made (no permission, the controllers not delegated)."""
    own = _own_cgroups()
    if "" in own:  # v2: one folder, both controllers
        return _made([(Path("/sys/fs/cgroup") / own[""].lstrip("/") / name, {"memory.max": MEMORY_BYTES,
                                                                              "pids.max": PROCESSES})])  # fmt: skip
    if "memory" in own and "pids" in own:  # v1: one hierarchy per controller
        memory = Path("/sys/fs/cgroup/memory") / own["memory"].lstrip("/") / name
        pids = Path("/sys/fs/cgroup/pids") / own["pids"].lstrip("/") / name
        return _made([(memory, {"memory.limit_in_bytes": MEMORY_BYTES}), (pids, {"pids.max": PROCESSES})])
    return None


def _own_cgroups() -> dict[str, str]:
    """{controller: this process's cgroup path} from /proc/self/cgroup ("" for v2's unified hierarchy)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    own = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    if "" in own and not Path("/sys/fs/cgroup/cgroup.controllers").is_file():
        del own[""]  # a hybrid machine: the unified hierarchy holds no controller here
    return own


def _made(plan: list[tuple[Path, dict[str, int]]]) -> Cgroup | None:
    """Make each folder and write its limits; on any refusal, undo what was made and return None."""
    made = []
    try:
        for folder, limits in plan:
            folder.mkdir()
            made.append(folder)
            for file, value in limits.items():
                (folder / file).write_text(f"{value}\n")
    except OSError:
        Cgroup(made).remove()
        return None
    return Cgroup(made)


def bounds(uid: int | None, cgroup: Cgroup | None) -> str:
    """What bounds a child, in words (for the report's isolation line)."""
    processes = f"{PROCESSES} processes (its own user id)" if uid is not None else "processes unbounded (not root)"
    memory = f"{MEMORY_BYTES >> 30} GiB in all (a cgroup)" if cgroup else f"{MEMORY_BYTES >> 30} GiB per process"
    return f"{processes}, memory {memory}, /tmp {TMP_BYTES >> 20} MiB"
