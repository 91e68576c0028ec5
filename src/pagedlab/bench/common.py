"""Benchmarks: what several benches share: the corpus their prompts are cut from, and engines built for timing.

Builds on: llm.py, attention/tiled.py, tools/train.py (corpus_path).
Read with: chapters/05-continuous-batching.md (Measurements).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedlab.llm import LLM


def corpus_token_ids(tokenizer=None, num_chars: int | None = None) -> list[int]:
    """The bundled corpus (its first `num_chars` characters; all by default) as a tokenizer encodes it (the
    bundled one by default: <bos> first)."""
    from pagedlab.model.loader import bundled_model_path
    from pagedlab.model.tokenizer import Tokenizer
    from pagedlab.tools.train import corpus_path

    tokenizer = tokenizer or Tokenizer.from_file(bundled_model_path() / "tokenizer.json")
    return tokenizer.encode(corpus_path().read_text(encoding="utf-8")[:num_chars])


def timing_llm(stage: int | str, **engine_args) -> LLM:
    """An LLM for a timed run: its torch attention is the tiled decode (attention/tiled.py) whatever the stage.

    Stages 1-4 read the reference attention, written to be obvious; the tiled one computes the same numbers
    with a few batched ops. Timing a static stage-4 engine against a continuous stage-5 one with two
    different attention implementations would measure the implementations, not the schedulers.
    """
    from pagedlab.attention.paged import PagedAttention
    from pagedlab.attention.tiled import TiledPagedAttention
    from pagedlab.llm import LLM

    llm = LLM(stage=stage, **engine_args)
    runner = llm.engine.runner
    if type(runner.attention) is PagedAttention:
        mc = llm.engine.model_config
        runner.attention = TiledPagedAttention(runner.attention.kv_cache, mc.num_queries_per_kv, mc.head_dim)
    return llm
