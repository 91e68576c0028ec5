"""Hybrid models (full and sliding layers in one model): one block table per KV cache group over one pool.

Tiny random transformers models whose config.json mixes the kinds (Qwen2's `layer_types`, and its
`max_window_layers`) run through stages 2-5: the tokens equal transformers' (or the no-cache oracle's, for
sampling), every group keeps its own table (the windowed one frees what falls behind its window, the full one
keeps every block), prefix-cache hits are served by every group, and preemption by recompute or swap, n > 1 and
aborts disturb nothing; nothing leaks.
"""

from __future__ import annotations

import os

import pytest

from pagedlab import LLM, SamplingParams, load_model, oracle
from pagedlab.kv.cache_groups import KVCacheGroup
from pagedlab.kv.hybrid import HybridKVCacheManager
from tests.conftest import need_triton
from tests.engine.test_sliding_window import MAX_TOKENS, PROMPTS, WINDOW, run
from tests.equivalence import assert_matches_oracle
from tests.model.hf_models import greedy_folders

pytestmark = pytest.mark.stage5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """kind -> (folder, transformers' greedy tokens for PROMPTS)."""
    return greedy_folders(tmp_path_factory, ("qwen2-hybrid", "qwen2-mixed"), PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("kind", ["qwen2-hybrid", "qwen2-mixed"])
@pytest.mark.parametrize("stage", [2, 3, 4, 5])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_hybrid_models_equal_transformers_with_a_table_per_group(folders, kind, stage, block_size):
    folder, want = folders[kind]
    llm, got = run(folder, stage=stage, block_size=block_size)
    assert got == want
    kv = llm.engine.kv_manager
    assert isinstance(kv, HybridKVCacheManager) and llm.engine.config.sliding_window == 0
    assert [g.kind for g in kv.groups] == (["sliding-8", "full"] if kind == "qwen2-hybrid" else ["full", "sliding-8"])
    assert kv.num_used_blocks == 0 and kv.null_block.block_id == 0 and kv.null_block.ref_cnt == 0


def test_the_groups_are_vllms_and_each_layer_reads_its_own_groups_table(folders):
    folder, _ = folders["qwen2-hybrid"]
    llm = LLM(str(folder), stage=5, block_size=4, max_model_len=96)
    assert llm.engine.kv_manager.groups == (KVCacheGroup(WINDOW, (0, 2), 2), KVCacheGroup(None, (1, 3), 2))
    assert llm.engine.runner.attention.group_of == {0: 0, 2: 0, 1: 1, 3: 1}
    # chapter 2's ledger: a KV tensor per layer, every block id with room in every layer (vLLM: one per group slot)
    assert llm.engine.runner.attention.kv_cache.shape[:3] == (4, 2, llm.engine.config.num_kv_blocks)


def test_the_windowed_group_frees_behind_its_window_while_the_full_group_keeps_every_block(folders):
    """A 35-token prompt and 24 outputs, 4 tokens to a block: the full group's table grows to 15 blocks; the
    sliding group's keeps its length but every block wholly behind the window is the null block (0), so it
    holds at most the window's blocks, one chunk's, and one more."""
    folder, want = folders["qwen2-hybrid"]
    llm, got = run(folder, prompts=[PROMPTS[1]], stage=5, block_size=4, record_trace=True)
    assert got == [want[1]]
    last = llm.engine.trace[-1].group_tables["0"]
    sliding, full = last
    assert len(full) == len(sliding) == 15 and 0 not in full
    held = [b for b in sliding if b != 0]
    assert sliding[: len(sliding) - len(held)] == [0] * (len(sliding) - len(held)) and len(held) <= 3
    assert not set(held) & set(full)  # one pool, each block in one group's table


@pytest.mark.parametrize("stage", [4, 5])
def test_a_prefix_cache_hit_is_served_by_every_group(folders, stage):
    """The same 35-token prompt again, once the first has ended: both groups find its blocks (the window's only
    for its last window: the rest of its hit is the null block), and the tokens are still transformers'."""
    folder, want = folders["qwen2-hybrid"]
    llm = LLM(str(folder), stage=stage, block_size=4, max_model_len=96, debug_checks=True, enable_prefix_caching=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    first = llm.generate([PROMPTS[1]], params, use_tqdm=False)[0]
    kv = llm.engine.kv_manager
    second = llm.generate([PROMPTS[1]], params, use_tqdm=False)[0]
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == want[1]
    assert second.num_cached_tokens == 32  # 8 full blocks of the 35 prompt tokens (the last token is computed)
    assert kv.prefix_cache_hits == 32 and kv.num_used_blocks == 0


def test_a_hybrid_hit_is_the_longest_prefix_every_group_can_serve():
    """Unit level, with hand-made hashes: the full group has the first 6 blocks cached, the window (2 blocks'
    worth) only blocks 0-2 and 4-5. The fixed point: the full group offers 6 blocks; the window's last run of
    2 cached blocks ending at or before block 6 is blocks 4-5; 6 blocks every group serves, the window's first
    four the null block. With block 4 gone from the window's cache, its last run is 1-2: 3 blocks."""
    from pagedlab.kv.swap import SwappingKVCacheManager
    from pagedlab.request import Request

    groups = [KVCacheGroup(None, (0,), 1), KVCacheGroup(9, (1,), 1)]
    kv = HybridKVCacheManager(SwappingKVCacheManager, groups, 32, 4, 64)
    request = Request("a", list(range(3, 3 + 30)), SamplingParams(max_tokens=4), 4)
    full, window = kv.managers
    kv.get_computed_blocks(request)  # computes the request's block hashes
    hashes = request.block_hashes
    blocks = kv.pool.allocate(12)
    for i in range(6):
        full.pool.index.insert(blocks[i], hashes[i])
    for i in (0, 1, 2, 4, 5):
        window.pool.index.insert(blocks[6 + i], hashes[i])
    kv.pool.free(blocks)  # free and still cached
    hits = kv.get_computed_blocks(request)
    assert [len(h) for h in hits] == [6, 6]
    assert hits[0] == blocks[:6] and hits[1][:4] == [kv.null_block] * 4 and hits[1][4:] == [blocks[10], blocks[11]]
    kv.pool.index.evict(blocks[10])  # the window's block 4
    hits = kv.get_computed_blocks(request)
    assert [len(h) for h in hits] == [3, 3] and hits[1] == [kv.null_block, blocks[7], blocks[8]]
    kv.pool.index.evict(blocks[0])  # the full group's first block: no hit at all
    assert kv.get_computed_blocks(request) == ([], [])


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_disturbs_no_token(folders, mode):
    """A pool too small for the three prompts at once: requests are preempted (every group's blocks freed, or
    swapped out and back), and every token is still transformers'."""
    folder, want = folders["qwen2-hybrid"]
    swap = {"num_swap_blocks": 64} if mode == "swap" else {}
    llm, got = run(folder, stage=5, block_size=4, num_kv_blocks=36, preemption_mode=mode, **swap)
    assert got == want and llm.engine.scheduler.num_preemptions > 0
    kv = llm.engine.kv_manager
    assert kv.num_used_blocks == 0 and kv.shared_swap.num_free == kv.shared_swap.num_blocks


def test_n_children_and_an_abort_beside_them_equal_the_oracle(folders):
    """n = 2 seeded children share their prompt's blocks in every group (copy-on-write per group); a request
    aborted mid-run frees every group's blocks; the others equal the oracle (full recomputation, per-layer
    windows)."""
    folder, _ = folders["qwen2-hybrid"]
    llm = LLM(str(folder), stage=5, block_size=4, max_model_len=96, debug_checks=True, enable_prefix_caching=True)
    engine = llm.engine
    params = SamplingParams(n=2, max_tokens=MAX_TOKENS, temperature=1.0, seed=7, ignore_eos=True)
    greedy = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    engine.add_request("kids", PROMPTS[0], params)
    engine.add_request("gone", PROMPTS[1], greedy)
    engine.add_request("plain", PROMPTS[2], greedy)
    outputs = {}
    for step in range(200):
        if step == 3:
            engine.abort_request("gone")
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        if not engine.has_unfinished_requests():
            break
    assert [c.finish_reason for c in outputs["gone"].outputs] == ["abort"]
    m = load_model(folder)
    for child in outputs["kids"].outputs:
        expected = oracle.generate(m.model, PROMPTS[0], params, (), 96, seed=7 + child.index)
        assert_matches_oracle(child.token_ids, expected, f"kids[{child.index}]")
    expected = oracle.generate(m.model, PROMPTS[2], greedy, (), 96)
    assert_matches_oracle(outputs["plain"].outputs[0].token_ids, expected, "plain")
    assert engine.kv_manager.num_used_blocks == 0


@pytest.mark.stage6
def test_stage_6_triton_kernels_equal_transformers_on_a_hybrid_model(folders):
    """Stage 6's kernels read each layer's own group's block table and slot mapping (a null entry where the
    window dropped a block is never loaded)."""
    need_triton()
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    folder, want = folders["qwen2-hybrid"]
    llm = LLM(str(folder), stage=6, block_size=4, max_model_len=96, max_num_seqs=3, device=device)
    assert llm.engine.attention_backend == "triton"
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == [w[:8] for w in want] and llm.engine.kv_manager.num_used_blocks == 0


@pytest.mark.parametrize("family", ["window", "hybrid"])
def test_no_event_names_the_null_block_and_a_hybrid_hit_names_every_groups_blocks(family):
    """The null block (0) is never allocated, freed, hit or shared: a step's events leave it out, for a sliding
    window's tables as for a hybrid model's (it once showed up as "freed 0,0,0,0,..."); a prefix-cache hit of a
    hybrid request names its hit blocks in every group."""
    from pagedlab.engine.replay import ReplayEngine
    from pagedlab.lessons.differential import workload
    from pagedlab.viz.trace import to_trace

    hybrid_hits = 0
    for seed in range(6):
        trace = to_trace(ReplayEngine(workload(family, seed)).run())
        for step in trace["steps"]:
            for event in step["events"]:
                assert 0 not in event["blocks"], (seed, step["step"], event)
                if event["kind"] == "hit" and family == "hybrid":
                    groups = step["tables"][event["request"]]
                    in_groups = [g for g in groups if set(event["blocks"]) & set(g)]
                    hybrid_hits += 1
                    assert len(in_groups) == len(groups), event  # every group served part of the hit
    assert family == "window" or hybrid_hits > 0


def test_the_default_pool_holds_a_table_per_group_for_every_seat(folders):
    """Without num_kv_blocks the pool holds max_num_seqs requests of max_model_len: for a hybrid model, in every
    group, and the null block (a pool made for one table refused a full-length request at the door)."""
    folder, _ = folders["qwen2-hybrid"]
    llm = LLM(str(folder), stage=5, block_size=4, max_model_len=64, max_num_seqs=1)
    assert llm.engine.config.num_kv_blocks == 2 * 16 + 1
    params = SamplingParams(max_tokens=64 - 20, temperature=0, ignore_eos=True)
    (out,) = llm.generate([list(range(3, 23))], params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 44


def test_a_drawing_or_the_chat_reads_the_full_groups_table(folders):
    """viz/graphs.py's live tables and the chat tell one row per request: a hybrid model's full-attention table."""
    from pagedlab.kv.hybrid import one_table
    from pagedlab.viz.graphs import short_hash

    folder, _ = folders["qwen2-hybrid"]
    kv = LLM(str(folder), stage=5, block_size=4, max_model_len=96).engine.kv_manager
    assert one_table(kv, ([0, 0, 5], [1, 2, 3])) == [1, 2, 3] and one_table(kv, [4, 5]) == [4, 5]
    assert short_hash((1, b"\xab\xcd\xef\x01\x23")) == "1:abcdef01"
