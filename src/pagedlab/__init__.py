"""pagedlab: vLLM's PagedAttention and continuous batching, one readable stage at a time.

Start with `pagedlab demo` (the CLI) or `from pagedlab import LLM, SamplingParams`.

The names below are imported when first asked for (PEP 562), so that `import pagedlab.sched` or `pagedlab.kv`
never loads torch: the bookkeeping runs where torch cannot, in the live lab's browser tab (chapter 97, Layout).
"""

from __future__ import annotations

import importlib

_WHERE = {  # name -> the module that defines it
    "BUNDLED_MODEL": "pagedlab.model.loader",
    "BeamSearchOutput": "pagedlab.outputs",
    "BeamSearchParams": "pagedlab.sampling_params",
    "BeamSearchSequence": "pagedlab.outputs",
    "CompletionOutput": "pagedlab.outputs",
    "EngineConfig": "pagedlab.config",
    "LLM": "pagedlab.llm",
    "LLMEngine": "pagedlab.engine.engine",
    "LoadedModel": "pagedlab.model.loader",
    "RequestOutput": "pagedlab.outputs",
    "SamplingParams": "pagedlab.sampling_params",
    "load_model": "pagedlab.model.loader",
}
__all__ = sorted(_WHERE)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'pagedlab' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # once found, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
