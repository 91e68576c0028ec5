"""Stage 1: the runner's staged block tables, one numpy row per live request.

Builds on: nothing.
Read with: chapters/02-paged-blocks.md.

The KV manager owns the true block tables; the runner keeps this copy, written
only where a scheduler output says a table changed, so a step's [B, MB] table
is one gather of the scheduled rows instead of B Python lists converted anew.

    table [rows, MB]      row_of {"A": 0, "B": 1}      free_rows [3, 2]
      row 0: [4, 7, 0, 0]    A holds blocks 4, 7
      row 1: [2, 0, 0, 0]    B holds block 2
      rows 2, 3: free (old contents left in place: a row is never cleared)

vLLM: vllm/v1/worker/block_table.py (BlockTable; a pinned CPU buffer copied to the GPU).
"""

from __future__ import annotations

import numpy as np


class BlockTableBuffer:
    """Persistent CPU block tables, one row per live request (vLLM's BlockTable, simplified)."""

    def __init__(self, rows: int, max_blocks: int):
        self.table = np.zeros((rows, max_blocks), dtype=np.int32)  # [rows, MB]
        self.row_of: dict[str, int] = {}  # request_id -> row
        self.free_rows = list(range(rows - 1, -1, -1))

    def write(self, req_id: str, start: int, block_ids: list[int]) -> None:
        if req_id not in self.row_of:
            if not self.free_rows:
                self._grow()
            self.row_of[req_id] = self.free_rows.pop()
        self.table[self.row_of[req_id], start : start + len(block_ids)] = block_ids

    def remove(self, req_id: str) -> None:
        row = self.row_of.pop(req_id, None)
        if row is not None:
            self.free_rows.append(row)

    def gather(self, req_ids: list[str]) -> np.ndarray:
        return self.table[[self.row_of[r] for r in req_ids]]  # [B, MB]

    def _grow(self) -> None:
        old = len(self.table)
        self.table = np.concatenate([self.table, np.zeros_like(self.table)])
        self.free_rows.extend(range(2 * old - 1, old - 1, -1))
