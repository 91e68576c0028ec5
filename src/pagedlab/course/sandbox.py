"""Course: where a student's code runs: a bubblewrap sandbox that holds no secret, with limits on what it may use.

Builds on: course/limits.py (rlimits, a user id of its own, a cgroup).
Read with: chapters/98-assignments.md (The boundary).

    parent (trusted: the teacher's reference, the seed, the expected observations, the score)
      |  stdin: a spec (which cases, the seed)        fd: the child's observations, plain JSON lines
      v
    sh: join the child's cgroup (memory, pids), set the rlimits      started with PATH alone in its environment
    bwrap --unshare-{pid,net,ipc,uts,cgroup} --die-with-parent      (no network, no other process; as root no
                                                                     user namespace, so that the drop below holds)
        /usr, the Python install, its site-packages       read-only, pagedlab's own entries hidden
        /grading                                          the tree to grade, read-only
        /tmp                                              private, empty, 256 MiB
        /proc                                             its own: pid 1 is bwrap, whose environment is PATH
      setpriv: a user id of its own, no group, no capability     (when the grader is root)
      python -I /grading/src/pagedlab/course/run_scenarios.py   with CHILD_ENV only (--clearenv)

Nothing else of the machine is there: not the teacher's checkout, not the
workspace, not the folder the grader was started in, not the parent's files
or environment. Where `bwrap` is missing or refused (`isolation()` says why),
the child runs as a plain process with the same rlimits and an audit hook that
refuses the teacher's folders, and every report says in one line that it ran
without isolation.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pagedlab.course import limits

MAX_OUTPUT = 32 << 20  # bytes of observations read back at most
INSIDE = "/grading"  # where the tree is, in the sandbox
LAUNCH_ENV = {"PATH": "/usr/bin:/bin"}  # bwrap's own environment: pid 1 in the sandbox, its /proc/1/environ


@dataclass
class Run:
    """What came back from one child."""

    output: bytes  # what it wrote to its result fd (observations or test outcomes), at most MAX_OUTPUT
    returncode: int | None  # None: killed by the parent
    killed: str  # why the parent killed it ("" if it exited)
    log: str  # the tail of its stdout and stderr
    isolated: bool  # ran inside bwrap


def isolation() -> tuple[bool, str]:
    """(True, what bounds a child) when bwrap runs a sandbox here; else (False, why not).
    PAGEDLAB_GRADER_SANDBOX=none forces the plain-process fallback (to test it)."""
    isolated, why, _ = _mode()
    return isolated, why


@cache
def _mode() -> tuple[bool, str, bool]:
    """(isolated, what bounds a child or why not, whether each child gets a user id of its own). As root, first
    without a user namespace, so that a child's user id is a real one (RLIMIT_NPROC holds); where that is refused
    (a container without CAP_SYS_ADMIN), in a user namespace, as any user runs bwrap."""
    if os.environ.get("PAGEDLAB_GRADER_SANDBOX") == "none":
        return False, "PAGEDLAB_GRADER_SANDBOX=none", False
    if shutil.which("bwrap") is None:
        return False, "bwrap is not installed (apt-get install bubblewrap)", False
    refused, own = "", limits.child_uid()
    for uid in [own, None] if own is not None else [None]:
        if uid is not None and shutil.which("setpriv") is None:
            continue  # (util-linux's: without it a child run by root cannot leave root)
        cgroup = limits.make_cgroup(f"pagedlab-probe-{os.getpid()}")
        try:
            argv = [*limits.shell_words(60, uid, cgroup), *_bwrap_args(uid), "--", *_drop(uid), sys.executable, "-I",
                    "-c", "pass"]  # fmt: skip
            probe = subprocess.run(argv, capture_output=True, timeout=60, env=LAUNCH_ENV)
        finally:
            if cgroup:
                cgroup.remove()
        if probe.returncode == 0:
            return True, limits.bounds(uid, cgroup), uid is not None
        refused = probe.stderr.decode(errors="replace").strip()[-200:]
    return False, f"bwrap refused to start a sandbox: {refused}", False


def run(tree: Path, script: str, spec: bytes, env: dict, timeout: float, log_file: Path, forbidden=(), item_limit=0.0):
    """Run `python -I <tree>/<script>` on `tree` (sandboxed where possible): `spec` on its stdin, its results read
    from the fd named in argv[1], killed at `timeout` seconds, or when an item it announced ({"start": ...}) runs
    `item_limit` seconds without a next line. `forbidden`: folders the fallback's hook refuses."""
    isolated, _ = isolation()
    read, write = os.pipe()
    root = INSIDE if isolated else str(tree)
    argv = [sys.executable, "-I", f"{root}/{script}", str(write)]
    uid = limits.child_uid() if isolated and _mode()[2] else None
    cgroup = limits.make_cgroup(f"pagedlab-{os.getpid()}-{uid}") if isolated else None
    if isolated:
        if uid is not None:
            _readable_by_all(tree)
        argv = [*_bwrap_args(uid), "--ro-bind", str(tree), INSIDE, "--chdir", INSIDE, "--clearenv",
                *[a for k, v in env.items() for a in ("--setenv", k, v)], "--", *_drop(uid), *argv]  # fmt: skip
    else:
        spec = spec + b"\n" + "\n".join(forbidden).encode()
    try:
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(
                [*limits.shell_words(timeout, uid, cgroup), *argv], stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(write,), cwd=None if isolated else tree,
                env=LAUNCH_ENV if isolated else env, start_new_session=True,
            )  # fmt: skip
        os.close(write)
        try:
            proc.stdin.write(spec)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        output, killed = _read(proc, read, time.monotonic() + timeout, item_limit)
    finally:
        if cgroup:
            cgroup.remove()
    text = log_file.read_bytes()[-6000:].decode(errors="replace")
    return Run(output, None if killed else proc.returncode, killed, text, isolated)


def _drop(uid: int | None) -> list[str]:
    return limits.drop_to(uid) if uid is not None else []


def _readable_by_all(tree: Path) -> None:
    """The child's own user id must read the tree (mkdtemp makes folders 0700); the tree is bound alone, so its
    parents stay as they are. Nothing in it is a secret."""
    for folder, _, files in os.walk(tree):
        os.chmod(folder, os.stat(folder).st_mode | 0o555)
        for name in files:
            path = os.path.join(folder, name)
            os.chmod(path, os.stat(path).st_mode | 0o444)


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


def _bwrap_args(uid: int | None = None) -> list[str]:
    """bwrap with a read-only system and Python, pagedlab's installed entries hidden, a private /tmp and /proc.
    Run by root with a user id to drop to, it makes no user namespace (the child's user id is then a real one,
    whose process count RLIMIT_NPROC bounds) and keeps the capabilities setpriv needs to drop them all."""
    unshare = ["--unshare-all"] if uid is None else ["--unshare-pid", "--unshare-net", "--unshare-ipc",
                                                     "--unshare-uts", "--unshare-cgroup-try"]  # fmt: skip
    # fmt: off
    args = ["bwrap", *unshare, "--die-with-parent", "--new-session", *(["--cap-drop", "ALL"] if uid is None else []),
            "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(limits.TMP_BYTES), "--tmpfs", "/tmp"]
    # fmt: on
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    parents = sorted({p for f in python_folders() for p in f.parents if p != Path("/")}, key=lambda p: len(p.parts))
    for parent in parents:  # a bind's missing parents would be made 0700: the child's own user id could not pass
        args += ["--perms", "0755", "--dir", str(parent)]
    for folder in python_folders():
        args += ["--ro-bind", str(folder), str(folder)]
    for entry in pagedlab_entries():
        args += ["--tmpfs", str(entry)] if entry.is_dir() else ["--ro-bind", "/dev/null", str(entry)]
    return args


@cache
def python_folders() -> list[Path]:
    """The Python install and its site-packages folders, less any that is (or is inside) a pagedlab checkout. Only
    those: never the folder the grader was started in (`python -m` puts it first on sys.path), nor PYTHONPATH's."""
    here = Path(__file__).resolve().parents[3]  # a checkout's root (src/pagedlab/course/sandbox.py)
    candidates = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve().parent.parent}
    candidates |= {Path(p) for p in sysconfig.get_paths().values()}
    candidates |= {Path(p) for p in site.getsitepackages()}
    keep = set()
    for path in candidates:
        if not path.is_dir():
            continue
        path = path.resolve()
        if path.is_relative_to(here) and not path.is_relative_to(Path(sys.prefix).resolve()):
            continue  # the checkout itself: never bound; a venv inside it is fine
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
