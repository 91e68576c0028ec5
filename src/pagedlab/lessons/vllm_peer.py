"""Stage 5: vLLM as a peer: where `pagedlab fetch vllm` put vLLM 0.33.0, and the subprocess that replays runs on it.

Builds on: engine/replay.py (the recordings it is given), model/registry.py (the cache folder),
lessons/vllm_driver.py (the script that runs inside vLLM's environment).
Read with: chapters/09-graduate-to-vllm.md.

vLLM is never imported into pagedlab's process: it pins its own versions of half of pagedlab's
dependencies. `pagedlab fetch vllm` (tools/fetch_vllm.py) makes, under the cache,

    <cache>/vllm/0.33.0/src/vllm/...   the Python sources of the pinned PyPI wheel (no compiled file)
    <cache>/vllm/0.33.0/venv/          an environment with vLLM's pure-Python dependencies (data/vllm-ref.txt),
                                       installed by hash (data/vllm-ref.lock.txt); torch is pagedlab's own CPU
                                       build, found through a .pth file
    <cache>/vllm/0.33.0/.complete      written last: the wheel, its sha256, and every source file's size and
                                       sha256 (model/registry.py's manifest, with paths under src/)

and `run_vllm` starts the driver there once for any number of recordings (its import takes most of the
time), speaking plain JSON on stdin and stdout.

What is checked when: `fetched_problem` (by default; tests ask it whether to skip) checks the
cheap half, each source file's presence, type and size (3,231 files and their manifest: 0.05-0.1 s);
`check_fetched`, before vLLM's code runs, and `fetch` and `verify_vllm` read and hash them all too (57 MB:
0.14-0.3 s with the files in the page cache), beside the 10 s vLLM's scheduler takes to import. So a
same-size edit of a source is never run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from pagedlab.model import registry
from pagedlab.model.files import read_model_json
from pagedlab.model.registry import cache_dir


@dataclass(frozen=True)
class VllmSource:
    """The pinned wheel whose sources the peer runs."""

    version: str = "0.33.0"
    wheel_sha256: str = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
    size_mb: int = 336  # the wheel's download, for messages

    @property
    def requirement(self) -> str:
        return f"vllm=={self.version}"


VLLM = VllmSource()
COMPLETE = ".complete"
NOT_FETCHED = "not fetched yet"
DRIVER = "vllm_driver.py"  # beside this file; run by path, never imported
REQUIREMENTS = "vllm-ref.txt"  # package data: what the environment installs
LOCK = "vllm-ref.lock.txt"  # package data: the same, with the sha256 of every wheel pip may pick (scripts/)


def vllm_home(source: VllmSource = VLLM) -> Path:
    return cache_dir() / "vllm" / source.version


def source_dir(source: VllmSource = VLLM) -> Path:
    return vllm_home(source) / "src"


def venv_python(source: VllmSource = VLLM) -> Path:
    return vllm_home(source) / "venv" / "bin" / "python"


def requirements() -> list[str]:
    """The pinned pure-Python dependencies, one requirement a line (data/vllm-ref.txt, comments left out)."""
    text = files("pagedlab.data").joinpath(REQUIREMENTS).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def lock_text() -> str:
    """data/vllm-ref.lock.txt: the requirements with their hashes, in pip's format (scripts/lock_vllm_ref.py)."""
    return files("pagedlab.data").joinpath(LOCK).read_text(encoding="utf-8")


def fetched_problem(source: VllmSource = VLLM, hashes: bool = False) -> str | None:
    """None when the fetch is whole; else why not (NOT_FETCHED when there is no marker). Every source file is
    checked against the manifest by type and size; with `hashes`, by its sha256 too (what a same-size edit changes)."""
    home = vllm_home(source)
    if not os.path.lexists(home / COMPLETE):
        return NOT_FETCHED
    try:
        manifest = read_model_json(home, COMPLETE)
        if manifest.get("sha256") != source.wheel_sha256:
            return f"{home / COMPLETE}: made from another wheel"
        files = source_files(manifest, home)
    except ValueError as e:
        return str(e)
    if not venv_python(source).exists():
        return f"{venv_python(source)}: missing"
    problems = registry.manifest_problems(source_dir(source), files, nested=True, hashes=hashes)
    return None if not problems else f"{source_dir(source)}: {registry.first_problem(problems)}"


def source_files(manifest: dict, home: Path) -> dict[str, dict]:
    """The manifest's {path under src/: {"size", "sha256"}}; a ValueError when it holds none (an older pagedlab
    wrote only the sources' count and bytes)."""
    files = manifest.get("files")
    if files is None:
        raise ValueError(f"{home / COMPLETE}: fetched by an older pagedlab, without the sha256 of its sources")
    return registry.check_entries(files, home / COMPLETE, nested=True)


def is_fetched(source: VllmSource = VLLM) -> bool:
    return fetched_problem(source) is None


def check_fetched(source: VllmSource = VLLM) -> None:
    """A ValueError saying how to fetch vLLM when it is not (whole, every source's sha256 checked) in the cache."""
    problem = fetched_problem(source, hashes=True)
    if problem == NOT_FETCHED:
        raise ValueError(
            f"vllm: vLLM {source.version} is not fetched yet: run `pagedlab fetch vllm`, which downloads "
            f"{source.size_mb} MB from the package registry into {vllm_home(source)}"
        )
    if problem is not None:
        raise ValueError(f"vllm: {problem}; run `pagedlab fetch vllm --force` to make it again")


def driver_path() -> Path:
    return Path(__file__).with_name(DRIVER)


def run_vllm(recordings: list[dict], model_dir: str | Path | None = None, timeout: float = 900) -> list[dict]:
    """Replay each recording (engine/replay.py) through vLLM's Scheduler, all in one subprocess.

    Returns one {"steps": [...], "error": None | str} per recording: the steps in viz/trace.py's format, as
    vLLM scheduled them. `model_dir`: the Hugging Face folder vLLM's ModelConfig reads (default: the
    bundled model's); a windowed recording gets a tiny Mistral config of its window instead.
    """
    check_fetched()
    from pagedlab.model.loader import BUNDLED_MODEL, resolve_model_path

    folder = Path(model_dir) if model_dir is not None else resolve_model_path(BUNDLED_MODEL)
    job = json.dumps({"model_dir": str(folder), "runs": recordings})
    env = peer_environment()
    done = subprocess.run(
        [str(venv_python()), str(driver_path())], input=job, capture_output=True, text=True, env=env,
        timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"the vLLM driver failed (exit {done.returncode}):\n{tail}")
    runs = json.loads(done.stdout)["runs"]
    if len(runs) != len(recordings):
        raise RuntimeError(f"the vLLM driver answered {len(runs)} runs for {len(recordings)} recordings")
    return runs


def peer_environment() -> dict:
    """The environment a script in vLLM's venv runs with: its sources first, CPU only, offline."""
    return os.environ | {"PYTHONPATH": str(source_dir()), "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}


def python_of_this_process() -> str:
    return sys.executable


def vllm_trace(trace: dict, model_dir=None) -> dict:
    """The same run through vLLM's own Scheduler, as a trace beside `trace` (which must hold a recording:
    to_trace of an engine that ran with record_trace=True). Needs `pagedlab fetch vllm`."""
    from pagedlab.viz.compare import as_trace

    recording = trace.get("recording")
    if recording is None:
        raise ValueError("compare: this trace holds no recording of its run (n > 1, beams or a cache_salt)")
    (result,) = run_vllm([recording], model_dir)
    if result["error"]:
        raise RuntimeError(f"vLLM could not replay the run: {result['error']}")
    return as_trace(result["steps"], trace)
