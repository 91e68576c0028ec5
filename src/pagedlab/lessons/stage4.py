"""Stage 4: the figures of prefix caching: the cache as a tree of chained hashes, and block tables with hits.

Builds on: lessons/common.py (the savers), viz/graphs.py (hash_chain_tree), viz/ (block tables, cached blocks).
Read with: chapters/04-prefix-caching.md.

Two static batches of two in a pool of 11 blocks of 4: A and B, then C (A's whole prompt and more), D (the
shared prefix, then its own word). B shares nothing; its blocks stay cached after it finishes until D's next
block evicts the tail of B's chain.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from pagedlab import viz
from pagedlab.lessons.common import _save, _save_graph
from pagedlab.llm import LLM
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams
from pagedlab.viz import graphs

STAGE4_PREFIX = "ROMEO:\nBut "  # with <bos>: 12 tokens, 3 full blocks of 4
STAGE4_PROMPTS = {
    "A": STAGE4_PREFIX + "soft",
    "B": "JULIET:\nAy me",
    "C": STAGE4_PREFIX + "soft, what",
    "D": STAGE4_PREFIX + "hark",
}
STAGE4_POOL = dict(block_size=4, num_kv_blocks=11, max_num_seqs=2)
STAGE4_STEPS = 5  # batch 1 ends in step 3; C and D prefill in step 4; in step 5 D's next block evicts B's tail


@dataclass
class CacheRun:
    """A stage-4 engine stopped after STAGE4_STEPS steps, with what the stage-4 figures draw."""

    llm: LLM  # its engine is left as it was after the last step
    requests: dict[str, Request]  # every request, kept at add_request (the engine forgets finished ones)
    cached: set[int]  # blocks carrying a block hash after the last step (viz.cached_block_ids)


@functools.cache
def stage4_cache_run() -> CacheRun:
    """STAGE4_PROMPTS on a traced stage-4 engine, greedy, 3 tokens each, stepped by hand STAGE4_STEPS times."""
    llm = LLM(stage=4, record_trace=True, **STAGE4_POOL)
    engine, requests = llm.engine, {}
    for rid, prompt in STAGE4_PROMPTS.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        (requests[rid],) = engine.scheduler.requests.live[rid]
    for _ in range(STAGE4_STEPS):
        engine.step()
    return CacheRun(llm, requests, viz.cached_block_ids(engine.kv_manager.pool))


def fig_04_hash_chain(out_dir: Path) -> Path:
    run = stage4_cache_run()
    title = (
        f"Prefix cache after step {STAGE4_STEPS}: one node per chained block hash (block_size "
        f"{STAGE4_POOL['block_size']}); A and B finished, C and D running"
    )
    graph = graphs.hash_chain_tree(run.requests, run.llm.engine.kv_manager, _decode_showing_bos(run.llm), title)
    return _save_graph(graph, out_dir / "04_hash_chain.png")


def _decode_showing_bos(llm: LLM):
    """The tokenizer's decode, but a leading <bos> is written out: the first block's 4 tokens are <bos> and 3 chars."""
    tokenizer = llm.get_tokenizer()
    bos = tokenizer.token_to_id("<bos>")
    return lambda ids: ("<bos>" if ids[:1] == [bos] else "") + tokenizer.decode(ids)


def fig_04_block_tables_hits(out_dir: Path) -> Path:
    run = stage4_cache_run()
    trace, pool = run.llm.engine.trace, STAGE4_POOL
    hits = viz.prefix_hit_blocks(trace, pool["block_size"])
    fig = viz.plot_block_tables(
        trace[-1],
        pool["num_kv_blocks"],
        pool["block_size"],
        arrows_for=["D"],
        pool_columns=6,
        hits=hits,
        cached=run.cached,
    )
    width, height = fig.get_size_inches()
    fig.set_size_inches(width + 1, height + 0.5)  # room for the four-entry legend below the tables' key
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, out_dir / "04_block_tables_hits.png")
