"""`pagedlab fetch vllm`: vLLM 0.33.0's Python sources and an environment to run its scheduler in, on a CPU.

Builds on: lessons/vllm_peer.py (what and where), tools/fetch.py (pip download, sha256, the cache folder).
Read with: chapters/09-graduate-to-vllm.md.

    1. pip download --no-deps --require-hashes vllm==0.33.0   (336 MB; its dependencies would bring CUDA)
    2. unzip only vllm/**.py from it (57 MB, no compiled file: nothing is built, nothing runs on a GPU)
    3. a virtual environment with vLLM's pure-Python dependencies, every one pinned (data/vllm-ref.txt) and
       installed by hash: pip install --require-hashes --no-deps --only-binary=:all: -r data/vllm-ref.lock.txt
       (the sha256 of every wheel pip may pick, from scripts/lock_vllm_ref.py); torch, and what torch needs,
       is pagedlab's own CPU build, put on its path by a .pth file (xgrammar would otherwise pull a CUDA
       torch: gigabytes)
    4. `.complete`, written last: the wheel's sha256 and every source file's size and sha256 (the manifest of
       model/registry.py); the folder moved into place in one rename

A second fetch finds `.complete`, every source file of its size and sha256, and does nothing (`--force`
redoes it); `verify_vllm` rechecks every hash and says which differ. Nothing of vLLM is imported here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import zipfile
from pathlib import Path

from tqdm import tqdm

from pagedlab.lessons import vllm_peer
from pagedlab.lessons.vllm_peer import COMPLETE, NOT_FETCHED, VLLM, VllmSource
from pagedlab.model import registry
from pagedlab.model.files import read_model_json
from pagedlab.model.registry import cache_dir
from pagedlab.tools.fetch import _check_wheel, _make_folder, check_sha256


def fetch_vllm(
    source: VllmSource = VLLM, wheel: str | Path | None = None, force: bool = False, progress: bool = True, log=print
) -> Path:
    """Make vLLM's sources and environment in the cache (from `wheel` if given, else downloaded)."""
    home = vllm_peer.vllm_home(source)
    _check_wheel(wheel)
    if not force:
        problem = vllm_peer.fetched_problem(source, hashes=True)
        if problem is None:
            log(f"vllm {source.version}: already fetched, in {home}")
            return home
        if problem != NOT_FETCHED:
            log(f"vllm {source.version}: {problem}; fetching again")
    started = time.perf_counter()
    _make_folder(cache_dir())
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".fetch-vllm-") as tmp:
        tmp = Path(tmp)
        wheel_path = Path(wheel) if wheel else download(source, tmp, progress, log)
        check_sha256(wheel_path, source.wheel_sha256, f"{source.requirement} wheel")
        staged = tmp / "home"
        num_files = extract_sources(wheel_path, staged / "src", progress)
        log(f"vllm {source.version}: {num_files} Python files unpacked; making its environment")
        make_environment(staged / "venv", progress, log)
        manifest = {"source": source.requirement, "sha256": source.wheel_sha256,
                    "files": registry.file_entries(staged / "src", nested=True)}  # fmt: skip
        (staged / COMPLETE).write_text(json.dumps(manifest, indent=1) + "\n")
        _make_folder(home.parent)
        if home.exists():
            os.replace(home, tmp / "replaced")
        os.replace(staged, home)
    log(f"vllm {source.version}: ready in {home} ({time.perf_counter() - started:.0f} s)")
    return home


def download(source: VllmSource, into: Path, progress: bool, log) -> Path:
    """pip download the pinned wheel alone, refusing any file whose hash differs."""
    requirement = into / "requirement.txt"
    requirement.write_text(f"{source.requirement} --hash=sha256:{source.wheel_sha256}\n")
    log(f"vllm {source.version}: downloading the wheel ({source.size_mb} MB) with pip")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes"]
    command += ["-r", str(requirement), "-d", str(into), "--progress-bar", "on" if progress else "off"]
    _pip(command, progress, f"pip download {source.requirement}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download {source.requirement}: expected one wheel in {into}, found {len(wheels)}")
    return wheels[0]


def extract_sources(wheel: Path, into: Path, progress: bool) -> int:
    """Every vllm/**.py of the wheel into `into`; each name checked to stay inside it."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            for name in tqdm(names, unit="file", desc="unzip", disable=not progress):
                target = (into / name).resolve()
                if not target.is_relative_to(into.resolve()) or ".." in Path(name).parts:
                    raise ValueError(f"{wheel.name}: member {name!r} would land outside {into}")
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(name) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except zipfile.BadZipFile:
        raise ValueError(f"{wheel.name}: not a wheel (not a zip file)") from None
    if not names:
        raise ValueError(f"{wheel.name}: holds no vllm/ sources")
    return len(names)


def make_environment(folder: Path, progress: bool, log) -> None:
    """A venv with the pinned requirements, installed by hash; then torch's folder (this process's own) on its
    path. The lock it was installed from stays in it."""
    venv.EnvBuilder(with_pip=True).create(folder)
    python = folder / "bin" / "python"
    lock = folder / vllm_peer.LOCK
    lock.write_text(vllm_peer.lock_text(), encoding="utf-8")
    log(f"vllm: installing {len(vllm_peer.requirements())} pinned packages into its environment, each by its hash")
    _pip(install_command(python, lock), progress, "pip install (vllm-ref, by hash)")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    import torch  # the CPU build pagedlab runs on: vLLM's sources run on it too

    torch_site = Path(torch.__file__).resolve().parents[1]
    Path(site, "zz_pagedlab_torch.pth").write_text(f"{torch_site}\n")


def install_command(python: Path, lock: Path) -> list[str]:
    """pip install of the lock: every file refused unless its sha256 is listed, nothing built, no dependency
    resolved (the lock lists every one)."""
    command = [str(python), "-m", "pip", "install", "-q", "--require-hashes", "--no-deps", "--only-binary=:all:"]
    return command + ["-r", str(lock)]


def verify_vllm(source: VllmSource = VLLM, log=print) -> list[str]:
    """Recheck the fetch against its manifest, every source file by sha256: what `pagedlab fetch vllm --verify`
    says. Logs each mismatch and a summary; returns the mismatches (empty: all match). A fetch with no manifest
    (none yet, or an older pagedlab's) is a ValueError saying to fetch it."""
    home, src = vllm_peer.vllm_home(source), vllm_peer.source_dir(source)
    if not os.path.lexists(home / COMPLETE):
        raise ValueError(f"vllm: vLLM {source.version} is not fetched yet: run `pagedlab fetch vllm`")
    try:
        manifest = read_model_json(home, COMPLETE)
        files = vllm_peer.source_files(manifest, home)
    except ValueError as e:
        raise ValueError(f"{e}: run `pagedlab fetch vllm --force` to make it again") from None
    bad = [f"{home / COMPLETE}: made from another wheel"] if manifest.get("sha256") != source.wheel_sha256 else []
    bad += [] if vllm_peer.venv_python(source).exists() else [f"{vllm_peer.venv_python(source)}: missing"]
    bad += [f"{src}: {p}" for p in registry.manifest_problems(src, files, nested=True, hashes=True)]
    for mismatch in bad:
        log(f"  MISMATCH  {mismatch}")
    verdict = f"{len(bad)} mismatching" if bad else "all match"
    log(f"vllm {source.version}: {len(files)} source files of {src} checked against the manifest: {verdict}")
    return bad


def _pip(command: list[str], progress: bool, what: str) -> None:
    done = subprocess.run(command, capture_output=not progress, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or "").strip().splitlines()[-1:] if not progress else []
        raise RuntimeError(f"{what} failed (exit {done.returncode}) {' '.join(detail)}".strip())
