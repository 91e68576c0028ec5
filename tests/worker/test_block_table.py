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
