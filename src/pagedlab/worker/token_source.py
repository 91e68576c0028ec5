"""Stage 2: a runner with no model: each request samples seeded tokens, so the engine runs where torch cannot.

Builds on: sched/output.py (SchedulerOutput in, ModelRunnerOutput out), request.py.
Read with: chapters/05-continuous-batching.md (The live lab), chapters/97-architecture.md (Layout).

The engine's step is schedule -> execute -> update, and only `execute` needs a model. Which requests run, how
many tokens each feeds, which blocks they hold, who is preempted: all of it depends on token *counts*, never on
the tokens' values (with `ignore_eos` and no stop strings, a request ends at its max_tokens). So the live lab
hands LLMEngine this runner in place of ModelRunner: the scheduler, the KV manager and the engine around them are
the real ones, and a request that would sample gets a token drawn from its id and position instead:

    token(request "7_1", position 40) = first 4 bytes of sha256(b"<seed>:7_1:40") mod vocab_size

The same seed gives the same tokens in CPython on a laptop and in Pyodide in a browser tab (sha256, unlike
`hash()`, is the same on 32- and 64-bit builds), so their traces are equal step for step.

Token values do reach one kind of decision: a full block of *output* tokens is hashed and cached at stage 4+,
so which blocks are duplicates (and where a freed one goes in the free queue) depends on them. Given the tokens a
real run sampled (`recorded`), this runner replays them, and the run is that real run, decision for decision
(tests/lessons/test_lab.py runs the bundled model to show it).
"""

from __future__ import annotations

import hashlib

from pagedlab.sched.output import ModelRunnerOutput, SchedulerOutput


class TokenSourceRunner:
    """The runner's contract (execute, forward_seconds, block_tables, attention) with no tensors behind it."""

    block_tables = None  # no copy of the tables to check: nothing reads them
    forward_seconds = 0.0  # no forward pass

    class attention:  # noqa: N801  (the engine reports `runner.attention.name`)
        name = "none (seeded tokens)"

    def __init__(self, vocab_size: int, seed: int = 0, recorded: dict[str, list[int]] | None = None):
        """`recorded`: request id -> the output tokens a real run sampled, replayed in place of seeded ones."""
        self.vocab_size, self.seed, self.recorded = vocab_size, seed, recorded or {}

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Every request whose known tokens are all fed this step samples one token, as ModelRunner's would."""
        ids, tokens = [], []
        for r in so.scheduled:
            if r.num_computed_tokens + so.num_scheduled_tokens[r.request_id] == r.num_tokens:
                ids.append(r.request_id)
                recorded = self.recorded.get(r.request_id, ())
                n = r.num_output_tokens
                tokens.append(recorded[n] if n < len(recorded) else self.token(r.request_id, r.num_tokens))
        return ModelRunnerOutput(ids, tokens, [0.0] * len(ids), [None] * len(ids))

    def token(self, request_id: str, position: int) -> int:
        digest = hashlib.sha256(f"{self.seed}:{request_id}:{position}".encode()).digest()
        return int.from_bytes(digest[:4], "big") % self.vocab_size
