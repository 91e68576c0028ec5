"""Stage 2: the live lab's requests, drawn from a seed: lengths, arrivals, shared prefixes, priorities, n > 1.

Builds on: nothing of pagedlab (plain data); lessons/lab.py queues these in the engine.
Read with: chapters/05-continuous-batching.md (The live lab).

A workload is a list of LabRequests, the same for a seed on every machine: it draws only with
`random.Random(seed).random()`, the one draw Python promises to keep from version to version (the lab runs in
Pyodide's CPython as well as the desktop's). What it draws, per request:

    arrival     the step it arrives before: gaps of 0, 1 or 2 steps, so bursts and lulls both happen
    prompt      a shared prefix (one of three "system prompts", 16-48 tokens) half of the time, then its own
                tail of 4-64 tokens: prefix caching has something to find, and blocks something to share
    max_tokens  2-40 output tokens; every request runs to its length (ignore_eos), as a recorded run would
    priority    0, 1 or 2 (lower is served first under the priority policy)
    n           1, and 2 or 3 for one request in eight: children that fork from one prompt (stage 3); such a
                request's own tail and output are 24 tokens at most, so that its children's worst cases fit the
                default pool (48 blocks of 8) and, at stages 2-4, their prompts one step's budget (256)

Token ids are below VOCAB_SIZE, the bundled model's vocabulary, so that the same workload also runs through the
real model: tests/lessons/test_lab.py checks that it schedules exactly as the lab does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

VOCAB_SIZE = 68  # the bundled model's vocabulary (its characters), so the bundled model can run a workload too
MAX_MODEL_LEN = 160  # prompt (48 + 64 tokens at most) + output (40 at most) fits
NUM_PREFIXES = 3  # shared "system prompts"


@dataclass(frozen=True)
class LabRequest:
    """One request of a workload."""

    request_id: str  # "0", "1", ... in arrival order
    prompt_token_ids: tuple[int, ...]
    max_tokens: int  # output tokens; ignore_eos, so exactly this many
    arrival_step: int  # queued just before this engine step (1 = before the first)
    priority: int  # 0 (first) .. 2, read by the priority policy only
    n: int  # children sampled from the prompt
    prefix: int | None  # which shared prefix the prompt starts with (None: none), for the page's labels
    prefix_len: int  # its length in tokens (0: none)

    @property
    def label(self) -> str:
        """What the page shows for the prompt (the lab's tokens have no text)."""
        own = len(self.prompt_token_ids) - self.prefix_len
        head = f"system prompt {'ABC'[self.prefix]} ({self.prefix_len} tokens) + " if self.prefix is not None else ""
        return f"{head}{own} tokens of its own" + (f", n = {self.n}" if self.n > 1 else "")


def make_workload(num_requests: int, seed: int) -> list[LabRequest]:
    """`num_requests` requests drawn from `seed`, in arrival order."""
    rng = random.Random(seed)
    draw = rng.random

    def between(low: int, high: int) -> int:  # an integer in [low, high], from random() alone
        return low + int(draw() * (high - low + 1))

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(between(0, VOCAB_SIZE - 1) for _ in range(count))

    prefixes = [tokens(between(16, 48)) for _ in range(NUM_PREFIXES)]
    requests, step = [], 1
    for i in range(num_requests):
        step += (0, 0, 1, 2)[between(0, 3)] if i else 0
        prefix = between(0, NUM_PREFIXES - 1) if draw() < 0.5 else None
        n = between(2, 3) if draw() < 0.125 else 1
        longest = 64 if n == 1 else 24  # n children hold n worst cases: kept within the default pool and budget
        prompt = (prefixes[prefix] if prefix is not None else ()) + tokens(between(4, longest))
        shared = len(prefixes[prefix]) if prefix is not None else 0
        requests.append(
            LabRequest(str(i), prompt, between(2, min(40, longest)), step, between(0, 2), n, prefix, shared)
        )
    return requests
