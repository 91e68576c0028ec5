"""Stage 4: what per-user cache salts cost on real traffic: Mooncake's traces replayed with and without them.

Builds on: lessons/traces.py (the traces, infinite_ceiling), lessons/replay.py (the stage-4 cache, bounded).
Read with: chapters/04-prefix-caching.md (A side channel: what a cache hit tells another tenant),
lessons/side_channel.py (why salt at all).

A salt is folded into block 0's hash, and the chain carries it to every later block: a salted trace is the same
trace with each hash id renamed (user, id). Requests of one user still share everything they shared; two users
share nothing, not even a system prompt every request begins with.

Mooncake's traces carry no user ids, so users are an assumption. Two are measured, one each side of the truth:

    dealt by conversation   a conversation belongs to one user. A conversation is named by its requests' first
                            block after the trace's common prefix (the blocks every request begins with: the
                            conversation trace's system prompt, block 0; none in the synthetic trace), the first
                            block its turns share with each other and, presumably, with no one else.
                            Conversations are dealt to U users by a seeded draw. Since that names a conversation
                            by what it shares, the only sharing salts can remove is the common prefix's, and
                            whatever two conversations dealt to different users would have shared after it
                            (none, by the definition): the least salts can cost.
    dealt by request        every request is dealt to one of U users on its own, splitting conversations: the
                            most they can cost (a user's own later turns usually hit under another salt).

with U = 1 (one salt for everyone: the same as no salts), 10, 100, 1000, or one user per conversation / request.

Hits are counted twice: with an infinite cache (infinite_ceiling: a block hits when it and every block before it
were seen before) and with the replay's LRU pool of POOL_BLOCKS blocks of 512 tokens, the stage-4 manager itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pagedlab.lessons.traces import TraceRequest, infinite_ceiling, load_trace

POOL_BLOCKS = 8192  # the replay's default pool: 8,192 blocks of 512 tokens, 4.2 M tokens
EACH = None  # users=EACH: one user per conversation, or per request
ROWS = (  # the table's rows: (dealt by, users)
    ("conversation", 1), ("conversation", 10), ("conversation", 100), ("conversation", 1000), ("conversation", EACH),
    ("request", 10), ("request", 100), ("request", 1000), ("request", EACH),
)  # fmt: skip


def common_prefix(trace) -> int:
    """How many blocks every request of the trace begins with (the same ids)."""
    first = trace[0].hash_ids
    n = len(first)
    for r in trace:
        while n and tuple(r.hash_ids[:n]) != tuple(first[:n]):
            n -= 1
    return n


def conversation_key(r: TraceRequest, common: int) -> int:
    """The id that names `r`'s conversation: its first block after the common prefix (its last, if none)."""
    return r.hash_ids[min(common, len(r.hash_ids) - 1)]


def deal_users(trace, by: str, users: int | None, seed: int = 0) -> list:
    """Each request's user: its conversation's or its own (`by`), drawn among `users` (EACH: one apiece)."""
    if by not in ("conversation", "request"):
        raise ValueError(f"by: {by!r} is not 'conversation' or 'request'")
    common, rng = common_prefix(trace), random.Random(seed)
    keys = [conversation_key(r, common) for r in trace] if by == "conversation" else list(range(len(trace)))
    if users is EACH:
        return keys
    drawn: dict = {}  # key -> its user, drawn when the key is first seen
    for k in keys:
        if k not in drawn:
            drawn[k] = rng.randrange(users)
    return [drawn[k] for k in keys]


def salted(trace, user_of: list) -> list[TraceRequest]:
    """`trace` with every request's ids renamed (its user, id), as vLLM's cache_salt on block 0 renames the whole
    chain; the new ids are small integers, so the result is a trace like any other."""
    renamed: dict[tuple, int] = {}  # (user, id) -> the new id
    out = []
    for r, user in zip(trace, user_of):
        ids = tuple(renamed.setdefault((user, h), len(renamed)) for h in r.hash_ids)
        out.append(TraceRequest(r.timestamp, r.input_length, r.output_length, ids))
    return out


@dataclass(frozen=True)
class SaltingRow:
    """One trace under one assumption about users."""

    trace: str  # the trace's name ("custom": a list of requests)
    by: str  # "conversation" or "request": what is dealt to users (the module docstring)
    users: int | None  # how many users (EACH: one per conversation or request)
    infinite_hit_ratio: float  # prompt blocks served from an infinite cache, over all prompt blocks
    lru_hit_ratio: float | None  # the same with the replay's LRU pool of POOL_BLOCKS (None: not replayed)


def salting_cost(trace="conversation", rows=ROWS, lru: bool = True, seed: int = 0) -> list[SaltingRow]:
    """The hit ratio of a bundled trace (or a list of TraceRequest) with per-user salts, for each (by, users) of
    `rows`; users = 1 is no salts. lru=False skips the bounded replay (about a second a row on the conversation
    trace)."""
    from pagedlab.lessons.replay import replay

    name, trace = (trace, load_trace(trace)) if isinstance(trace, str) else ("custom", list(trace))
    out = []
    for by, users in rows:
        requests = salted(trace, deal_users(trace, by, users, seed))
        hits, blocks = infinite_ceiling(requests)
        lru_ratio = replay(requests, "lru", POOL_BLOCKS).hit_ratio if lru else None
        out.append(SaltingRow(name, by, users, hits / blocks, lru_ratio))
    return out


def salting_table(rows: list[SaltingRow]) -> str:
    """The rows as a Markdown table."""
    lines = ["| trace | dealt by | users (salts) | hit ratio, infinite cache | hit ratio, LRU pool of 8,192 blocks |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        users = f"one per {r.by}" if r.users is EACH else "1 (no salts)" if r.users == 1 else f"{r.users:,}"
        lru = "—" if r.lru_hit_ratio is None else f"{r.lru_hit_ratio:.1%}"
        lines.append(f"| {r.trace} | {r.by} | {users} | {r.infinite_hit_ratio:.1%} | {lru} |")
    return "\n".join(lines)
