"""Stage 5: pagedlab's run beside vLLM's real scheduler on the same requests: the decisions, and where they part.

Builds on: engine/replay.py (the run's recording), lessons/vllm_peer.py (vLLM's Scheduler in a subprocess),
viz/trace.py (both runs as traces), viz/page.py (the page that steps through them under one cursor).
Read with: chapters/09-graduate-to-vllm.md.

    pagedlab's run (record_trace=True)  ->  its recording  ->  vLLM 0.33.0's Scheduler  ->  vLLM's trace
                      \\____________________ divergences(ours, vllm) ____________________/

A step's decisions are compared field by field: the requests scheduled and their token counts, the
preemptions, the finished requests and their reasons, the prompt tokens the prefix cache served each
request (`num_cached_tokens`), then the block tables and the number of free blocks. Each divergence is
explained by a row of a chapter's "Differences from vLLM" ledger, or is "unexplained": a bug in one of
the two, or a difference the ledger has not written down yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedlab.viz.trace import validate

SCHEDULE_FIELDS = ("scheduled", "preempted", "finished", "num_cached_tokens")
BLOCK_FIELDS = ("tables", "num_free_blocks")
VLLM_LABEL = "vLLM 0.33.0's scheduler"


@dataclass(frozen=True)
class LedgerRow:
    """A row of a chapter's "Differences from vLLM" table that explains a kind of divergence."""

    key: str
    chapter: str  # the chapter file, under chapters/
    pagedlab: str  # the row's first cell, as the chapter writes it (tests/viz/test_compare.py checks it is there)
    summary: str  # one line for the page


LEDGER = {
    row.key: row
    for row in (
        LedgerRow(
            "duplicate-cached-blocks",
            "04-prefix-caching.md",
            "one block per hash: a second block with the same contents is not registered",
            "vLLM caches a second block under a hash it already has, so when it is freed it goes to the free "
            "queue's tail (cached), where pagedlab's goes to the head (uncached): later block ids differ",
        ),
        LedgerRow(
            "window-prefix-hit",
            "02-paged-blocks.md",
            "a prefix hit behind a window needs the whole prefix cached",
            "behind a sliding window vLLM needs only the window's last blocks cached for a hit; pagedlab the "
            "whole prefix, so it may serve fewer cached tokens",
        ),
    )
}


def decisions(step: dict) -> dict:
    """What a step decided, in the fields both runs share (a trace step of either)."""
    return {
        "scheduled": dict(step["scheduled"]),
        "preempted": sorted(step["preempted"]),
        "finished": dict(step["finished"]),
        "num_cached_tokens": dict(step.get("num_cached_tokens", {})),
        "tables": dict(step["tables"]),
        "num_free_blocks": None if step["pool"] is None else len(step["pool"]["free"]),
    }


def first_cached_tokens(steps: list[dict]) -> list[dict]:
    """Each step's num_cached_tokens, keeping only a request's first report (when it was first scheduled)."""
    seen, out = set(), []
    for step in steps:
        first = {rid: n for rid, n in step.get("num_cached_tokens", {}).items() if rid not in seen}
        seen |= first.keys()
        out.append(first)
    return out


def divergences(ours: dict, theirs: dict) -> list[dict]:
    """Every (step, field) where the two traces' decisions differ, in step order: {"step", "field", "ours",
    "vllm", "ledger": the LEDGER key that explains it or None (unexplained), "first": the step of the run's
    first divergence}. Once two runs part, everything after follows from it: the first divergence is
    explained (or not) on its own, and every later one carries the first one's explanation."""
    a_steps, b_steps = ours["steps"], theirs["steps"]
    a_cached, b_cached = first_cached_tokens(a_steps), first_cached_tokens(b_steps)
    found, duplicate_seen, cause = [], False, None
    for i in range(max(len(a_steps), len(b_steps))):
        a, b = _decided(a_steps, a_cached, i), _decided(b_steps, b_cached, i)
        duplicate_seen = duplicate_seen or (i < len(b_steps) and _has_duplicate_hash(b_steps[i]))
        for name in SCHEDULE_FIELDS + BLOCK_FIELDS:
            if a.get(name) == b.get(name):
                continue
            if not found:
                cause = _explain(name, duplicate_seen, ours["config"])
            first = found[0]["step"] if found else i + 1
            found.append({"step": i + 1, "field": name, "ours": a.get(name), "vllm": b.get(name), "ledger": cause,
                          "first": first})  # fmt: skip
    return found


def _decided(steps: list[dict], cached: list[dict], i: int) -> dict:
    if i >= len(steps):
        return {}  # a run that has ended decides nothing
    return decisions(steps[i]) | {"num_cached_tokens": cached[i]}


def _has_duplicate_hash(step: dict) -> bool:
    hashes = [h for h in (step["pool"] or {}).get("hash", []) if h is not None]
    return len(hashes) != len(set(hashes))


def _explain(field: str, duplicate_seen: bool, config: dict) -> str | None:
    """The ledger row that explains a run's first divergence (in `field`), or None.

    A block vLLM holds twice under one hash (it was computed twice in one step) is, in pagedlab, one
    uncached block: freed, it is reused first instead of last, and a later prefix hit may find it gone.
    """
    if duplicate_seen:
        return "duplicate-cached-blocks"
    if config.get("sliding_window") and config.get("enable_prefix_caching") and field == "num_cached_tokens":
        return "window-prefix-hit"
    return None


def summary(found: list[dict]) -> dict:
    """Counts for a line of text: schedule-equal, block-equal, and what explains the rest."""
    schedule = [d for d in found if d["field"] in SCHEDULE_FIELDS]
    blocks = [d for d in found if d["field"] in BLOCK_FIELDS]
    return {
        "same_schedule": not schedule,
        "same_blocks": not blocks,
        "unexplained": sum(1 for d in found if d["ledger"] is None),
        "first": found[0] if found else None,
    }


def as_trace(steps: list[dict], like: dict) -> dict:
    """vLLM's steps (from the driver) as a trace of the same requests and settings as `like`."""
    num_hashes = 1 + max((h for s in steps for h in (s["pool"]["hash"] if s["pool"] else []) if h is not None),
                         default=-1)  # fmt: skip
    out = {
        "version": like["version"],
        "stage": like["stage"],
        "stage_name": VLLM_LABEL,
        "config": dict(like["config"]),
        "requests": like["requests"],
        "hashes": [f"vllm{i:08d}" for i in range(num_hashes)],
        "steps": steps,
    }
    validate(out)
    return out
