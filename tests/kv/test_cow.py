"""Stage 3: fork and copy-on-write, told with exact block ids and ref counts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab import SamplingParams
from pagedlab.kv.cow import BlockCopy, CowKVCacheManager
from pagedlab.request import Request

pytestmark = [pytest.mark.stage3, pytest.mark.task("fork-cow")]


def req(rid, prompt_len=6):
    return Request(rid, list(range(prompt_len)), SamplingParams(max_tokens=8), 8)


def grow(kv, r, n):
    new = kv.allocate_slots(r, n)
    if new is not None:
        r.num_computed_tokens += n
    return new


def refs(kv):
    return {b.block_id: b.ref_cnt for b in kv.pool.blocks if b.ref_cnt}


def fork(kv, parent, rid):
    child = req(rid, parent.num_prompt_tokens)
    child.num_computed_tokens = parent.num_computed_tokens
    kv.fork(parent, child)
    return child


def test_fork_shares_then_append_copies_the_partly_filled_block():
    # block_size 4: a 6-token parent holds [0, 1]; block 1 holds 2 tokens and has room for 2 more.
    kv = CowKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=32)
    parent = req("p")
    assert grow(kv, parent, 6) == [0, 1]
    child = fork(kv, parent, "c")
    assert kv.get_block_ids(child) == [0, 1] and refs(kv) == {0: 2, 1: 2}
    # The child writes token 6 into block 1, which the parent also holds: copy 1 -> 2 first. Nothing is
    # appended; the copy says which entry of whose table changed, for the runner's copy of the table.
    assert grow(kv, child, 1) == []
    assert kv.take_block_copies() == [BlockCopy("c", 1, 1, 2)] and kv.take_block_copies() == []
    assert kv.get_block_ids(child) == [0, 2] and refs(kv) == {0: 2, 1: 1, 2: 1}
    # The parent is now block 1's only holder: it writes in place, no copy.
    assert grow(kv, parent, 1) == []
    assert kv.take_block_copies() == []
    kv.check_invariants()


def test_fork_at_a_block_boundary_needs_no_copy():
    kv = CowKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=32)
    parent = req("p", prompt_len=8)
    grow(kv, parent, 8)  # [0, 1], both full
    child = fork(kv, parent, "c")
    assert grow(kv, child, 1) == [2] and kv.take_block_copies() == []  # a fresh block, nothing shared
    assert kv.get_block_ids(child) == [0, 1, 2] and refs(kv) == {0: 2, 1: 2, 2: 1}


def test_freeing_a_fork_only_drops_references():
    kv = CowKVCacheManager(num_kv_blocks=8, block_size=4, max_model_len=32)
    parent = req("p")
    grow(kv, parent, 6)
    child = fork(kv, parent, "c")
    kv.free(parent)
    assert refs(kv) == {0: 1, 1: 1} and kv.num_free_blocks == 6
    kv.free(child)
    assert refs(kv) == {} and kv.num_free_blocks == 8
    kv.check_invariants()


def test_copy_on_write_needs_a_free_block():
    kv = CowKVCacheManager(num_kv_blocks=2, block_size=4, max_model_len=32)
    parent = req("p")
    grow(kv, parent, 6)
    child = fork(kv, parent, "c")
    assert kv.allocate_slots(child, 1) is None  # the copy has nowhere to go
    assert kv.get_block_ids(child) == [0, 1] and kv.take_block_copies() == []


@given(
    block_size=st.sampled_from([1, 2, 4]),
    program=st.lists(
        st.tuples(st.sampled_from(["grow", "fork", "free"]), st.integers(0, 5), st.integers(1, 5)), max_size=40
    ),
)
def test_random_fork_grow_free_programs(block_size, program):
    kv = CowKVCacheManager(num_kv_blocks=16, block_size=block_size, max_model_len=256)
    live: list[Request] = [req("r0", 3)]
    grow(kv, live[0], 3)
    made = 1
    for op, i, n in program:
        if not live:
            break
        r = live[i % len(live)]
        if op == "grow":
            grow(kv, r, n)
        elif op == "fork":
            live.append(fork(kv, r, f"r{made}"))
            made += 1
        else:
            kv.free(live.pop(i % len(live)))
        kv.take_block_copies()
        kv.check_invariants()  # ref_cnt == number of tables holding the block; free queue iff 0
    for r in live:
        kv.free(r)
    kv.check_invariants()
    assert kv.num_free_blocks == 16
