"""Course: where a student's code runs: a bubblewrap sandbox that holds no secret, with limits on what it may use.

Builds on: nothing of pagedlab (it starts processes and reads their output).
Read with: chapters/98-assignments.md (The boundary).

    parent (trusted: the teacher's reference, the seed, the expected observations, the score)
      |  stdin: a spec (which cases, the seed)        fd: the child's observations, plain JSON lines
      v
    bwrap --unshare-all --die-with-parent --cap-drop ALL       (no network, no other process, no capability)
        /usr, the Python install, its site-packages       read-only, pagedlab's own entries hidden
        /grading                                          the tree to grade, read-only
        /tmp                                              private, empty
      python -I /grading/src/pagedlab/course/run_scenarios.py   under rlimits: memory, CPU time, open files

Nothing else of the machine is there: not the teacher's checkout, not the
workspace, not the parent's files. Where `bwrap` is missing or refused
(`isolation()` says why), the child runs as a plain process with the same
limits and an audit hook that refuses the teacher's folders, and every report
says in one line that it ran without isolation.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

MEMORY_BYTES = 4 << 30  # address space: torch and Triton's interpreter need about 1 GiB
OPEN_FILES = 512
FILE_BYTES = 64 << 20  # the largest file the child may write (its log, anything under /tmp)
MAX_OUTPUT = 32 << 20  # bytes of observations read back at most
INSIDE = "/grading"  # where the tree is, in the sandbox


@dataclass
class Run:
    """What came back from one child."""

    output: bytes  # what it wrote to its result fd (observations or test outcomes), at most MAX_OUTPUT
    returncode: int | None  # None: killed by the parent
    killed: str  # why the parent killed it ("" if it exited)
    log: str  # the tail of its stdout and stderr
    isolated: bool  # ran inside bwrap


@cache
def isolation() -> tuple[bool, str]:
    """(True, "") when bwrap runs a sandbox here; else (False, why not). PAGEDLAB_GRADER_SANDBOX=none forces the
    plain-process fallback (to test it)."""
    if os.environ.get("PAGEDLAB_GRADER_SANDBOX") == "none":
        return False, "PAGEDLAB_GRADER_SANDBOX=none"
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed (apt-get install bubblewrap)"
    probe = subprocess.run([*_bwrap_args(), "--", sys.executable, "-I", "-c", "pass"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        return False, f"bwrap refused to start a sandbox: {probe.stderr.decode(errors='replace').strip()[-200:]}"
    return True, ""


def run(tree: Path, script: str, spec: bytes, env: dict, timeout: float, log_file: Path, forbidden=(), item_limit=0.0):
    """Run `python -I <tree>/<script>` on `tree` (sandboxed where possible): `spec` on its stdin, its results read
    from the fd named in argv[1], killed at `timeout` seconds, or when an item it announced ({"start": ...}) runs
    `item_limit` seconds without a next line. `forbidden`: folders the fallback's hook refuses."""
    isolated, _ = isolation()
    read, write = os.pipe()
    root = INSIDE if isolated else str(tree)
    argv = [sys.executable, "-I", f"{root}/{script}", str(write)]
    if isolated:
        argv = [*_bwrap_args(), "--ro-bind", str(tree), INSIDE, "--chdir", INSIDE, "--clearenv",
                *[a for k, v in env.items() for a in ("--setenv", k, v)], "--", *argv]  # fmt: skip
    else:
        spec = spec + b"\n" + "\n".join(forbidden).encode()
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            [*_limits(timeout), *argv], stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
            pass_fds=(write,), cwd=None if isolated else tree, env=None if isolated else env, start_new_session=True,
        )  # fmt: skip
    os.close(write)
    try:
        proc.stdin.write(spec)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    output, killed = _read(proc, read, time.monotonic() + timeout, item_limit)
    text = log_file.read_bytes()[-6000:].decode(errors="replace")
    return Run(output, None if killed else proc.returncode, killed, text, isolated)


def _read(proc, fd: int, deadline: float, item_limit: float) -> tuple[bytes, str]:
    """Everything the child writes to `fd` until it closes it; kill it at the deadline, when an announced item runs
    past `item_limit`, or past MAX_OUTPUT."""
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    chunks, size, killed, started = [], 0, "", None
    try:
        while True:
            now = time.monotonic()
            if now > deadline or (item_limit and started is not None and now - started > item_limit):
                killed = "the grading's time limit" if now > deadline else "the time limit of one case"
                break
            if not sel.select(timeout=min(deadline - now, 0.5)):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_OUTPUT:
                killed = f"more than {MAX_OUTPUT >> 20} MiB of results"
                break
            last = chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1]
            started = time.monotonic() if last.startswith(b'{"start"') else None
    finally:
        sel.close()
        os.close(fd)
    if killed:
        _kill(proc)
    else:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            killed = "not exiting after its results"
    return b"".join(chunks), killed


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _limits(timeout: float) -> list[str]:
    """A POSIX shell that sets the rlimits, then execs the command (bwrap passes them on): memory (KiB), CPU
    seconds, open files, file size (512-byte blocks), no core. (Not preexec_fn: the grader runs children from
    several threads, and a fork there must not run Python.)"""
    values = {"v": MEMORY_BYTES >> 10, "t": int(timeout) + 5, "n": OPEN_FILES, "f": FILE_BYTES >> 9, "c": 0}
    limits = " && ".join(f"ulimit -{flag} {value}" for flag, value in values.items())  # dash takes one at a time
    return ["/bin/sh", "-c", limits + ' && exec "$@"', "sh"]


def _bwrap_args() -> list[str]:
    """bwrap with a read-only system and Python, pagedlab's installed entries hidden, a private /tmp."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # fmt: skip
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    for folder in python_folders():
        args += ["--ro-bind", str(folder), str(folder)]
    for entry in pagedlab_entries():
        args += ["--tmpfs", str(entry)] if entry.is_dir() else ["--ro-bind", "/dev/null", str(entry)]
    return args


@cache
def python_folders() -> list[Path]:
    """The Python install and every folder of site-packages, less any that is (or is inside) a pagedlab checkout."""
    here = Path(__file__).resolve().parents[3]  # a checkout's root (src/pagedlab/course/sandbox.py)
    candidates = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve().parent.parent}
    candidates |= {Path(p) for p in sys.path if p and Path(p).is_dir()}
    keep = set()
    for path in candidates:
        path = path.resolve()
        if path.is_relative_to(here) and not path.is_relative_to(Path(sys.prefix).resolve()):
            continue  # the checkout itself (its src/ on sys.path): never bound; a venv inside it is fine
        if (path / "pagedlab" / "__init__.py").exists() or path.is_relative_to("/usr") or path == Path("/"):
            continue
        keep.add(path)
    return sorted(p for p in keep if not any(p != q and p.is_relative_to(q) for q in keep))


@cache
def pagedlab_entries() -> list[Path]:
    """What an installed pagedlab leaves in site-packages (its .pth, its editable finder, its dist-info, the
    package): hidden in the sandbox, so `import pagedlab` there finds only the tree being graded."""
    here = str(Path(__file__).resolve().parents[3])
    visible = [Path("/usr"), *python_folders()]
    found = []
    for folder in {*site.getsitepackages(), site.getusersitepackages(), *sys.path}:
        folder = Path(folder)
        if not folder.is_dir() or not any(folder.resolve().is_relative_to(p) for p in visible):
            continue
        for entry in folder.iterdir():
            named = "pagedlab" in entry.name.lower()
            points_here = entry.suffix == ".pth" and entry.is_file() and here in entry.read_text(errors="replace")
            if named or points_here:
                found.append(entry)
    return sorted(set(found))
