"""Stage 1: the runner's block tables, one numpy row per live request, kept from the scheduler's outputs alone.

Builds on: sched/output.py (what changed in each table this step).
Read with: chapters/02-paged-blocks.md.

The KV manager owns the true block tables; the runner keeps this copy, so a
step's [B, MB] table is one gather of the scheduled rows instead of B Python
lists converted anew. It is written only from what the scheduler sends:

    table [rows, MB]      row_of {"A": 0, "B": 1}     num_blocks [2, 1, 0, 0]    free_rows [3, 2]
      row 0: [4, 7, 0, 0]    A holds blocks 4, 7       set_table: a table admission, swap-in or a fork made
      row 1: [2, 0, 0, 0]    B holds block 2            append: the blocks allocate_slots added (a new row if none)
      rows 2, 3: free (old contents left in place)      replace: a copy-on-write's private block

vLLM: vllm/v1/worker/block_table.py (BlockTable; a pinned CPU buffer copied to the GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pagedlab.errors import InvariantError

if TYPE_CHECKING:
    from pagedlab.sched.output import SchedulerOutput


class BlockTableBuffer:
    """Persistent CPU block tables, one row per live request (vLLM's BlockTable, simplified).
    Invariant: row r holds num_blocks[r] valid entries; a row is never cleared, only overwritten."""

    def __init__(self, rows: int, max_blocks: int):
        self.table = np.zeros((rows, max_blocks), dtype=np.int32)  # [rows, MB]
        self.num_blocks = np.zeros(rows, dtype=np.int64)  # [rows] valid entries of each row
        self.row_of: dict[str, int] = {}  # request_id -> row
        self.free_rows = list(range(rows - 1, -1, -1))

    def apply(self, so: SchedulerOutput) -> None:
        """One step's changes, in the order that keeps every row true (sched/output.py): rows that ended or
        were preempted go first (their ids may come back in this very output), then whole tables, then the
        blocks appended, then copy-on-write replacements."""
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            self.remove(req_id)
        for req_id, block_ids in so.new_block_tables.items():
            self.set_table(req_id, block_ids)
        for req_id, block_ids in so.new_block_ids.items():
            self.append(req_id, block_ids)
        for copy in so.block_copies:
            self.replace(copy.request_id, copy.index, copy.dst)

    def set_table(self, req_id: str, block_ids: list[int]) -> None:
        """A request's whole table, as admission, a swap-in or a fork made it."""
        row = self._row(req_id)
        self.table[row, : len(block_ids)] = block_ids
        self.num_blocks[row] = len(block_ids)

    def append(self, req_id: str, block_ids: list[int]) -> None:
        row = self._row(req_id)  # a request the runner does not know yet starts with an empty table
        start = self.num_blocks[row]
        self.table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def replace(self, req_id: str, index: int, block_id: int) -> None:
        self.table[self.row_of[req_id], index] = block_id

    def remove(self, req_id: str) -> None:
        row = self.row_of.pop(req_id, None)
        if row is not None:
            self.free_rows.append(row)

    def get(self, req_id: str) -> list[int]:
        """The request's table as the runner holds it (empty for a request it does not know)."""
        row = self.row_of.get(req_id)
        return [] if row is None else self.table[row, : self.num_blocks[row]].tolist()

    def check_matches(self, tables: dict[str, list[int]], null_block_id: int | None) -> None:
        """debug_checks: the runner's rows are exactly the given requests' true tables (the KV manager's).
        An entry the KV manager has set to the null block (a sliding window dropped it) is never read, so
        the runner may keep the old id there, as vLLM's runner does."""
        stale = self.row_of.keys() - tables.keys()
        if stale:
            raise InvariantError(f"the runner keeps rows for requests that are not running: {sorted(stale)}")
        for req_id, true_table in tables.items():
            held = self.get(req_id)
            same = len(held) == len(true_table) and all(h == t or t == null_block_id for h, t in zip(held, true_table))
            if not same:
                raise InvariantError(f"{req_id}: the runner's block table {held} is not the KV manager's {true_table}")

    def gather(self, req_ids: list[str]) -> np.ndarray:
        return self.table[[self.row_of[r] for r in req_ids]]  # [B, MB]

    def _row(self, req_id: str) -> int:
        """The request's row; a request new to the buffer gets a free one, with no valid entry yet."""
        row = self.row_of.get(req_id)
        if row is None:
            if not self.free_rows:
                self._grow()
            row = self.row_of[req_id] = self.free_rows.pop()
            self.num_blocks[row] = 0
        return row

    def _grow(self) -> None:
        old = len(self.table)
        self.table = np.concatenate([self.table, np.zeros_like(self.table)])
        self.num_blocks = np.concatenate([self.num_blocks, np.zeros_like(self.num_blocks)])
        self.free_rows.extend(range(2 * old - 1, old - 1, -1))


class MultiGroupBlockTable:
    """A hybrid model's tables: one BlockTableBuffer per KV cache group (vLLM's MultiGroupBlockTable). Block ids
    arrive as one list per group (kv/hybrid.py); a copy-on-write names its group."""

    def __init__(self, num_groups: int, rows: int, max_blocks: int):
        self.groups = [BlockTableBuffer(rows, max_blocks) for _ in range(num_groups)]

    def apply(self, so: SchedulerOutput) -> None:
        """As BlockTableBuffer.apply, each group's lists to its own buffer."""
        for req_id in so.finished_req_ids | so.preempted_req_ids:
            for table in self.groups:
                table.remove(req_id)
        for req_id, per_group in so.new_block_tables.items():
            for table, block_ids in zip(self.groups, per_group, strict=True):
                table.set_table(req_id, block_ids)
        for req_id, per_group in so.new_block_ids.items():
            for table, block_ids in zip(self.groups, per_group, strict=True):
                table.append(req_id, block_ids)
        for copy in so.block_copies:
            self.groups[copy.group].replace(copy.request_id, copy.index, copy.dst)

    def get(self, req_id: str) -> tuple[list[int], ...]:
        return tuple(table.get(req_id) for table in self.groups)

    def gather(self, req_ids: list[str]) -> list[np.ndarray]:
        """Each group's [B, MB] table of the scheduled rows."""
        return [table.gather(req_ids) for table in self.groups]

    def check_matches(self, tables: dict[str, tuple[list[int], ...]], null_block_id: int | None) -> None:
        for g, table in enumerate(self.groups):
            table.check_matches({rid: per_group[g] for rid, per_group in tables.items()}, null_block_id)
