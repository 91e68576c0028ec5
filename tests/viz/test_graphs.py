"""Graphviz drawings of shared blocks (stage 3): what they draw matches the block tables."""

import pytest

from pagedlab import LLM, BeamSearchParams, SamplingParams
from pagedlab.kv.prefix import PrefixCachingKVCacheManager
from pagedlab.lessons import (
    BEAM_PARAMS,
    COW_BLOCK_SIZE,
    beam_tree_tables,
    cow_before_after,
    fig_03_beam_tree,
    fig_03_cow_before_after,
)
from pagedlab.request import Request
from pagedlab.viz import CACHED, SHARED, USED
from pagedlab.viz.graphs import _node_id, beam_block_tree, block_sharing_graph, hash_chain_tree, live_tables, short_hash
from tests.conftest import need_dot

pytestmark = pytest.mark.stage3


def test_sharing_graph_marks_shared_blocks_and_copies():
    g = block_sharing_graph({"p": [0, 1], "c": [0, 2]}, title="after CoW", copies=[(1, 2)])
    src = g.source
    assert 'b_0 [label="block 0\\nref_cnt 2"' in src and f'fillcolor="{SHARED}"' in src
    assert 'b_1 [label="block 1\\nref_cnt 1"' in src and f'fillcolor="{USED}"' in src
    assert "r_p -> b_0" in src and "r_c -> b_2" in src
    assert "b_1 -> b_2" in src and "dashed" in src


def test_beam_tree_is_the_union_of_live_tables():
    llm = LLM(stage=3, block_size=4, max_num_seqs=8)
    engine = llm.engine
    engine.add_beam_request("b", "ROMEO:\nWhat", BeamSearchParams(beam_width=4, max_tokens=20))
    for _ in range(9):
        engine.step()
    tables, tokens = live_tables(engine)
    assert len(tables) == 4
    g = beam_block_tree(tables, tokens, 4, llm.get_tokenizer().decode)
    blocks = {b for t in tables.values() for b in t}
    for b in blocks:
        holders = sum(b in t for t in tables.values())
        assert f"ref_cnt {holders}" in g.source.split(f"b_{b} [label=")[1].split("]")[0]
    root = next(iter(tables.values()))[0]
    assert all(t[0] == root for t in tables.values()), "every beam shares the prompt's first block"
    assert g.source.count('-> "beam_') == 4


def test_rendering_writes_a_png(tmp_path):
    need_dot()
    g = block_sharing_graph({"a": [3, 4], "b": [3]})
    path = g.render(tmp_path / "g", format="png", cleanup=True)
    assert (tmp_path / "g.png").stat().st_size > 1000 and path.endswith(".png")


# --- the chapter-3 figures: what they draw is the KV manager's and the engine's real state ---------------------


def test_cow_figure_tables_are_a_fork_then_one_copy():
    before, after, copies = cow_before_after()
    # A 10-token parent holds [0, 1, 2] (block 2: 2 of 4 slots); the fork shares all three, copying nothing.
    assert before == {"parent": [0, 1, 2], "child": [0, 1, 2]}
    # The child's token 10 goes into block 2, which the parent also holds: copy 2 -> 3; full blocks stay shared.
    assert after == {"parent": [0, 1, 2], "child": [0, 1, 3]} and copies == [(2, 3)]


def test_beam_figure_draws_fed_tokens_of_the_live_beams():
    llm, tables, tokens = beam_tree_tables()
    assert len(tables) == BEAM_PARAMS["beam_width"]
    for rid, table in tables.items():
        assert len(table) == -(-len(tokens[rid]) // COW_BLOCK_SIZE)  # a table covers exactly the fed tokens
    kv = llm.engine.kv_manager
    assert kv.num_used_blocks == len({b for t in tables.values() for b in t}) < kv.num_table_blocks()


def test_chapter3_figures_render(tmp_path):
    need_dot()
    for make in (fig_03_cow_before_after, fig_03_beam_tree):
        path = make(tmp_path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


# --- stage 4: the prefix cache as a tree of chained hashes ----------------------------------------------------------


def _admit(kv, r):
    """What the static scheduler does: look up the cache, then allocate the rest of the prompt."""
    r.num_computed_tokens = kv.lookup_prefix(r)
    assert kv.allocate_slots(r, r.num_tokens - r.num_computed_tokens) is not None
    r.num_computed_tokens = r.num_tokens


def _node(src: str, block_hash) -> str:
    """The attribute list of the node drawn for `block_hash`."""
    return src.split(f"{_node_id(block_hash)} [")[1].split("]")[0]


@pytest.mark.stage4
def test_hash_tree_merges_shared_prefixes_and_colours_blocks_by_ref_cnt():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=64)
    a = Request("a", list(range(10)), SamplingParams(), 4)  # blocks [0 1 2 3] [4 5 6 7] [8 9 _ _]
    b = Request("b", [0, 1, 2, 3, 4, 5, 6, 7, 42, 43, 44, 45, 46], SamplingParams(), 4)
    c = Request("c", [9, 9, 9, 9, 1], SamplingParams(), 4)
    _admit(kv, a)
    kv.free(a)  # blocks 0 and 1 stay cached, free
    _admit(kv, b)  # hits blocks 0 and 1, computes [42 43 44 45] in block 2
    _admit(kv, c)
    kv.free(c)
    g = hash_chain_tree({"a": a, "b": b, "c": c}, kv, decode=lambda ids: " ".join(map(str, ids)))
    src = g.source
    h0, h1, h2 = b.block_hashes
    assert a.block_hashes == [h0, h1], "a and b share their first two hashes: one path"
    assert f"root -> {_node_id(h0)}" in src and f"{_node_id(h0)} -> {_node_id(h1)}" in src
    assert f"{_node_id(h1)} -> {_node_id(h2)}" in src and src.count(f"-> {_node_id(h1)}") == 1
    assert f"block 0\\n#{short_hash(h0)}\\nref_cnt 1\\n“0 1 2 3”" in _node(src, h0)
    assert f'fillcolor="{USED}"' in _node(src, h0) and f'fillcolor="{USED}"' in _node(src, h2)
    (c0,) = c.block_hashes
    assert f"root -> {_node_id(c0)}" in src and f'fillcolor="{CACHED}"' in _node(src, c0)  # freed, still cached
    assert f"{_node_id(h1)} -> req_a" in src and f"{_node_id(h2)} -> req_b" in src


@pytest.mark.stage4
def test_hash_tree_draws_evicted_hashes_dashed_and_shared_blocks_shared():
    kv = PrefixCachingKVCacheManager(num_kv_blocks=7, block_size=4, max_model_len=64)
    a = Request("a", list(range(9)), SamplingParams(), 4)
    _admit(kv, a)
    kv.free(a)  # free queue [2 3 4 5 6 1 0]: 2 (no hash) at the head; 1 and 0 cached, the chain's tail (1) first
    x = Request("x", list(range(100, 117)), SamplingParams(), 4)  # 5 blocks: 2 3 4 5 6
    _admit(kv, x)
    y = Request("y", list(range(100, 109)), SamplingParams(), 4)  # hits x's blocks 2 and 3, then takes 1: evicted
    _admit(kv, y)
    assert kv.get_block_ids(y) == [2, 3, 1]
    src = hash_chain_tree([a, x, y], kv).source
    h0, h1 = a.block_hashes
    assert "not cached" in _node(src, h1) and "dashed" in _node(src, h1), "the tail of a's chain went first"
    assert f'fillcolor="{CACHED}"' in _node(src, h0)
    assert "ref_cnt 2" in _node(src, x.block_hashes[0]) and f'fillcolor="{SHARED}"' in _node(src, y.block_hashes[1])


@pytest.mark.stage4
def test_short_hash_is_eight_hex_digits_for_both_algorithms():
    assert short_hash(bytes(range(32))) == "00010203"
    assert short_hash(-1) == "ffffffff" and short_hash(0xABCDEF0123) == "000000ab"
