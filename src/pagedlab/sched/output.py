"""Stage 1: what the scheduler tells the runner each step, and what the runner answers.

Builds on: request.py.
Read with: chapters/01-contiguous-static.md.

The scheduler and the runner share a process, so requests travel as objects
(as in nano-vllm); what changed in the KV cache travels as explicit fields so
that the runner never reaches into the KV manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedlab.request import Request


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan."""

    scheduled: list[Request]  # requests in this step's batch, in batch order
    num_scheduled_tokens: list[int]  # tokens fed for each of them (parallel to `scheduled`)
    new_block_ids: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    # ^ request_id -> (first logical block index, physical block ids from there on): block-table writes
    finished_req_ids: set[str] = field(default_factory=set)  # ended since the last step; runner drops them
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) block copies (stage 3)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (GPU block, CPU block) copies out (stage 5)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (CPU block, GPU block) copies back (stage 5)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens)


@dataclass(slots=True)
class ModelRunnerOutput:
    """The tokens sampled this step (only for requests whose whole known sequence was fed)."""

    req_ids: list[str] = field(default_factory=list)  # requests that sampled, in batch order
    token_ids: list[int] = field(default_factory=list)  # the sampled token of each
    logprobs: list[float] = field(default_factory=list)  # its logprob under the raw distribution
    top_logprobs: list[dict[int, float] | None] = field(default_factory=list)  # when logprobs were asked for
