"""Stage 1: engine counters (`llm.engine.stats`) and the optional per-step trace that plots consume.

Builds on: request.py.
Read with: chapters/01-contiguous-static.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedlab.request import RequestStatus


@dataclass
class EngineStats:
    """Counters since the engine started (the names of chapters/97-architecture.md, The public API)."""

    num_steps: int = 0  # engine steps that ran a batch
    num_generated_tokens: int = 0  # output tokens sampled
    num_preemptions: int = 0  # requests preempted (stage 5)
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (stage 4)
    prefix_cache_hits: int = 0  # of those, tokens found cached
    peak_kv_blocks_used: int = 0  # most KV blocks held at once
    kv_usage: float = 0.0  # share of the pool held after the last step
    step_seconds: float = 0.0  # wall time inside step()
    forward_seconds: float = 0.0  # of which inside the model's forward and sampling

    def record_step(self, num_sampled: int, kv_manager, scheduler) -> None:
        """Fold one step in: tokens are summed; the KV and scheduler counters are read as they stand."""
        self.num_generated_tokens += num_sampled
        self.peak_kv_blocks_used = max(self.peak_kv_blocks_used, kv_manager.num_used_blocks)
        self.prefix_cache_queries = kv_manager.prefix_cache_queries
        self.prefix_cache_hits = kv_manager.prefix_cache_hits
        self.num_preemptions = scheduler.num_preemptions
        self.kv_usage = kv_manager.usage

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def overhead_share(self) -> float:
        """Share of step time spent outside the model (scheduling, bookkeeping, tensor building)."""
        return 1 - self.forward_seconds / self.step_seconds if self.step_seconds else 0.0


@dataclass
class StepTrace:
    """One step as it ran: taken after scheduling and the forward pass, before update frees anything.

    Enough to say what changed in the step (engine/events.py): who was admitted, preempted or finished,
    which blocks were allocated, freed, copied or swapped, and how many tokens the prefix cache served.
    """

    step: int  # 1-based step number
    time: float  # seconds since the engine started
    scheduled: dict[str, int]  # request_id -> tokens fed this step
    waiting: list[str]  # request ids still waiting after scheduling, in queue order
    running: list[str]  # request ids holding KV during the step (scheduled or not)
    kv_held: dict[str, int] = field(default_factory=dict)  # request_id -> KV slots held
    kv_used: dict[str, int] = field(default_factory=dict)  # request_id -> slots holding K/V after this step
    block_tables: dict[str, list[int]] = field(default_factory=dict)  # request_id -> its physical blocks (a hybrid
    #   model's: every group's table, one after the other)
    group_tables: dict[str, tuple[list[int], ...]] = field(default_factory=dict)  # a hybrid model's (kv/hybrid.py):
    #   request_id -> its table in each KV cache group; {} for a model with one group
    num_used_blocks: int = 0  # blocks held in the pool during the step
    finished: list[str] = field(default_factory=list)  # requests that ended in this step's update
    prefills: list[str] = field(default_factory=list)  # scheduled requests fed a prefill chunk (prompt or recompute)
    preempted: list[str] = field(default_factory=list)  # preempted while this step was scheduled (stage 5)
    swapped: list[str] = field(default_factory=list)  # waiting requests whose K/V is in the CPU pool (stage 5)
    were_preempted: list[str] = field(default_factory=list)  # waiting requests preempted at some step (stage 5)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (GPU block, CPU block) copied out
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (CPU block, GPU block) copied back
    copies: list[tuple[str, int, int]] = field(default_factory=list)  # (request_id, src, dst): copy-on-write
    finish_reasons: dict[str, str] = field(default_factory=dict)  # request_id -> "stop" | "length" | "abort"
    groups: dict[str, str] = field(default_factory=dict)  # running child (n > 1, beams) -> its user request id
    num_prompt_tokens: dict[str, int] = field(default_factory=dict)  # running request_id -> its prompt length
    num_cached_tokens: dict[str, int] = field(default_factory=dict)  # scheduled request_id -> prompt tokens the
    #   prefix cache served it at its first admission (stage 4+; vLLM's num_cached_tokens)
    # The block pool as it stood (stage 2+; None at stage 1, which has regions and no pool):
    free_queue: list[int] | None = None  # free block ids, head (allocated next) to tail
    ref_cnts: list[int] = field(default_factory=list)  # block_id -> ref_cnt
    block_hashes: list = field(default_factory=list)  # block_id -> its cached block_hash, or None (stage 4+)

    @classmethod
    def capture(cls, step: int, now: float, scheduler_output, scheduler, kv_manager) -> StepTrace:
        """The step as it ran: after scheduling and the forward pass, before update frees anything."""
        so, running = scheduler_output, scheduler.running
        scheduled = dict(so.num_scheduled_tokens)
        is_swapped = getattr(kv_manager, "is_swapped", None)
        return cls(
            step=step,
            time=now,
            scheduled=scheduled,
            waiting=[r.request_id for r in scheduler.waiting],
            running=[r.request_id for r in running],
            kv_held={r.request_id: kv_manager.slots_held(r) for r in running},
            kv_used={r.request_id: r.num_computed_tokens + scheduled.get(r.request_id, 0) for r in running},
            **_tables({r.request_id: kv_manager.get_block_ids(r) for r in running}),
            num_used_blocks=kv_manager.num_used_blocks,
            # more than the last token still to feed: a prefill chunk (a decode feeds exactly the last one)
            prefills=[r.request_id for r in so.scheduled if r.num_computed_tokens < len(r.all_token_ids) - 1],
            preempted=sorted(so.preempted_req_ids),
            swapped=[r.request_id for r in scheduler.waiting if is_swapped(r)] if is_swapped else [],
            were_preempted=[r.request_id for r in scheduler.waiting if r.status == RequestStatus.PREEMPTED],
            swap_out=list(so.swap_out),
            swap_in=list(so.swap_in),
            copies=[(c.request_id, c.src, c.dst) for c in so.block_copies],
            groups={r.request_id: r.group_id for r in running if r.group_id != r.request_id},
            num_prompt_tokens={r.request_id: r.num_prompt_tokens for r in running},
            num_cached_tokens={r.request_id: n for r in so.scheduled if (n := r.num_cached_tokens) is not None},
            **pool_state(getattr(kv_manager, "pool", None)),
        )


def pool_state(pool) -> dict:
    """The pool as three flat lists (one walk of the free queue, one pass over the blocks); {} without one.

    The hashes are the blocks' own hash objects, not copies: a step costs O(num_kv_blocks) references."""
    if pool is None:
        return {}
    blocks = pool.blocks
    return {
        "free_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "ref_cnts": [b.ref_cnt for b in blocks],
        "block_hashes": [b.block_hash for b in blocks],
    }


def _tables(tables: dict) -> dict:
    """StepTrace's block_tables, and a hybrid model's group_tables (get_block_ids gives one list per group)."""
    if not any(isinstance(t, tuple) for t in tables.values()):
        return {"block_tables": tables}
    flat = {rid: [b for group in t for b in group] for rid, t in tables.items()}
    return {"block_tables": flat, "group_tables": {rid: tuple(map(list, t)) for rid, t in tables.items()}}
