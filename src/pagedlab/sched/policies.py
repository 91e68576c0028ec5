"""Stage 5: the scheduling policies by name: the waiting queue's order, the victim rule, and their words.

Builds on: sched/queue.py (FCFSQueue, PriorityQueue and their victim rules).
Read with: chapters/05-continuous-batching.md (Priority), chapters/97-architecture.md (How to add a policy).

`scheduling_policy="fcfs"` or `"priority"` names one Policy; the scheduler
builds its waiting queue from it and asks it for the victim, the engine's
events quote its words, and the door refuses a priority the policy ignores.
Adding a policy is one file (its queue class and victim rule) and one line in
POLICIES. vLLM: vllm/v1/core/sched/request_queue.py (SchedulingPolicy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pagedlab.request import Request
from pagedlab.sched.queue import FCFSQueue, PriorityQueue, least_urgent, newest


@dataclass(frozen=True)
class Policy:
    """How waiting groups are ordered, and whom a running request that needs blocks preempts."""

    name: str  # the value of EngineConfig.scheduling_policy
    queue: type  # the waiting queue: add, add_preempted, peek, pop, remove, iteration in queue order
    victim: Callable[[list[Request]], Request]  # the running request whose group is preempted
    victim_words: str  # the victim rule as the step's events say it ("the newest arrival")
    uses_priority: bool  # whether a request's priority means anything (else a priority other than 0 is refused)


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("fcfs", FCFSQueue, newest, "the newest arrival", uses_priority=False),
        Policy("priority", PriorityQueue, least_urgent, "the lowest priority", uses_priority=True),
    )
}
