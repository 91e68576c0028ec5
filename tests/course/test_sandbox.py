"""The sandbox's limits, each tried by a small child: the processes it may start, its /tmp, its memory in all, its
user id and environment (course/sandbox.py, course/limits.py). The grading tests try the same through a body."""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
from pathlib import Path

import pytest

from pagedlab.course import limits, sandbox


def child(tmp_path: Path, code: str, timeout: float = 60) -> dict:
    """Run `code` as a sandboxed child's script; it fills the dict `r`, which comes back."""
    tree = tmp_path / "tree"
    tree.mkdir(exist_ok=True)
    script = "import json, os, sys\nr = {}\n" + textwrap.dedent(code)
    script += "\nos.write(int(sys.argv[1]), (json.dumps(r) + '\\n').encode())\n"
    (tree / "probe.py").write_text(script)
    run = sandbox.run(tree, "probe.py", b"{}", {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, timeout, tmp_path / "log")
    assert run.output, run.log
    return json.loads(run.output.splitlines()[-1])


@pytest.fixture(autouse=True)
def isolated():
    if not sandbox.isolation()[0]:
        pytest.skip(f"no sandbox here: {sandbox.isolation()[1]}")


@pytest.fixture
def as_root():
    if os.geteuid() != 0:
        pytest.skip("only root gives a child a user id of its own (and so a process limit)")


def test_the_child_has_its_own_user_id_and_only_its_own_environment(tmp_path, as_root, monkeypatch):
    monkeypatch.setenv("PAGEDLAB_TEST_SECRET", "hunter2")
    got = child(
        tmp_path,
        """
        r["uid"], r["env"] = os.getuid(), dict(os.environ)
        r["environs"] = {}
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    r["environs"][pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
                except OSError as e:
                    r["environs"][pid] = type(e).__name__
        r["caps"] = [line for line in open("/proc/self/status") if line.startswith("CapEff")][0].split()[1]
    """,
    )
    assert got["uid"] >= limits.FIRST_UID and int(got["caps"], 16) == 0
    assert "PAGEDLAB_TEST_SECRET" not in json.dumps(got)
    assert set(got["env"]) <= {"PATH", "HOME", "PWD", "LC_CTYPE"}  # what it was given, and what Python adds
    assert got["environs"]["1"] in ("PermissionError", "PATH=/usr/bin:/bin\x00")  # pid 1: bwrap, started bare


def test_a_fork_bomb_stops_at_the_process_limit(tmp_path, as_root):
    got = child(
        tmp_path,
        """
        import time
        r["forks"] = 0
        try:
            for _ in range(300):
                if os.fork() == 0:
                    time.sleep(2)
                    os._exit(0)
                r["forks"] += 1
        except OSError as e:
            r["error"] = e.errno
    """,
    )
    assert got["forks"] < limits.PROCESSES and got["error"] == 11  # EAGAIN


def test_tmp_is_private_and_bounded(tmp_path):
    """None of the machine's /tmp is there (only the folders above a Python install bound inside it, as a venv of
    a checkout under /tmp); what the child writes stops at 256 MiB."""
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="pagedlab-marker-") as marker:
        got = child(tmp_path, TMP_PROBE.replace("MARKER", marker.name))
    assert not got["marker"] and set(got["names"]) <= bound_in_tmp(), got["names"]
    assert got["errno"] == 28 and got["written"] <= limits.TMP_BYTES >> 20  # ENOSPC


def bound_in_tmp() -> set[str]:
    """The names in the sandbox's /tmp that are the tops of folders bound inside it (a venv of a checkout there)."""
    return {p.relative_to("/tmp").parts[0] for p in sandbox.python_folders() if p.is_relative_to("/tmp")}


TMP_PROBE = """
r["marker"], r["names"] = os.path.exists("MARKER"), os.listdir("/tmp")
written = 0
try:
    for i in range(100):  # files of 32 MiB (each under the file-size limit), until /tmp is full
        with open(f"/tmp/f{i}", "wb") as f:
            for _ in range(32):
                f.write(b"x" * (1 << 20))
                written += 1
except OSError as e:
    r["errno"] = e.errno
r["written"] = written
"""


def test_memory_is_bounded_for_all_of_a_childs_processes_together(tmp_path, monkeypatch):
    """Six processes of 200 MiB each, under a limit of 512 MiB in all: some are killed (where a cgroup can be made;
    elsewhere each process alone is bounded, which the report says)."""
    if "a cgroup" not in sandbox.isolation()[1]:
        pytest.skip(f"no memory cgroup here: {sandbox.isolation()[1]}")
    monkeypatch.setattr(limits, "MEMORY_BYTES", 512 << 20)
    got = child(
        tmp_path,
        """
        import signal, time
        pids = []
        for _ in range(6):
            pid = os.fork()
            if pid == 0:
                block = bytearray(200 << 20)  # touched: resident, not just reserved
                time.sleep(3)
                os._exit(0)
            pids.append(pid)
        r["killed"] = sum(os.WIFSIGNALED(os.waitpid(pid, 0)[1]) for pid in pids)
    """,
    )
    assert got["killed"] >= 1


def test_without_a_user_id_to_give_the_sandbox_still_runs_and_says_what_is_unbounded(tmp_path, monkeypatch):
    """A grader that is not root (or whose container refuses bwrap without a user namespace) runs bwrap as any
    user does, in a user namespace: the child is isolated as before, and the report says processes are unbounded."""
    monkeypatch.setattr(limits, "child_uid", lambda: None)
    sandbox._mode.cache_clear()
    try:
        isolated, why = sandbox.isolation()
        assert isolated and "processes unbounded" in why
        got = child(tmp_path, "r['uid'] = os.getuid()\nr['tmp'] = os.listdir('/tmp')\n")
        assert got["uid"] < limits.FIRST_UID and set(got["tmp"]) <= bound_in_tmp()
    finally:
        sandbox._mode.cache_clear()
