"""`pagedlab fetch vllm`: the pinned wheel checked by hash, only its Python sources unpacked, an environment made,
`.complete` written last; a second fetch does nothing. A fake wheel stands in for vLLM's, and the environment
step is replaced by one that only makes its python (the real one installs from PyPI), so nothing is downloaded."""

import hashlib
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from pagedlab.lessons import vllm_peer
from pagedlab.tools import fetch_vllm

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(the fake source, its wheel): two .py files, a compiled one and a binary that must stay in the wheel."""
    monkeypatch.setenv("PAGEDLAB_HOME", str(tmp_path / "home"))
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "VERSION = '0.33.0'\n")
        z.writestr("vllm/v1/core/sched/scheduler.py", "class Scheduler: ...\n")
        z.writestr("vllm/_C.abi3.so", b"\x7fELF")
        z.writestr("vllm/vllm-rs", b"\x7fELF")
        z.writestr("vllm-0.33.0.dist-info/METADATA", "Name: vllm\n")
    source = replace(vllm_peer.VLLM, wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setattr(vllm_peer, "VLLM", source)

    def environment(folder, progress, log):  # the real one: a venv and 67 packages from PyPI
        (folder / "bin").mkdir(parents=True)
        (folder / "bin" / "python").write_text("")

    monkeypatch.setattr(fetch_vllm, "make_environment", environment)
    return source, wheel


def test_fetch_unpacks_only_python_sources_and_is_idempotent(fake):
    source, wheel = fake
    with pytest.raises(ValueError, match="vLLM 0.33.0 is not fetched yet: run `pagedlab fetch vllm`"):
        vllm_peer.check_fetched(source)
    lines = []
    home = fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lines.append)
    files = sorted(str(p.relative_to(home / "src")) for p in (home / "src").rglob("*") if p.is_file())
    assert files == ["vllm/__init__.py", "vllm/v1/core/sched/scheduler.py"]
    assert vllm_peer.fetched_problem(source) is None and lines[-1].startswith("vllm 0.33.0: ready in")
    lines.clear()
    fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lines.append)
    assert lines == [f"vllm 0.33.0: already fetched, in {home}"]


def test_changed_sources_are_noticed_and_fetched_again(fake):
    source, wheel = fake
    home = fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lambda _: None)
    (home / "src" / "vllm" / "__init__.py").write_text("edited by hand, longer than before\n")
    assert "differs from the manifest's" in vllm_peer.fetched_problem(source)
    with pytest.raises(ValueError, match="run `pagedlab fetch vllm --force`"):
        vllm_peer.check_fetched(source)
    lines = []
    fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lines.append)
    assert "fetching again" in lines[0] and vllm_peer.fetched_problem(source) is None


def test_a_wheel_with_another_hash_is_refused(fake, tmp_path):
    source, wheel = fake
    other = tmp_path / "other.whl"
    other.write_bytes(wheel.read_bytes() + b" ")
    with pytest.raises(ValueError, match="sha256 .* is not the pinned .*; refusing it"):
        fetch_vllm.fetch_vllm(source, wheel=other, progress=False, log=lambda _: None)
    assert not vllm_peer.vllm_home(source).exists()


def test_the_environment_is_installed_by_hash_from_the_lock():
    command = fetch_vllm.install_command(Path("/venv/bin/python"), Path("/venv/vllm-ref.lock.txt"))
    assert command[:4] == ["/venv/bin/python", "-m", "pip", "install"]
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(command)
    assert command[-2:] == ["-r", "/venv/vllm-ref.lock.txt"]
    lock = vllm_peer.lock_text()
    for requirement in vllm_peer.requirements():  # each pin of vllm-ref.txt, followed by its hashes
        assert re.search(rf"^{re.escape(requirement)} \\\n    --hash=sha256:[0-9a-f]{{64}}", lock, re.M), requirement


def test_the_vllm_ref_extra_is_the_environments_list():
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python 3.11's; pagedlab runs on 3.10)
    block = text[text.index("\nvllm-ref = [") :]
    extra = re.findall(r'^    "([^"]+)",$', block[: block.index("\n]\n")], re.M)
    assert extra == vllm_peer.requirements()
    assert all("==" in r for r in extra) and not any(r.startswith("torch") for r in extra)
