"""A plausible wrong body for every task of stages 1-5, as a monkeypatch (for test_scenarios.py): popping from the
tail, freeing head first, an int32 slot mapping, a leader that computes its whole prompt, a victim rule that picks
the oldest ... Each must change what some of its task's cases observe."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from pagedlab.attention import paged as attention
from pagedlab.kv import block_pool, contiguous, cow, hashing, paged, prefix, swap
from pagedlab.sched import beam, continuous, policies, queue, sharing, static
from pagedlab.worker import runner


def popleft_tail(self):
    block = self.tail.prev_free_block
    if block is self.head:
        raise ValueError("No free blocks available")
    self.remove(block)
    return block


def free_no_check(self, blocks):
    for b in blocks:
        b.ref_cnt -= 1
        if b.ref_cnt == 0:
            self.free_block_queue.append(b)


def free_head_first(self, request):
    self.pool.free(self.req_to_blocks.pop(request.request_id, []))


def highest_region(self, request, n):
    if request.request_id in self.region_of:
        return []
    if not self.free_regions:
        return None
    region = max(self.free_regions)
    self.free_regions.remove(region)
    self.region_of[request.request_id] = region
    return list(range(region * self.region_size, (region + 1) * self.region_size))


def fork_no_refs(self, parent, child):
    self.req_to_blocks[child.request_id] = list(self.req_to_blocks.get(parent.request_id, []))


def leader_takes_all(self, request):
    return len(request.all_token_ids)


def no_salt(request, block_size, none_hash, algo="sha256"):
    for i in range(len(request.block_hashes), len(request.all_token_ids) // block_size):
        parent = request.block_hashes[i - 1] if i else none_hash
        chunk = request.all_token_ids[i * block_size : (i + 1) * block_size]
        request.block_hashes.append(hashing.hash_block_tokens(parent, chunk, (), algo))


def insert_overwrites(self, block, block_hash):
    block.block_hash = block_hash
    self.cached_block_hash_to_block[block_hash] = block
    return True


def allocate_keeps_hashes(self, n):
    return block_pool.BlockPool.allocate(self, n)


def swap_in_keeps_cpu(self, request):
    cpu = list(self.swap_pool.held[request.request_id])
    blocks = self.pool.allocate(len(cpu))
    self.req_to_blocks[request.request_id] = blocks
    return [(c, b.block_id) for c, b in zip(cpu, blocks)]


def victim_alone(self):  # preempts the victim, not its whole group
    return [self.policy.victim(self.running)]


def oldest(running):
    return running[0]


def own_logprob(self, top, max_model_len):
    for b in self.live:
        b.output_logprobs[:] = [0.0] * len(b.output_logprobs)  # ranking by the last logprob alone
    return original_step(self, top, max_model_len)


original_step = beam.BeamGroup.step


def int32_slots(self, table, req_idx, positions):
    return original_slots(self, table, req_idx, positions).astype(np.int32)


original_slots = runner.ModelRunner.slot_mapping


def off_by_one(self, meta, rows, positions):
    bs = meta.block_size
    return meta.block_table[rows, positions // bs].long() * bs + (positions + 1) % bs


def admit_after_preempting(self):
    out = self._begin_step()
    self._budget, self._preempted_now = self.config.max_num_batched_tokens, False
    self._schedule_running(out)
    self._schedule_waiting(out)
    return self._end_step(out)


def no_seat_limit(self, out):
    saved = self.config
    self.config = replace(saved, max_num_seqs=10**6)
    try:
        original_admit(self, out)
    finally:
        self.config = saved


original_admit = static.StaticScheduler._admit_batch


def no_last_token(self, request):
    if not self.enable_caching:
        return []
    hashing.update_block_hashes(request, self.block_size, self.none_hash, self.hash_algo)
    hits = []
    for h in request.block_hashes[: request.num_tokens // self.block_size]:
        block = self.pool.index.get(h)
        if block is None:
            break
        hits.append(block)
    return hits


def everywhere(m, original, replacement):
    """A module-level function replaced wherever a module imported it by name (the sandbox splices it in its
    own module, so every importer sees the student's)."""
    for module in list(sys.modules.values()):
        for name, value in list(vars(module).items()) if module and module.__name__.startswith("pagedlab") else []:
            if value is original:
                m.setattr(module, name, replacement)


FCFS = policies.POLICIES["fcfs"]
MUTANTS = [
    ("free-queue", lambda m: m.setattr(block_pool.FreeKVCacheBlockQueue, "popleft", popleft_tail)),
    ("pool-allocate-free", lambda m: m.setattr(block_pool.BlockPool, "free", free_no_check)),
    ("allocate-slots", lambda m: m.setattr(paged.PagedKVCacheManager, "free", free_head_first)),
    ("slot-mapping", lambda m: m.setattr(runner.ModelRunner, "slot_mapping", int32_slots)),
    ("paged-gather", lambda m: m.setattr(attention.PagedAttention, "context_slots", off_by_one)),
    ("contiguous-reservation",
     lambda m: m.setattr(contiguous.ContiguousKVCacheManager, "allocate_slots", highest_region)),
    ("static-schedule", lambda m: m.setattr(static.StaticScheduler, "_admit_batch", no_seat_limit)),
    ("fork-cow", lambda m: m.setattr(cow.CowKVCacheManager, "fork", fork_no_refs)),
    ("n-sharing", lambda m: m.setattr(sharing.PromptSharing, "target_tokens", leader_takes_all)),
    ("beam-step", lambda m: m.setattr(beam.BeamGroup, "step", own_logprob)),
    ("block-hashing", lambda m: everywhere(m, hashing.update_block_hashes, no_salt)),
    ("prefix-index", lambda m: m.setattr(hashing.HashChainIndex, "insert", insert_overwrites)),
    ("caching-pool", lambda m: m.setattr(prefix.CachingBlockPool, "allocate", allocate_keeps_hashes)),
    ("lookup", lambda m: m.setattr(prefix.PrefixCachingKVCacheManager, "get_computed_blocks", no_last_token)),
    ("swap", lambda m: m.setattr(swap.SwappingKVCacheManager, "swap_in", swap_in_keeps_cpu)),
    ("schedule", lambda m: m.setattr(continuous.ContinuousScheduler, "schedule", admit_after_preempting)),
    ("preempt", lambda m: m.setattr(continuous.ContinuousScheduler, "_victim_group", victim_alone)),
    ("victim", lambda m: [everywhere(m, queue.newest, oldest),
                          m.setitem(policies.POLICIES, "fcfs", replace(FCFS, victim=oldest))]),
]  # fmt: skip
