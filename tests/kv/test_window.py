"""Stage 2: the sliding window's part of a KV manager on its own (kv/window.py): which blocks fall behind the
window, the null block in their place, and NoWindow answering the same questions with 'none'."""

import pytest

from pagedlab.kv.block_pool import BlockPool
from pagedlab.kv.window import NoWindow, SlidingWindow, make_window

pytestmark = pytest.mark.stage2


def test_blocks_wholly_behind_every_query_are_skipped():
    window = SlidingWindow(8, 4, BlockPool(8))
    # a query at position p sees keys p - 7 .. p: block i (tokens 4i .. 4i + 3) is skipped once 4i + 3 < p - 7
    assert [window.num_skipped_blocks(p) for p in (0, 7, 10, 11, 12, 14, 15, 16)] == [0, 0, 0, 1, 1, 1, 2, 2]


def test_free_skipped_puts_the_null_block_in_place_tail_first_and_only_once():
    pool = BlockPool(8)
    window = SlidingWindow(8, 4, pool)
    assert window.null_block.block_id == 0 and pool.num_free == 7
    table = pool.allocate(4)  # blocks 1 2 3 4
    window.free_skipped(table, 14)  # one block behind the window
    assert table == [window.null_block] + [pool.blocks[i] for i in (2, 3, 4)]
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()][0] == 1  # no hash: to the head
    window.free_skipped(table, 14)  # nothing new: no double free
    window.free_skipped(table, 15)  # a second block: stops at the null entry before it
    assert [b.block_id for b in table] == [0, 0, 3, 4] and pool.num_free == 5
    assert window.held(table) == [pool.blocks[3], pool.blocks[4]]
    window.check_invariants()
    pool.check_invariants()


def test_cache_hits_behind_the_window_become_the_null_block():
    pool = BlockPool(8)
    window = SlidingWindow(4, 4, pool)
    hits = pool.allocate(3)  # 12 tokens hit: a query at 12 sees keys 9 .. 12, so blocks 0 and 1 are behind it
    assert window.skip_hits(hits) == [window.null_block, window.null_block, hits[2]]
    assert window.skip_hits(hits[:1]) == hits[:1]  # 4 tokens: a query at 4 still sees block 0


def test_no_window_skips_nothing():
    window = make_window(0, 4, BlockPool(4))
    assert isinstance(window, NoWindow) and window.null_block is None
    table = [object(), object()]
    window.free_skipped(table, 10_000)
    assert window.num_skipped_blocks(10_000) == 0 and list(window.held(table)) == table
    assert window.skip_hits(table) == table
    assert isinstance(make_window(8, 4, BlockPool(4)), SlidingWindow)
