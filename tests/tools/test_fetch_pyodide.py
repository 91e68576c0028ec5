"""`pagedlab fetch pyodide`: only the pinned tarball is taken, only the files a page needs come out of it, each a
regular file, and the folder's manifest is checked as a model's is."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from dataclasses import replace

import pytest

from pagedlab.tools import fetch_pyodide as fp


def tarball(files: dict[str, bytes], links: tuple[str, ...] = ()) -> bytes:
    """An npm tarball: every file under package/; `links`: names made symbolic links instead."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            if name in links:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def pinned(data: bytes) -> fp.PyodideSource:
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    return replace(fp.PYODIDE, integrity=integrity, size=len(data))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDLAB_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_a_pinned_tarball_gives_the_files_a_page_needs_and_a_manifest(home):
    data = tarball({name: f"<{name}>".encode() for name in (*fp.FILES, "console.html")})
    (home / "p.tgz").write_bytes(data)
    source = pinned(data)
    assert fp.fetched_problem(source) == fp.NOT_FETCHED
    folder = fp.fetch_pyodide(source, tarball=home / "p.tgz", log=lambda _: None)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*fp.FILES, "NOTICE", fp.COMPLETE])  # no console
    assert (folder / "pyodide.asm.wasm").read_bytes() == b"<pyodide.asm.wasm>"
    assert fp.fetched_problem(source) is None and fp.verify_pyodide(source, log=lambda _: None) == []
    sha = json.loads((folder / fp.COMPLETE).read_text())["files"]["python_stdlib.zip"]["sha256"]
    (folder / "python_stdlib.zip").write_bytes(b"<python_stdlib.zap>")  # same size, other bytes
    (bad,) = fp.verify_pyodide(source, log=lambda _: None)  # the registry's words for a model folder's file
    assert bad.startswith("python_stdlib.zip: sha256 ") and bad.endswith("is not the manifest's " + sha)
    (folder / "python_stdlib.zip").write_bytes(b"short")
    assert fp.fetched_problem(source) == "python_stdlib.zip: 5 bytes, the manifest says 19"
    fp.fetch_pyodide(source, tarball=home / "p.tgz", log=lambda _: None)  # a damaged folder is fetched again
    assert fp.verify_pyodide(source, log=lambda _: None) == []


def test_a_tarball_that_is_not_the_pinned_one_is_refused_before_anything_is_written(home):
    data = tarball({name: b"x" for name in fp.FILES})
    (home / "p.tgz").write_bytes(data)
    with pytest.raises(ValueError, match="not the pinned integrity"):
        fp.fetch_pyodide(fp.PYODIDE, tarball=home / "p.tgz", log=lambda _: None)
    assert not fp.pyodide_home().exists()


def test_a_member_that_is_a_link_or_missing_is_refused(home):
    for data in (tarball({name: b"x" for name in fp.FILES}, links=("pyodide.mjs",)),
                 tarball({name: b"x" for name in fp.FILES[1:]})):  # fmt: skip
        (home / "p.tgz").write_bytes(data)
        with pytest.raises(ValueError, match="package/pyodide.mjs is missing or not a regular file"):
            fp.fetch_pyodide(pinned(data), tarball=home / "p.tgz", log=lambda _: None)


def test_the_pin_is_the_registrys_integrity_of_the_version_the_lab_names():
    assert fp.PYODIDE.url.endswith(f"/pyodide-{fp.PYODIDE.version}.tgz")
    assert fp.PYODIDE.integrity.startswith("sha512-") and len(base64.b64decode(fp.PYODIDE.integrity[7:])) == 64


def test_a_file_left_in_the_folder_or_a_broken_manifest_is_named(home):
    data = tarball({name: b"x" for name in fp.FILES})
    (home / "p.tgz").write_bytes(data)
    source = pinned(data)
    folder = fp.fetch_pyodide(source, tarball=home / "p.tgz", log=lambda _: None)
    (folder / "extra.js").write_text("x")
    assert fp.fetched_problem(source) == "extra.js: not in the manifest"
    (folder / "extra.js").unlink()
    (folder / fp.COMPLETE).write_text('{"files": {"../x": {"size": 1}}}')
    assert "field 'files' must map file names" in fp.fetched_problem(source)
