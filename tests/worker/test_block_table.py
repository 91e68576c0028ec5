"""The runner's block tables, kept from the scheduler's messages alone (whole tables, appends, copy-on-write)."""

import pytest

from pagedlab.worker.block_table import BlockTableBuffer

pytestmark = pytest.mark.stage2


def rows(buf: BlockTableBuffer, *req_ids: str) -> list[list[int]]:
    """Each request's valid entries."""
    return [buf.table[buf.row_of[r], : buf.num_blocks[buf.row_of[r]]].tolist() for r in req_ids]


def test_whole_tables_appends_and_a_replacement():
    buf = BlockTableBuffer(rows=2, max_blocks=4)
    buf.append("A", [4, 7])  # a request the buffer does not know starts empty
    buf.set_table("B", [0, 1])  # a table a fork (or prefix-cache hits) made
    buf.append("B", [9])
    buf.replace("B", 1, 3)  # copy-on-write: entry 1 is now a private copy
    assert rows(buf, "A", "B") == [[4, 7], [0, 3, 9]]
    assert buf.gather(["B", "A"])[:, :2].tolist() == [[0, 3], [4, 7]]


def test_a_reused_row_starts_empty_and_the_buffer_grows():
    buf = BlockTableBuffer(rows=1, max_blocks=4)
    buf.append("A", [1, 2, 3])
    buf.remove("A")
    buf.append("C", [5])  # C gets A's old row: A's entries are stale, not C's
    assert rows(buf, "C") == [[5]]
    buf.append("D", [6])  # no free row left: the buffer doubles
    assert rows(buf, "C", "D") == [[5], [6]] and len(buf.table) == 2


def test_apply_drops_ended_and_preempted_rows_before_installing_tables():
    from pagedlab.kv.cow import BlockCopy
    from pagedlab.sched.output import SchedulerOutput

    buf = BlockTableBuffer(rows=2, max_blocks=4)
    buf.set_table("old", [3, 4])
    buf.set_table("P", [5])
    # "old" ended last step and its id came back at once; P was preempted; F is a fork; A a copy-on-write
    so = SchedulerOutput(finished_req_ids={"old"}, preempted_req_ids={"P"}, new_block_tables={"old": [1], "F": [1]})
    so.new_block_ids["F"] = [6]
    so.block_copies.append(BlockCopy("F", 0, 1, 2))
    buf.apply(so)
    assert rows(buf, "old", "F") == [[1], [2, 6]] and "P" not in buf.row_of
    assert buf.get("P") == []


def test_check_matches_names_the_stale_row_and_the_wrong_table():
    from pagedlab.errors import InvariantError

    buf = BlockTableBuffer(rows=2, max_blocks=4)
    buf.set_table("A", [4, 7])
    buf.check_matches({"A": [4, 7]}, null_block_id=None)
    buf.check_matches({"A": [0, 7]}, null_block_id=0)  # a window dropped entry 0: its old id is never read
    with pytest.raises(InvariantError, match=r"A: the runner's block table \[4, 7\] is not the KV manager's"):
        buf.check_matches({"A": [4, 7, 9]}, null_block_id=None)  # the runner missed an append
    with pytest.raises(InvariantError, match=r"rows for requests that are not running: \['A'\]"):
        buf.check_matches({}, null_block_id=None)  # a preempted (freed) table left in place
    with pytest.raises(InvariantError, match="is not the KV manager's"):
        buf.check_matches({"A": [4, 7], "B": [1]}, null_block_id=None)  # a table never sent
