"""Stage 1: the model runner: build one step's tensors, run the model, sample.

Builds on: model/llama.py, attention/metadata.py, worker/block_table.py, worker/sampling.py, sched/output.py.
Read with: chapters/01-contiguous-static.md.

Everything per step is built with vectorized numpy over the batch, never
token by token in Python. Block tables live in one staged CPU buffer
(worker/block_table.py), kept from what the scheduler sends (a new request's
whole table, the blocks a running one gained, a copy-on-write's replacement),
and each step's [B, MB] table is one fancy-indexing gather of the scheduled
rows, moved to the device at once.

Shapes: B scheduled requests, T new tokens, MB max blocks per request, V vocab.
"""

from __future__ import annotations

import time
from dataclasses import replace
from itertools import chain

import numpy as np
import torch

from pagedlab.attention.metadata import AttentionMetadata
from pagedlab.config import EngineConfig
from pagedlab.kv.block_pool import cdiv
from pagedlab.kv.cache_groups import KVCacheGroup, kv_cache_groups
from pagedlab.model.llama import CausalLM
from pagedlab.sched.output import ModelRunnerOutput, SchedulerOutput
from pagedlab.worker.block_table import BlockTableBuffer, MultiGroupBlockTable
from pagedlab.worker.sampling import sample, top_logprobs


class PerGroupAttention:
    """A hybrid model's attention: every layer reads and writes through its own KV cache group's block table and
    slot mapping (vLLM's runner builds the metadata per group and gives each layer its group's). The metadata is a
    list, one per group; the backend itself is unchanged. Its KV cache keeps a tensor per layer, every block id
    having room in every layer (vLLM instead shares one tensor among the i-th layers of all groups, so that a
    block is group_size layers' pages: chapter 2's ledger)."""

    def __init__(self, backend, groups: list[KVCacheGroup]):
        self.backend, self.name, self.kv_cache = backend, backend.name, backend.kv_cache
        self.group_of = {layer: g for g, group in enumerate(groups) for layer in group.layers}

    def prepare(self, metas: list[AttentionMetadata]) -> None:
        for meta in metas:
            self.backend.prepare(meta)

    def forward(self, layer_idx: int, q, k, v, metas: list[AttentionMetadata]) -> torch.Tensor:
        return self.backend.forward(layer_idx, q, k, v, metas[self.group_of[layer_idx]])


class ModelRunner:
    """Turns a SchedulerOutput into sampled tokens. Owns the model, the attention backend and the KV cache."""

    def __init__(self, config: EngineConfig, model: CausalLM, attention):
        self.config = config
        self.model = model
        self.attention = attention
        self.device = torch.device(config.device)
        # a row per running request, as wide as the longest request's table; a hybrid model: a table per KV cache group
        rows, width = config.max_num_seqs, cdiv(config.max_model_len, config.block_size)
        if config.hybrid:
            groups = kv_cache_groups(config.layer_windows)
            self.block_tables = MultiGroupBlockTable(len(groups), rows, width)
            self.attention = PerGroupAttention(attention, groups)
        else:
            self.block_tables = BlockTableBuffer(rows, width)
        self.generator = torch.Generator().manual_seed(config.seed)  # for requests without a seed
        self.forward_seconds = 0.0  # time inside the model (for the overhead measurement)
        kv = attention.kv_cache
        swap_shape = (kv.shape[0], 2, config.num_swap_blocks, *kv.shape[3:])
        self.swap_cache = torch.zeros(swap_shape, dtype=kv.dtype, device="cpu")  # the CPU swap pool's K/V

    @torch.inference_mode()
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_block_tables(so)
        if not so.scheduled:
            return ModelRunnerOutput()
        input_ids, positions, meta, sample_idx, sampling = self._prepare(so)
        start = time.perf_counter()
        self.attention.prepare(meta)  # once per step: what every layer would otherwise repeat
        hidden = self.model(input_ids, positions, self.attention, meta)  # [T, E]
        logits = self.model.compute_logits(hidden[sample_idx])  # [N, V]
        out = self._sample(logits, sampling)
        self.forward_seconds += time.perf_counter() - start
        return out

    def _update_block_tables(self, so: SchedulerOutput) -> None:
        """Keep the runner's tables from what the scheduler sent (sched/output.py), then move K/V data."""
        self.block_tables.apply(so)
        if so.swap_out:
            self.swap_blocks(so.swap_out, to_cpu=True)
        if so.block_copies:
            self.copy_blocks(so.block_copies)
        if so.swap_in:
            self.swap_blocks(so.swap_in, to_cpu=False)

    def swap_blocks(self, pairs: list[tuple[int, int]], to_cpu: bool) -> None:
        """Swap out (GPU block, CPU block) pairs, or swap in (CPU block, GPU block) pairs, every layer at once."""
        kv, cpu = self.attention.kv_cache, self.swap_cache  # [layers, 2, blocks, block_size, KVH, D] each
        src = torch.tensor([s for s, _ in pairs])
        dst = torch.tensor([d for _, d in pairs])
        if to_cpu:
            cpu[:, :, dst] = kv[:, :, src.to(kv.device)].to("cpu")
        else:
            kv[:, :, dst.to(kv.device)] = cpu[:, :, src].to(kv.device)

    def copy_blocks(self, copies) -> None:
        """Copy-on-write: each copy's dst block takes its src's K and V, in every layer, in one indexing op."""
        kv = self.attention.kv_cache  # [layers, 2, num_kv_blocks, block_size, KVH, D]
        src = torch.tensor([c.src for c in copies], device=kv.device)
        dst = torch.tensor([c.dst for c in copies], device=kv.device)
        kv[:, :, dst] = kv[:, :, src]

    def _prepare(self, so: SchedulerOutput):
        """input_ids, positions [T]; attention metadata; rows to sample from; the requests that sample."""
        num_new = np.array([so.num_scheduled_tokens[r.request_id] for r in so.scheduled])  # [B]
        num_computed = np.array([r.num_computed_tokens for r in so.scheduled])  # [B]
        qsl = np.concatenate([[0], np.cumsum(num_new)])  # [B + 1]
        req_idx = np.repeat(np.arange(len(num_new)), num_new)  # [T] which request each token belongs to
        positions = np.arange(qsl[-1]) - qsl[req_idx] + num_computed[req_idx]  # [T]
        seq_lens = num_computed + num_new  # [B]
        num_blocks = -(-int(seq_lens.max()) // self.config.block_size)  # columns this step needs
        tables = self.block_tables.gather([r.request_id for r in so.scheduled])  # [B, MB] (a list: one per group)
        if isinstance(tables, list):  # a hybrid model: each group's table and slots (PerGroupAttention picks)
            block_table = [t[:, :num_blocks] for t in tables]  # [B, nb] each
            slot_mapping = [self.slot_mapping(t, req_idx, positions) for t in block_table]  # [T] each
        else:
            block_table = tables[:, :num_blocks]  # [B, nb]
            slot_mapping = self.slot_mapping(block_table, req_idx, positions)  # [T]
        ids = list(
            chain.from_iterable(r.all_token_ids[c : c + n] for r, c, n in zip(so.scheduled, num_computed, num_new))
        )
        # A request samples once all its known tokens are fed (always, at stages 1-4).
        samples = seq_lens == np.array([r.num_tokens for r in so.scheduled])
        decode, prefill = np.flatnonzero(num_new == 1), np.flatnonzero(num_new > 1)  # attention splits on this
        dev = self.device
        meta = AttentionMetadata(
            query_start_loc=torch.from_numpy(qsl).to(dev),
            query_start_loc_cpu=qsl.tolist(),
            seq_lens=torch.from_numpy(seq_lens).to(dev),
            seq_lens_cpu=seq_lens.tolist(),
            slot_mapping=None,  # set below (per group for a hybrid model)
            block_table=None,
            max_seq_len=int(seq_lens.max()),
            block_size=self.config.block_size,
            decode_rows=torch.from_numpy(decode).to(dev),
            decode_rows_cpu=decode.tolist(),
            prefill_rows=torch.from_numpy(prefill).to(dev),
            prefill_rows_cpu=prefill.tolist(),
            max_query_len=int(num_new.max()),
        )
        if isinstance(block_table, list):
            meta = [
                replace(meta, slot_mapping=torch.from_numpy(slots).to(dev), block_table=torch.from_numpy(t).to(dev))
                for t, slots in zip(block_table, slot_mapping)
            ]
        else:
            meta.slot_mapping = torch.from_numpy(slot_mapping).to(dev)
            meta.block_table = torch.from_numpy(block_table).to(dev)
        sample_idx = torch.from_numpy(qsl[1:][samples] - 1).to(dev)  # last new token of each sampler
        sampling = [r for r, s in zip(so.scheduled, samples) if s]
        return torch.tensor(ids, device=dev), torch.from_numpy(positions).to(dev), meta, sample_idx, sampling

    # BEGIN SOLUTION
    # TASK slot-mapping (20 pts, stage 2): the cache slot of every new token, through its request's block table.
    def slot_mapping(self, block_table: np.ndarray, req_idx: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """slot = block_table[pos // block_size] * block_size + pos % block_size, for every new token.

        block_table [B, nb] int32; req_idx [T]: the row of each token's request; positions [T]. Returns a numpy
        array [T] of dtype int64."""
        bs = self.config.block_size
        return block_table[req_idx, positions // bs].astype(np.int64) * bs + positions % bs

    # END SOLUTION

    def _sample(self, logits: torch.Tensor, requests) -> ModelRunnerOutput:
        if not requests:  # e.g. a prefill chunk that does not reach the end of its prompt
            return ModelRunnerOutput()
        params = [r.sampling_params for r in requests]
        tokens = sample(
            logits, params, [r.seed for r in requests], [r.num_output_tokens for r in requests], self.generator
        )
        logprobs = torch.log_softmax(logits, dim=-1)  # [N, V] raw, as vLLM reports them
        chosen = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
        tokens = tokens.tolist()
        top = top_logprobs(logprobs, [p.logprobs for p in params], tokens, chosen)
        return ModelRunnerOutput([r.request_id for r in requests], tokens, chosen, top)
