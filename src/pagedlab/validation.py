"""Stage 1: checks on a request before it enters the engine (DESIGN §5: clear ValueErrors).

Builds on: config.py, model/tokenizer.py.
Read with: chapters/01-contiguous-static.md.

Every check runs before any engine state changes, so a bad request is
refused whole and the requests already running never notice it.
"""

from __future__ import annotations

from pagedlab.config import FIELD_STAGE, STAGE_NAMES, EngineConfig
from pagedlab.model.tokenizer import Tokenizer


def check_prompt(prompt, tokenizer: Tokenizer | None, vocab_size: int, max_model_len: int):
    """Return (text or None, token ids) for a str or list[int] prompt, or raise ValueError."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt: empty prompt")
        if tokenizer is None:
            raise ValueError("prompt: this model folder has no tokenizer.json; pass token ids instead of text")
        text, ids = prompt, tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        text, ids = None, list(prompt)
    else:
        raise ValueError(f"prompt: expected str or list[int], got {type(prompt).__name__}")
    if not ids:
        raise ValueError("prompt: empty prompt")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt: token id {bad[0]} is outside the vocabulary (0 .. {vocab_size - 1})")
    if len(ids) >= max_model_len:
        raise ValueError(f"prompt: {len(ids)} tokens leave no room for output within max_model_len ({max_model_len})")
    return text, ids


def check_request_options(config: EngineConfig, priority: int, cache_salt: str | None) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority: expected an int, got {priority!r}")
    if priority != 0 and config.scheduling_policy != "priority":
        stage = FIELD_STAGE["scheduling_policy"]
        raise ValueError(
            f"priority: {priority} needs scheduling_policy='priority' (stage {stage}, {STAGE_NAMES[stage]})"
        )
    if cache_salt is not None and not config.enable_prefix_caching:
        stage = FIELD_STAGE["enable_prefix_caching"]
        raise ValueError(f"cache_salt: needs prefix caching (stage {stage}, {STAGE_NAMES[stage]}, enabled)")
