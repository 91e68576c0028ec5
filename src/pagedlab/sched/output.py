"""Stage 1: what the scheduler tells the runner each step, and what comes back.

Builds on: request.py.
Read with: chapters/01-contiguous-static.md.

The scheduler and the runner share a process, so requests travel as objects
(as in nano-vllm). What changed in the KV cache travels as explicit fields, so
the runner keeps its copy of every block table from them alone, and the KV
manager never knows that a runner exists:

    new_block_tables   a request the runner has not seen (just admitted, resumed, forked): its whole table
    new_block_ids      a request it has: the blocks allocate_slots appended this step
    block_copies       copy-on-write: entry `index` of a table now names a private copy of a shared block
    finished_req_ids, preempted_req_ids   rows the runner drops (a preempted request comes back whole)

A request preempted in a step appears in none of that step's other fields:
its blocks are already freed, so a table sent for it earlier in the same
schedule() (a fork, a prefix-cache admission) is withdrawn, never installed.

vLLM: vllm/v1/core/sched/output.py (SchedulerOutput, NewRequestData, CachedRequestData),
vllm/v1/outputs.py (ModelRunnerOutput).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedlab.kv.cow import BlockCopy
from pagedlab.request import Request

if TYPE_CHECKING:
    from pagedlab.sched.beam import BeamGroup


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan."""

    scheduled: list[Request] = field(default_factory=list)  # this step's batch, in batch order
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens fed (vLLM's dict)
    total_num_scheduled_tokens: int = 0  # their sum: what the step takes of the token budget
    new_block_tables: dict[str, list[int]] = field(default_factory=dict)  # request id -> its whole table
    new_block_ids: dict[str, list[int]] = field(default_factory=dict)  # request id -> blocks appended this step
    block_copies: list[BlockCopy] = field(default_factory=list)  # applied before the forward pass (stage 3)
    finished_req_ids: set[str] = field(default_factory=set)  # ended since the last step; the runner drops them
    preempted_req_ids: set[str] = field(default_factory=set)  # preempted this step; the runner drops them (stage 5)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (GPU block, CPU block) copies out (stage 5)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (CPU block, GPU block) copies back (stage 5)


@dataclass(slots=True)
class ModelRunnerOutput:
    """The tokens sampled this step (only for requests whose whole known sequence was fed)."""

    req_ids: list[str] = field(default_factory=list)  # requests that sampled, in batch order
    token_ids: list[int] = field(default_factory=list)  # the sampled token of each
    logprobs: list[float] = field(default_factory=list)  # its logprob under the raw distribution
    top_logprobs: list[dict[int, float] | None] = field(default_factory=list)  # when logprobs were asked for


@dataclass(slots=True)
class SchedulerUpdate:
    """What `update()` reports back to the engine."""

    advanced: list[Request] = field(default_factory=list)  # requests that sampled a token (finished ones too)
    finished_beams: list[BeamGroup] = field(default_factory=list)  # beam searches that ended (stage 3)
