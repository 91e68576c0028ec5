"""`pagedlab fetch vllm`: the pinned wheel checked by hash, only its Python sources unpacked, an environment made,
`.complete` written last; a second fetch does nothing. A fake wheel stands in for vLLM's, and the environment
step is replaced by one that only makes its python (the real one installs from PyPI), so nothing is downloaded."""

import hashlib
import json
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from pagedlab.lessons import vllm_peer
from pagedlab.tools import fetch_vllm
from tests.conftest import need_vllm

ROOT = Path(__file__).resolve().parents[2]


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def test_complete_lists_every_source_file_with_its_size_and_sha256(fake):
    source, wheel = fake
    home = fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lambda _: None)
    manifest = json.loads((home / vllm_peer.COMPLETE).read_text())
    assert manifest["source"] == "vllm==0.33.0" and manifest["sha256"] == source.wheel_sha256
    assert manifest["files"] == {
        name: {"size": (home / "src" / name).stat().st_size, "sha256": sha256(home / "src" / name)}
        for name in ("vllm/__init__.py", "vllm/v1/core/sched/scheduler.py")
    }


@pytest.mark.parametrize("change", ["longer", "missing", "extra", "linked folder"])
def test_changed_sources_are_noticed_and_fetched_again(fake, change, tmp_path):
    source, wheel = fake
    home = fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lambda _: None)
    vllm = home / "src" / "vllm"
    if change == "longer":
        (vllm / "__init__.py").write_text("edited by hand, longer than before\n")
        problem = "vllm/__init__.py: 35 bytes, the manifest says 19"
    elif change == "missing":
        (vllm / "v1" / "core" / "sched" / "scheduler.py").unlink()
        problem = "vllm/v1/core/sched/scheduler.py: missing"
    elif change == "extra":  # a module that would be imported, though no fetch wrote it
        (vllm / "v1" / "sitecustomize.py").write_text("")
        problem = "vllm/v1/sitecustomize.py: not in the manifest"
    else:  # a folder of other sources, linked in
        (tmp_path / "elsewhere").mkdir()
        (vllm / "plugins").symlink_to(tmp_path / "elsewhere")
        problem = "vllm/plugins: not in the manifest"
    assert re.search(problem, vllm_peer.fetched_problem(source))  # the cheap check sees these
    with pytest.raises(ValueError, match=rf"vllm: .*src: {problem}; run `pagedlab fetch vllm --force`"):
        vllm_peer.check_fetched(source)
    lines = []
    fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lines.append)
    assert "fetching again" in lines[0] and vllm_peer.fetched_problem(source, hashes=True) is None


def test_a_same_size_edit_is_seen_by_its_hash_before_vllm_runs(fake):
    source, wheel = fake
    home = fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lambda _: None)
    init = home / "src" / "vllm" / "__init__.py"
    init.write_text(init.read_text().replace("0.33.0", "0.99.9"))  # the same size: only a hash sees it
    assert vllm_peer.fetched_problem(source) is None  # the cheap check (presence, type, size) cannot
    problem = "vllm/__init__.py: sha256 [0-9a-f]{64} is not the manifest's [0-9a-f]{64}"
    assert re.search(problem, vllm_peer.fetched_problem(source, hashes=True))
    with pytest.raises(ValueError, match=f"vllm: .*src: {problem}; run `pagedlab fetch vllm --force`"):
        vllm_peer.check_fetched(source)  # what run_vllm asks before vLLM's code runs
    lines = []
    assert len(fetch_vllm.verify_vllm(source, log=lines.append)) == 1
    assert lines[0].startswith(f"  MISMATCH  {home / 'src'}: vllm/__init__.py: sha256")
    assert lines[-1].endswith("2 source files of " + str(home / "src") + " checked against the manifest: 1 mismatching")
    fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lines.append)  # not idempotent: made again
    assert "fetching again" in lines[2] and fetch_vllm.verify_vllm(source, log=lines.append) == []
    assert lines[-1].endswith("checked against the manifest: all match")


def test_an_older_fetch_without_hashes_is_fetched_again(fake):
    source, wheel = fake
    home = fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lambda _: None)
    old = {"source": "vllm==0.33.0", "sha256": source.wheel_sha256, "sources": {"num_files": 2, "num_bytes": 58}}
    (home / vllm_peer.COMPLETE).write_text(json.dumps(old))
    assert "fetched by an older pagedlab, without the sha256 of its sources" in vllm_peer.fetched_problem(source)
    with pytest.raises(ValueError, match="older pagedlab.*: run `pagedlab fetch vllm --force` to make it again"):
        fetch_vllm.verify_vllm(source, log=lambda _: None)
    lines = []
    fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lines.append)
    assert "fetching again" in lines[0] and "files" in json.loads((home / vllm_peer.COMPLETE).read_text())


@pytest.mark.parametrize("name", ["../outside.py", "/etc/passwd", "vllm//x.py", "vllm/./x.py", "vllm\\x.py", ""])
def test_a_manifest_names_files_under_the_sources_only(fake, name):
    source, wheel = fake
    home = fetch_vllm.fetch_vllm(source, wheel=wheel, progress=False, log=lambda _: None)
    manifest = json.loads((home / vllm_peer.COMPLETE).read_text())
    manifest["files"][name] = {"size": 0, "sha256": "0" * 64}
    (home / vllm_peer.COMPLETE).write_text(json.dumps(manifest))
    assert "field 'files' must map file names to {'size', 'sha256'}" in vllm_peer.fetched_problem(source)


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


def test_the_cli_verifies_the_fetched_vllm_and_refuses_verify_with_force(capsys):
    """`pagedlab fetch vllm --verify` on the real fetch: every source hashed, exit 0; with --force it is a usage
    error naming the flag (exit 2), as for a model."""
    need_vllm()
    from pagedlab.tools.cli import main

    with pytest.raises(SystemExit) as done:
        main(["fetch", "vllm", "--verify"])
    assert done.value.code == 0 and "checked against the manifest: all match" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["fetch", "vllm", "--verify", "--force"])
    assert done.value.code == 2 and "takes neither --wheel nor --force" in capsys.readouterr().err
