"""Stage 1: every attention backend by name, imported only when an engine chooses it.

Builds on: nothing (each backend's module is imported when it is loaded).
Read with: chapters/97-architecture.md (How to add a backend).

    name        class                                        runs              used by
    contiguous  attention/contiguous.py ContiguousAttention  anywhere          stage 1: one region per request
    reference   attention/paged.py PagedAttention            anywhere          stages 2-4: the readable gather
    tiled       attention/tiled.py TiledPagedAttention       anywhere          stage 5: batched decode tiles
    triton      attention/triton/backend.py TritonAttention  CUDA, or a CPU    stage 6: the kernels
                                                             under TRITON_INTERPRET=1

A stage's preset lists the names it can run, its preferred one first; the
setting `attention_backend="torch"` means the preset's first torch backend.
Adding a backend is one file and one line in BACKENDS (and its name in the
presets that may run it). Triton is imported only by its own backend, and only
once an engine loads it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass


def anywhere(device: str) -> bool:
    return True


def triton_can_run(device: str) -> bool:
    """Triton kernels run on a CUDA device, or on the CPU under TRITON_INTERPRET=1 (if Triton is installed)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_available()
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Backend:
    """One attention backend: where its class lives, and where it can run."""

    name: str  # what EngineConfig.attention_backend says once resolved
    target: str  # "module:Class", imported by load()
    family: str  # "torch" | "triton": what `llm.engine.attention_backend` reports
    can_run: Callable[[str], bool] = anywhere  # device -> whether this backend runs there
    needs: str = ""  # where it runs, in words, for the messages of a machine where it cannot

    def load(self) -> type:
        module, cls = self.target.split(":")
        return getattr(importlib.import_module(module), cls)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("contiguous", "pagedlab.attention.contiguous:ContiguousAttention", "torch"),
        Backend("reference", "pagedlab.attention.paged:PagedAttention", "torch"),
        Backend("tiled", "pagedlab.attention.tiled:TiledPagedAttention", "torch"),
        Backend(
            "triton",
            "pagedlab.attention.triton.backend:TritonAttention",
            "triton",
            triton_can_run,
            "Triton and a CUDA device, or TRITON_INTERPRET=1 on a CPU",
        ),  # fmt: skip
    )
}
