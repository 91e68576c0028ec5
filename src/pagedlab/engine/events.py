"""Stage 1: what changed in one step, in words: the events that `pagedlab demo --step` lists under each step.

Builds on: engine/stats.py (StepTrace: one recorded step), config.py (EngineConfig).
Read with: chapters/05-continuous-batching.md, chapters/97-architecture.md (One engine step).

A recorded step is a snapshot taken after scheduling and the forward pass,
before `update` frees anything. Two snapshots in a row say what happened
between them:

    admit     a request got a seat: its first step of running (a resumed one too)
    refill    ... into the seat a request left one step before, while the others ran on
    fork      a child of an n > 1 request (or a beam) took its parent's table, every block shared (stage 3+)
    hit       its first prompt blocks came from the prefix cache (stage 4+)
    swap_in   its blocks came back from the CPU pool (stage 5, preemption_mode="swap")
    allocate  blocks added to a table this step (on demand from stage 2; the whole region at stage 1)
    copy      copy-on-write: a private copy of a shared block (stage 3+)
    preempt   the pool ran out while scheduling: a request gave its seat back (stage 5)
    swap_out  ... its blocks copied to the CPU pool instead of dropped
    free      blocks no table holds any more (a preemption's, at the step it happened; a finished
              request's, at the step it finished, since update frees them right after the snapshot)
    finish    a request ended (stop, length or abort)
    mixed     prefill chunks and decodes in one batch (continuous batching, stage 5)

These are pagedlab's words, not vLLM's; vLLM's scheduler reports the same
facts as SchedulerOutput (vllm/v1/core/sched/output.py) and its KV events
(vllm/distributed/kv_events.py: BlockStored, BlockRemoved).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedlab.engine.stats import StepTrace
from pagedlab.sched.policies import POLICIES

EVENT_KINDS = (
    "finish",
    "preempt",
    "swap_out",
    "admit",
    "refill",
    "fork",
    "hit",
    "swap_in",
    "allocate",
    "copy",
    "free",
    "mixed",
)


@dataclass(frozen=True)
class StepEvent:
    """One thing that happened in a step, to one request (or to the batch: request_id None)."""

    kind: str  # one of EVENT_KINDS
    request_id: str | None
    blocks: tuple[int, ...] = ()  # the physical blocks it concerns
    detail: str = ""  # the why, in words

    @property
    def text(self) -> str:
        """The event as one short sentence: '3 admitted: a seat was free', '5 +block 9'."""
        who = "" if self.request_id is None else f"{self.request_id} "
        blocks = f" {block_list(self.blocks)}" if self.blocks else ""
        words = {
            "finish": f"{who}finished",
            "preempt": f"{who}preempted",
            "swap_out": f"{who}swapped out{blocks} to the CPU pool",
            "admit": f"{who}admitted",
            "refill": f"{who}took a seat freed last step",
            "fork": f"{who}forked: shares {'block' if len(self.blocks) == 1 else 'blocks'}{blocks} with its parent",
            "hit": f"{who}prefix-cache hit:{blocks}",
            "swap_in": f"{who}swapped back in:{blocks}",
            "allocate": f"{who}+{'block' if len(self.blocks) == 1 else 'blocks'}{blocks}",
            "copy": f"{who}copy-on-write: block {' -> block '.join(map(str, self.blocks))}",
            "free": f"{who}freed{blocks}",
            "mixed": "prefill chunks and decodes in one batch",
        }[self.kind]
        return f"{words} ({self.detail})" if self.detail else words


def step_events(trace: Sequence[StepTrace], index: int, config) -> list[StepEvent]:
    """The events of step trace[index], found by comparing it with the step before (none before the first).

    `config` is the engine's EngineConfig (block_size, max_num_seqs, the policies) for the whys.
    """
    null = null_block_id(config)
    now = _real(trace[index], null)
    before = _real(trace[index - 1], null) if index > 0 else StepTrace(0, 0.0, {}, [], [])
    events = _preemptions(before, now, config)
    events += _admissions(before, now, config, trace[index], null)
    events += _growth(before, now)
    events += _finishes(now, config)
    if now.prefills and len(now.prefills) < len(now.scheduled):
        events.append(
            StepEvent(
                "mixed",
                None,
                detail=f"{len(now.prefills)} prefilling, {len(now.scheduled) - len(now.prefills)} decoding",
            )
        )
    return events


def _preemptions(before: StepTrace, now: StepTrace, config) -> list[StepEvent]:
    events = []
    victim = POLICIES[config.scheduling_policy].victim_words
    swapped_gpu = {gpu for gpu, _ in now.swap_out}
    for rid in now.preempted:
        blocks = tuple(before.block_tables.get(rid, ()))
        out = tuple(b for b in blocks if b in swapped_gpu)
        if out:
            how = "its K/V goes to the CPU pool"
        elif config.enable_prefix_caching:
            how = "its K/V is dropped, to be recomputed where the prefix cache misses"
        else:
            how = "its K/V is dropped, to be recomputed"
        events.append(
            StepEvent(
                "preempt",
                rid,
                detail=f"why: no free block for the running requests' next tokens; {victim} goes first; {how}",
            )
        )
        if out:
            events.append(StepEvent("swap_out", rid, out))
        shared = _held(before, without={rid})  # blocks others hold too stay where they are
        freed = tuple(b for b in blocks if b not in shared)
        if freed:
            kept = ", still in the prefix cache" if config.enable_prefix_caching and not out else ""
            events.append(StepEvent("free", rid, freed, detail="back in the pool" + kept))
    return events


def _admissions(before: StepTrace, now: StepTrace, config, raw: StepTrace, null: int | None) -> list[StepEvent]:
    """`raw`: the step as recorded (`now` without the null block's entries), whose tables say which entries the
    prefix cache served: the first num_hit of every group's table."""
    events = []
    newly = [rid for rid in now.running if rid not in before.running]
    seats_freed = [rid for rid in before.finished if rid not in now.running]
    num_refills = len(seats_freed) if any(rid in now.running for rid in before.running) else 0
    swapped_in = {gpu for _, gpu in now.swap_in}
    for i, rid in enumerate(newly):
        table = now.block_tables.get(rid, [])
        computed = now.kv_used.get(rid, 0) - now.scheduled.get(rid, 0)  # before this step's tokens
        events.append(StepEvent("admit", rid, detail="a seat and its first blocks were free"))
        if i < num_refills:  # the first admissions take the seats just left; others were free before
            events.append(StepEvent("refill", rid, detail=f"{seats_freed[i]} finished in step {before.step}"))
        back = tuple(b for b in table if b in swapped_in)
        as_forked = _as_forked(rid, table, now)
        shared = _sibling_blocks(rid, before, now) & set(as_forked)
        num_hit = 0 if back or shared else computed // config.block_size
        if shared:
            events.append(StepEvent("fork", rid, tuple(b for b in as_forked if b in shared), detail=FORKED))
        groups = raw.group_tables.get(rid) or [raw.block_tables.get(rid, [])]  # a hybrid model: a table per group
        if num_hit:
            hits = tuple(b for g in groups for b in g[:num_hit] if b != null)  # a window's first hits: the null block
            events.append(StepEvent("hit", rid, hits, detail=f"{computed} tokens not recomputed"))
        if back:
            events.append(StepEvent("swap_in", rid, back, detail=f"{computed} tokens kept"))
        rest = [b for g in groups for b in g[num_hit:] if b != null]
        fresh = tuple(b for b in rest if b not in swapped_in and b not in shared)
        if fresh:
            events.append(StepEvent("allocate", rid, fresh))
    return events


def _sibling_blocks(rid: str, before: StepTrace, now: StepTrace) -> set[int]:
    """Blocks that another member of rid's group holds in either step (what a fork shares)."""
    group = now.groups.get(rid)
    if group is None:
        return set()
    return {
        b
        for trace in (before, now)
        for other, table in trace.block_tables.items()
        if other != rid and trace.groups.get(other, other) == group
        for b in table
    }


def _growth(before: StepTrace, now: StepTrace) -> list[StepEvent]:
    """Blocks that running requests gained this step, and copy-on-write copies.

    A child admitted with an empty table (it waits for its leader's prefill) forks a step later: the
    blocks it gains that a sibling holds are shared, not allocated."""
    events = []
    copied = {(rid, dst): src for rid, src, dst in now.copies}
    for rid, table in now.block_tables.items():
        if rid not in before.running:
            continue  # an admission: _admissions told it
        old = set(before.block_tables.get(rid, ()))
        as_forked = _as_forked(rid, table, now)  # a copied entry as the fork made it: the shared source
        gained = [b for b in as_forked if b not in old]
        shared = _sibling_blocks(rid, before, now) if gained and not old else set()
        if forked := tuple(b for b in gained if b in shared):
            events.append(StepEvent("fork", rid, forked, detail=FORKED))
        if new := tuple(b for b in gained if b not in shared and (rid, b) not in copied):
            events.append(StepEvent("allocate", rid, new))
    for (rid, dst), src in copied.items():
        events.append(
            StepEvent("copy", rid, (src, dst), detail=f"{src} is shared, so {rid} writes into its copy {dst}")
        )
    return events


def _finishes(now: StepTrace, config) -> list[StepEvent]:
    events = []
    still_held = _held(now, without=set(now.finished))
    kept = "; kept in the prefix cache" if config.enable_prefix_caching else ""
    for rid in now.finished:
        events.append(StepEvent("finish", rid, detail=now.finish_reasons.get(rid, "")))
        freed = tuple(b for b in now.block_tables.get(rid, ()) if b not in still_held)
        if freed:
            events.append(StepEvent("free", rid, freed, detail=f"after this step{kept}"))
    return events


FORKED = "no copy yet: a shared block is copied only when written"


def null_block_id(config) -> int | None:
    """Block 0 is the null block where a sliding window (or a hybrid model's groups) takes it, else None: it is
    never allocated, freed, hit or shared, so no event names it."""
    return 0 if config.sliding_window or config.hybrid else None


def _real(trace: StepTrace, null: int | None) -> StepTrace:
    """The step with the null block's entries left out of every table (a hybrid model's: every group's, flat)."""
    if null is None:
        return trace
    tables = {rid: [b for b in table if b != null] for rid, table in trace.block_tables.items()}
    return replace(trace, block_tables=tables)


def _as_forked(rid: str, table: list[int], now: StepTrace) -> list[int]:
    """rid's table with this step's copies undone: what the fork gave it, before copy-on-write replaced an entry."""
    source = {dst: src for who, src, dst in now.copies if who == rid}
    return [source.get(b, b) for b in table]


def _held(trace: StepTrace, without: set[str] = frozenset()) -> set[int]:
    """Every block some table of `trace` holds (leaving out the requests in `without`)."""
    return {b for rid, table in trace.block_tables.items() if rid not in without for b in table}


def block_list(block_ids: Sequence[int], max_chars: int = 24) -> str:
    """[0, 1, 2, 3, 7, 9, 10] -> '0-3,7,9-10', cut with '…' beyond max_chars."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive ids
    for block_id in block_ids:
        if runs and block_id == runs[-1][1] + 1:
            runs[-1][1] = block_id
        else:
            runs.append([block_id, block_id])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
