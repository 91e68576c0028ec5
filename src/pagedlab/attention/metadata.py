"""Stage 1: the per-step attention metadata the runner builds for a cached backend.

Builds on: nothing.
Read with: chapters/01-contiguous-static.md.

Shapes: B requests in the step, T new tokens in all, MB = max blocks per request.

    request:          A (decode)   B (prefill of 3)
    query_start_loc:  [0, 1, 4]                  new tokens of request b are q[qsl[b] : qsl[b+1]]
    seq_lens:         [9, 3]                     context after this step (cached + new)
    slot_mapping:     [s_A8, s_B0, s_B1, s_B2]   where each new token's K/V is written
    block_table:      [[...A's blocks...], [...B's blocks...]]   int32 [B, MB]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class TiledDecodePlan:
    """The torch reference's gather for this step's decodes: N decodes, their contexts cut into NT tiles
    of block_size positions (attention/tiled.py, `plan_decode`)."""

    tokens: torch.Tensor  # [N] index of each decode's query token among the step's T tokens
    owner: torch.Tensor  # [NT] which decode (0 .. N - 1) each tile belongs to
    kv_rows: torch.Tensor  # [NT*KVH*bs] rows of the cache viewed as [slots*KVH, D], in (tile, KV head, position) order
    bias: torch.Tensor  # [NT*KVH, 1, bs] 0 for a context position, -inf past the decode's seq_len


@dataclass(slots=True)
class AttentionMetadata:
    """Everything a cached attention backend needs for one step; built once per step by the runner."""

    query_start_loc: torch.Tensor  # [B + 1] int64, on device
    query_start_loc_cpu: list[int]  # the same, for Python-side loops over prefills
    seq_lens: torch.Tensor  # [B] int64, context length of each request after this step
    seq_lens_cpu: list[int]  # the same, on the CPU
    slot_mapping: torch.Tensor  # [T] int64, cache slot of each new token
    block_table: torch.Tensor  # [B, MB] int32, logical -> physical blocks
    max_seq_len: int  # max(seq_lens)
    block_size: int  # tokens per block
    decode_rows: torch.Tensor  # [N_d] requests with exactly one new token (decodes)
    decode_rows_cpu: list[int]  # the same, on the CPU
    prefill_rows: torch.Tensor  # [N_p] requests with more than one new token (prefill chunks)
    prefill_rows_cpu: list[int]  # the same, on the CPU
    max_query_len: int  # the longest prefill chunk this step
    decode_plan: TiledDecodePlan | None = None  # the tiled backend's gather, made by its prepare() once per step
    decode_plans: dict = field(default_factory=dict)  # the same per sliding window (None: full) when layers differ

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)


def metadata_for(
    query_start_loc: list[int],
    seq_lens: list[int],
    block_table: torch.Tensor,
    block_size: int,
    slot_mapping: torch.Tensor | None = None,
) -> AttentionMetadata:
    """One step's metadata from its plain facts, as the runner builds it from a SchedulerOutput: for the torch
    reference, a bench's case or a test. A request with one new token is a decode; more, a prefill chunk."""
    dev = block_table.device
    num_new = [end - start for start, end in zip(query_start_loc, query_start_loc[1:])]
    decodes = [b for b, n in enumerate(num_new) if n == 1]
    prefills = [b for b, n in enumerate(num_new) if n > 1]
    rows = lambda ids: torch.tensor(ids, dtype=torch.int64, device=dev)  # noqa: E731
    return AttentionMetadata(
        query_start_loc=rows(query_start_loc),
        query_start_loc_cpu=list(query_start_loc),
        seq_lens=rows(seq_lens),
        seq_lens_cpu=list(seq_lens),
        slot_mapping=rows([]) if slot_mapping is None else slot_mapping,
        block_table=block_table,
        max_seq_len=max(seq_lens),
        block_size=block_size,
        decode_rows=rows(decodes),
        decode_rows_cpu=decodes,
        prefill_rows=rows(prefills),
        prefill_rows_cpu=prefills,
        max_query_len=max(num_new),
    )
