"""The runner's slot mapping: where each new token's K/V lands, through its request's block table."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab import LLM, SamplingParams
from pagedlab.worker.runner import ModelRunner

pytestmark = [pytest.mark.stage2, pytest.mark.task("slot-mapping")]


def slots(block_size: int, table, req_idx, positions) -> list[int]:
    runner = SimpleNamespace(config=SimpleNamespace(block_size=block_size))
    got = ModelRunner.slot_mapping(runner, np.array(table, dtype=np.int32), np.array(req_idx), np.array(positions))
    assert got.dtype == np.int64
    return got.tolist()


def test_a_mixed_step_lands_every_token_in_its_own_block():
    # A decodes its 6th token (position 5: block 1 of its table, offset 1); B prefills positions 2..5,
    # crossing from its block 0 into its block 1. Blocks of 4 slots.
    table = [[7, 3, 0], [5, 2, 0]]
    assert slots(4, table, [0, 1, 1, 1, 1], [5, 2, 3, 4, 5]) == [3 * 4 + 1, 5 * 4 + 2, 5 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1]


def test_block_size_one_is_the_table_itself():
    assert slots(1, [[4, 9, 1]], [0, 0, 0], [0, 1, 2]) == [4, 9, 1]


@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    tables=st.lists(st.lists(st.integers(0, 63), min_size=4, max_size=4, unique=True), min_size=1, max_size=4),
    data=st.data(),
)
def test_every_slot_is_block_times_size_plus_offset(block_size, tables, data):
    n = data.draw(st.integers(1, 12))
    req_idx = data.draw(st.lists(st.integers(0, len(tables) - 1), min_size=n, max_size=n))
    positions = data.draw(st.lists(st.integers(0, 4 * block_size - 1), min_size=n, max_size=n))
    want = [tables[r][p // block_size] * block_size + p % block_size for r, p in zip(req_idx, positions)]
    assert slots(block_size, tables, req_idx, positions) == want


def test_the_engine_writes_each_token_where_its_table_says():
    # Through a real step: the slots the runner sent equal the KV manager's tables read by hand.
    llm = LLM(stage=2, block_size=4, max_num_seqs=2)
    engine = llm.engine
    engine.add_request("a", "ROMEO: good", SamplingParams(max_tokens=3, ignore_eos=True))
    engine.add_request("b", "JULIET:", SamplingParams(max_tokens=3, ignore_eos=True))
    runner, sent = engine.runner, []
    prepare = runner._prepare

    def recording(so):  # what the runner built, with the KV manager's tables at that moment
        tables = {r.request_id: list(engine.kv_manager.get_block_ids(r)) for r in so.scheduled}
        starts = {r.request_id: r.num_computed_tokens for r in so.scheduled}
        sent.append((dict(so.num_scheduled_tokens), tables, starts, prepare(so)[2].slot_mapping.tolist()))
        return prepare(so)

    runner._prepare = recording
    for _ in range(3):  # the prefills, then two decodes
        engine.step()
    assert len(sent) == 3
    for num_new, tables, starts, got in sent:
        want = []
        for rid, n in num_new.items():
            want += [tables[rid][p // 4] * 4 + p % 4 for p in range(starts[rid], starts[rid] + n)]
        assert got == want
