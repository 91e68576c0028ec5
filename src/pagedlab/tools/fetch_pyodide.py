"""`pagedlab fetch pyodide`: CPython for the browser (Pyodide), from its npm package, for the live lab's page.

Builds on: model/registry.py (the cache, the manifest of sizes and sha256s), tools/fetch.py (the folder rules).
Read with: chapters/05-continuous-batching.md (The live lab).

    1. download the pinned tarball from the npm registry (6.5 MB; no npm needed: one HTTPS GET)
    2. check it against the registry's own pin, its sha512 `integrity`, written here
    3. take out only the files a page needs to start Python (FILES: the loader, the WebAssembly interpreter, the
       standard library, the lock file), each a regular file of a bounded size
    4. `.complete`, written last: every file's size and sha256; the folder moved into place in one rename

The lab's page then loads Python from its own folder (`pagedlab lab --html OUT` copies these in): nothing is
fetched from a CDN when it runs. A second fetch finds `.complete` and does nothing (`--force` redoes it);
`verify_pyodide` rechecks every hash.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pagedlab.model import registry
from pagedlab.model.registry import COMPLETE, cache_dir
from pagedlab.tools.fetch import _make_folder


@dataclass(frozen=True)
class PyodideSource:
    version: str
    url: str
    integrity: str  # the npm registry's pin of the tarball: "sha512-" + base64 of its digest
    size: int  # bytes of the tarball


PYODIDE = PyodideSource(
    "314.0.8",
    "https://registry.npmjs.org/pyodide/-/pyodide-314.0.8.tgz",
    "sha512-74Wq1kXOC+CCEzAfxuRAO701nAcCMLjf8NrwvWpu8S41dVMXwXmLQ05dYB+F4e46AdnGo0oq7YHSVUpHsoarLQ==",
    6_487_361,
)
# what loadPyodide() reads to start CPython with its standard library (no package is loaded: the lab needs none)
FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json",
         "package.json", "README.md")  # fmt: skip
MAX_FILE = 32 << 20  # no file of the package comes near it
NOT_FETCHED = "not fetched yet"
LICENCE = "Pyodide is distributed under the Mozilla Public License 2.0 (https://github.com/pyodide/pyodide)."


def pyodide_home(source: PyodideSource = PYODIDE) -> Path:
    return cache_dir() / "pyodide" / source.version


def fetched_problem(source: PyodideSource = PYODIDE, hashes: bool = False) -> str | None:
    """None when fetched and whole (model/registry.py's checks of a manifest: every listed file regular and of its
    size, nothing unlisted; `hashes`: each sha256 too); else what is wrong, in words."""
    problems = _problems(source, hashes)
    return registry.first_problem(problems)


def _problems(source: PyodideSource, hashes: bool) -> list[str]:
    home = pyodide_home(source)
    if not os.path.lexists(home / COMPLETE):
        return [NOT_FETCHED]
    try:
        files = registry.read_manifest(home)  # bounded and checked, as a model folder's
    except ValueError as e:
        return [str(e)]
    missing = [f"{name}: not in the manifest" for name in FILES if name not in files]
    return missing + registry.manifest_problems(home, files, hashes=hashes)


def fetch_pyodide(source: PyodideSource = PYODIDE, tarball: Path | None = None, force: bool = False, log=print):
    """Put Pyodide's files in the cache (from `tarball` if given, else downloaded); returns their folder."""
    home = pyodide_home(source)
    problem = None if force else fetched_problem(source)
    if not force and problem is None:
        log(f"pyodide {source.version}: already fetched, in {home}")
        return home
    data = Path(tarball).read_bytes() if tarball else download(source, log)
    check_integrity(data, source)
    _make_folder(home.parent)
    with tempfile.TemporaryDirectory(dir=home.parent, prefix=".fetch-pyodide-") as tmp:
        folder = Path(tmp) / "pyodide"
        folder.mkdir()
        extract(data, folder)
        (folder / "NOTICE").write_text(f"Pyodide {source.version}, from {source.url}\n{LICENCE}\n")
        files = registry.file_entries(folder)
        (folder / COMPLETE).write_text(json.dumps({"source": source.url, "files": files}, indent=1))
        if home.exists():
            shutil.rmtree(home)
        folder.rename(home)
    log(f"pyodide {source.version}: fetched into {home}")
    return home


def download(source: PyodideSource, log) -> bytes:
    log(f"pyodide {source.version}: downloading {source.url} ({source.size / 2**20:.1f} MiB)")
    try:
        with urllib.request.urlopen(source.url, timeout=60) as response:  # noqa: S310  (a pinned https address)
            data = response.read(source.size + 1)  # bounded: the pinned size, and one byte to see it is more
    except OSError as e:
        raise RuntimeError(f"download {source.url}: {e}") from None
    if len(data) != source.size:
        raise RuntimeError(f"download {source.url}: {len(data)} bytes, not the pinned {source.size}")
    return data


def check_integrity(data: bytes, source: PyodideSource) -> None:
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != source.integrity:
        raise ValueError(f"pyodide {source.version}: the tarball's {digest[:24]}... is not the pinned integrity")


def extract(data: bytes, into: Path) -> None:
    """FILES out of the tarball's package/ folder, each a regular file under MAX_FILE bytes."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        for name in FILES:
            member = members.get(f"package/{name}")
            if member is None or not member.isfile() or member.size > MAX_FILE:
                raise ValueError(f"pyodide tarball: package/{name} is missing or not a regular file of a sane size")
            (into / name).write_bytes(tar.extractfile(member).read())


def verify_pyodide(source: PyodideSource = PYODIDE, log=print) -> list[str]:
    """Every way the fetched files differ from the manifest, sha256s included (empty: all match), each logged."""
    bad = _problems(source, hashes=True)
    for problem in bad:
        log(f"pyodide {source.version}: {problem}")
    if not bad:
        log(f"pyodide {source.version}: every file matches its manifest, in {pyodide_home(source)}")
    return bad
