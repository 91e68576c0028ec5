"""Sliding-window attention (Mistral, Qwen2 with use_sliding_window): the tokens equal transformers' at every
stage, the blocks behind the window are freed into the null block's place, and nothing leaks."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab import LLM, SamplingParams
from pagedlab.kv.block_pool import cdiv
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.kv.swap import SwappingKVCacheManager
from pagedlab.model.config import ModelConfig
from pagedlab.request import Request
from tests.conftest import need_triton
from tests.model.hf_models import greedy_folders

WINDOW = 8
PROMPTS = [list(range(3, 23)), list(range(5, 40)), [7, 8, 9]]  # longer and shorter than the window
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """kind -> (folder, transformers' greedy tokens for PROMPTS)."""
    return greedy_folders(tmp_path_factory, ("mistral", "qwen2-window", "qwen2-mixed"), PROMPTS, MAX_TOKENS)


def run(folder, prompts=PROMPTS, **engine):
    llm = LLM(str(folder), max_model_len=96, debug_checks=True, **engine)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    return llm, [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_the_configs_say_which_layers_slide(folders):
    assert ModelConfig.from_file(folders["mistral"][0] / "config.json").layer_windows == (WINDOW, WINDOW)
    assert ModelConfig.from_file(folders["qwen2-window"][0] / "config.json").kv_window == WINDOW
    mixed = ModelConfig.from_file(folders["qwen2-mixed"][0] / "config.json")
    assert mixed.layer_windows == (None, WINDOW) and mixed.kv_window is None  # a full layer needs every block
    # (a model of both kinds keeps a table per kind: tests/engine/test_hybrid.py)


@pytest.mark.stage2
@pytest.mark.parametrize("kind", ["mistral", "qwen2-window"])
@pytest.mark.parametrize("stage", [2, 3, 4, 5])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_greedy_tokens_equal_transformers_and_nothing_leaks(folders, kind, stage, block_size):
    folder, want = folders[kind]
    llm, got = run(folder, stage=stage, block_size=block_size)
    assert got == want
    kv = llm.engine.kv_manager
    assert llm.engine.config.sliding_window == WINDOW and kv.window.null_block is not None
    assert kv.num_used_blocks == 0 and kv.window.null_block.ref_cnt == 0  # every block back, the null block untouched


def test_the_window_changes_the_tokens(folders, tmp_path):
    """Without the window the same weights answer otherwise: the parity above is not a coincidence."""
    import json
    import shutil

    folder, want = folders["qwen2-window"]
    full = tmp_path / "full"
    shutil.copytree(folder, full)
    cfg = json.loads((full / "config.json").read_text())
    cfg["use_sliding_window"] = False
    (full / "config.json").write_text(json.dumps(cfg))
    assert run(full, stage=5, block_size=4)[1] != want


@pytest.mark.stage6
@pytest.mark.parametrize("block_size", [4, 16])
def test_stage_6_triton_kernels_equal_transformers_with_a_window(folders, block_size):
    need_triton()
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    folder, want = folders["mistral"]
    llm = LLM(str(folder), stage=6, block_size=block_size, max_model_len=96, max_num_seqs=3, device=device)
    assert llm.engine.attention_backend == "triton"
    llm.engine.runner.attention.partition_size = 16  # V2 over windows that span partitions
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == [w[:8] for w in want] and llm.engine.kv_manager.num_used_blocks == 0


@pytest.mark.stage5
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_a_long_request_holds_the_windows_blocks_plus_at_most_two(folders, block_size):
    folder, _ = folders["mistral"]
    llm = LLM(str(folder), stage=5, block_size=block_size, max_model_len=96, record_trace=True)
    llm.generate([list(range(3, 43))], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True), use_tqdm=False)
    decodes = [t.kv_held["0"] for t in llm.engine.trace if "0" in t.kv_held and t.scheduled.get("0") == 1]
    assert decodes and max(decodes) <= (cdiv(WINDOW, block_size) + 2) * block_size
    full_len = 40 + 50 - 1
    assert max(decodes) < cdiv(full_len, block_size) * block_size  # without the window it would hold them all


# -- the KV managers, program by program -------------------------------------------------------------------


def req(rid: str, prompt_len: int = 5) -> Request:
    return Request(rid, list(range(prompt_len)), SamplingParams(max_tokens=64), 64)


def grow(kv, r, n):
    new = kv.allocate_slots(r, n)
    if new is not None:
        r.num_computed_tokens += n
    return new


def test_blocks_behind_the_window_become_the_null_block_tail_first():
    kv = PagedKVCacheManager(num_kv_blocks=10, block_size=4, max_model_len=64, sliding_window=6)
    assert kv.window.null_block.block_id == 0 and kv.num_free_blocks == 9
    a = req("a", 12)
    assert grow(kv, a, 12) == [1, 2, 3]  # positions 0-11; nothing skipped before the first step
    # position 12 sees 7..12: logical block 0 (positions 0-3 < 7) is dropped first, and its block 1, freed to the
    # free queue's head (no cached prefix), is the very block the new position gets
    assert grow(kv, a, 1) == [1]
    assert kv.get_block_ids(a) == [0, 2, 3, 1]
    grow(kv, a, 3)  # positions 13-15: the step's first query (13) sees 8..13
    assert kv.get_block_ids(a) == [0, 0, 3, 1]
    assert [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()][0] == 2  # freed to the head
    kv.free(a)
    kv.check_invariants()
    assert kv.num_used_blocks == 0 and kv.window.null_block.ref_cnt == 0


def admit(kv, r, k):
    """As the scheduler admits: cache hits first, then k more tokens, if the free blocks it counts are there.
    What blocks_to_admit counts is exactly what admission takes from the free queue."""
    hits = kv.get_computed_blocks(r)
    k = min(k, r.num_tokens - len(hits) * kv.block_size)
    need, free = kv.blocks_to_admit(r, hits, k), kv.num_free_blocks
    if need > free:
        return
    r.num_computed_tokens = kv.take_hits(r, hits)
    assert grow(kv, r, k) is not None and kv.num_free_blocks == free - need
    skipped = kv.window.num_skipped_blocks(r.num_computed_tokens - k)
    assert kv.get_block_ids(r)[:skipped] == [0] * skipped


@pytest.mark.stage5
@given(
    block_size=st.sampled_from([1, 2, 4]),
    window=st.sampled_from([1, 3, 8]),
    program=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["admit", "grow", "fork", "free", "swap"]), st.integers(1, 7)),
        max_size=40,
    ),  # fmt: skip
)
def test_random_programs_never_leak_nor_touch_the_null_block(block_size, window, program):
    kv = SwappingKVCacheManager(24, block_size, 256, num_swap_blocks=24, sliding_window=window)
    live = {i: req(str(i), 120) for i in range(4)}  # prompts long enough for every growth below
    swapped: set[int] = set()
    n = 0
    for who, op, k in program:
        r = live[who]
        k = min(k, r.num_tokens - r.num_computed_tokens)
        if op == "admit" and r.request_id not in kv.req_to_blocks and who not in swapped:
            admit(kv, r, k)
        elif op == "grow" and who not in swapped and k:
            before = kv.get_block_ids(r)
            new = grow(kv, r, k)
            after = kv.get_block_ids(r)
            if new is not None:
                assert after[len(before) :] == new and len(after) * block_size >= r.num_computed_tokens
                skipped = max(0, r.num_computed_tokens - k - window + 1) // block_size
                assert all(b == 0 for b in after[:skipped])  # every block before the window is the null block
        elif op == "fork" and who not in swapped and r.num_computed_tokens:
            n += 1
            child = req(f"c{n}", 120)
            child.num_computed_tokens = r.num_computed_tokens
            kv.fork(r, child)
            kv.free(live[(who + 1) % 4])
            swapped.discard((who + 1) % 4)
            live[(who + 1) % 4] = child
        elif op == "swap":
            if who in swapped:
                if kv.blocks_to_swap_in(r, 0) <= kv.num_free_blocks:
                    kv.swap_in(r)
                    swapped.discard(who)
            elif kv.can_swap_out([r]) and kv.req_to_blocks.get(r.request_id):
                kv.take_block_copies()
                kv.swap_out(r)
                swapped.add(who)
        elif op == "free":
            kv.free(r)
            swapped.discard(who)
            n += 1
            live[who] = req(f"r{n}", 120)
        kv.check_invariants()
        null = kv.window.null_block
        assert null.ref_cnt == 0 and null not in kv.pool.free_block_queue.get_all_free_blocks()
    for r in live.values():
        kv.free(r)
    kv.check_invariants()
    assert kv.num_used_blocks == 0 and kv.num_free_blocks == 23


def test_a_prefix_hit_still_works_behind_a_window():
    kv = PrefixCachingKVCacheManager(16, 4, 64, sliding_window=4)
    a = req("a", 14)
    grow(kv, a, 13)
    grow(kv, a, 1)  # a's first blocks fall behind its window: freed, still cached
    assert kv.get_block_ids(a)[:2] == [0, 0]
    b = req("b", 13)
    b.num_computed_tokens = kv.lookup_prefix(b)
    assert b.num_computed_tokens == 12  # the whole cached run, as without a window
    grow(kv, b, 1)
    assert kv.get_block_ids(b)[0] == 0  # and b drops what its own window cannot see
    kv.free(a)
    kv.free(b)
    kv.check_invariants()
    assert kv.num_used_blocks == 0


def free_queue(kv) -> list[int]:
    return [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()]


def test_cached_blocks_behind_the_window_count_as_computed_but_take_no_block():
    # Window 4, block_size 4: a request admitted with 12 cached tokens sees keys from 9 on, so its first two
    # hits (tokens 0-7) are the null block at once: not touched, not counted as blocks to take.
    kv = PrefixCachingKVCacheManager(8, 4, 64, sliding_window=4)
    a = req("a", 13)
    grow(kv, a, 13)  # [1 2 3 4]; 1, 2 and 3 full, so cached
    kv.free(a)  # 4 (no hash) to the head, the cached 3, 2, 1 to the tail
    d = Request("d", list(range(100, 116)), SamplingParams(max_tokens=64), 64)  # another prompt: no hit
    grow(kv, d, 16)
    assert kv.get_block_ids(d) == [4, 5, 6, 7] and free_queue(kv) == [3, 2, 1]  # a's cached blocks, tail first
    b = req("b", 14)  # a's first 12 tokens, then two more
    hits = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [0, 0, 3]
    assert kv.blocks_to_admit(b, hits, 2) == 2 <= kv.num_free_blocks  # block 3 revived, one new (not 4 > 3)
    b.num_computed_tokens = kv.take_hits(b, hits)
    assert b.num_computed_tokens == 12 and kv.prefix_cache_hits == 12  # the null entries' tokens count as hits
    assert free_queue(kv) == [2, 1] and [kv.pool.blocks[i].ref_cnt for i in (0, 1, 2, 3)] == [0, 0, 0, 1]
    assert grow(kv, b, 2) == [2]  # the head of the queue: a's block 2, its hash evicted
    assert kv.get_block_ids(b) == [0, 0, 3, 2] and free_queue(kv) == [1] and kv.num_free_blocks == 3 - 2
    kv.free(b)
    kv.free(d)
    kv.check_invariants()
    assert kv.num_used_blocks == 0 and kv.usage == 0.0 and kv.reset_prefix_cache()


def test_a_hit_behind_the_window_keeps_its_place_in_the_free_queue():
    # Untouched, a's blocks 1 and 2 stay where LRU put them, ahead of c's block 4 (touched and freed again,
    # they would move behind it and outlive it in the cache).
    kv = PrefixCachingKVCacheManager(8, 4, 64, sliding_window=4)
    a, c = req("a", 13), Request("c", [90, 91, 92, 93], SamplingParams(max_tokens=4), 4)
    grow(kv, a, 13)
    kv.free(a)
    grow(kv, c, 4)
    kv.free(c)
    assert free_queue(kv) == [5, 6, 7, 3, 2, 1, 4]  # a's uncached block 4 went to the head, and c took it
    b = req("b", 14)
    b.num_computed_tokens = kv.lookup_prefix(b)
    assert grow(kv, b, 2) == [5] and kv.get_block_ids(b) == [0, 0, 3, 5]
    assert free_queue(kv) == [6, 7, 2, 1, 4]


def test_static_admission_takes_no_block_for_a_hit_behind_the_window():
    # Stage 4 admits by worst case: b's hits behind its window need no block, and revive none.
    kv = PrefixCachingKVCacheManager(8, 4, 64, sliding_window=4)
    a = req("a", 13)
    grow(kv, a, 13)
    kv.free(a)  # free queue: 4 5 6 7 3 2 1, with 1 2 3 cached (4, not full, to the head)
    b = Request("b", list(range(13)), SamplingParams(max_tokens=20), 20)  # worst case cdiv(32, 4) = 8 blocks
    assert [h.block_id for h in kv.get_computed_blocks(b)] == [0, 0, 3]
    assert kv.can_admit([b], []) is True  # 8 - 3 entries found + 1 revived = 6 <= 7 free (not 8 - 3 + 3)
    assert free_queue(kv) == [4, 5, 6, 7, 3, 2, 1]  # asking touched nothing


def test_chapter_2_quotes_the_figures_run():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    rows = {r["run"]: r for r in json.loads((root / "figures" / "02_sliding_window.json").read_text())["rows"]}
    chapter = (root / "chapters" / "02-paged-blocks.md").read_text()
    for name, label in (("full", "no window"), ("window", "window of 16 tokens")):
        r = rows[name]
        line = (f"| {label} | {r['steps']} | {r['preemptions']} | {r['peak_blocks_used']} of {r['num_kv_blocks']} "
                f"| {r['mean_blocks_used']:.2f} | {r['longest_request_peak_blocks']} blocks |")  # fmt: skip
        assert line in chapter, line
