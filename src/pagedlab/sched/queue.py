"""Stage 5: the waiting queue, as groups: FCFS (a deque) or priority (a heap), and each one's victim rule.

Builds on: request.py.
Read with: chapters/05-continuous-batching.md.

An entry is a group: a request, the n children of an n > 1 request, or the
beams of a beam search, which are admitted and preempted as one unit.
Iterating the queue yields requests, in queue order. Each entry is the queue's
own list: removing an aborted request from it never touches the group as the
engine or the scheduler hold it.
vLLM: vllm/v1/core/sched/request_queue.py (FCFSRequestQueue, PriorityRequestQueue).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from pagedlab.request import Request


class FCFSQueue:
    """First come, first served; a preempted group goes back to the front."""

    def __init__(self):
        self._groups: deque[list[Request]] = deque()

    def add(self, group) -> None:
        self._groups.append(list(group))

    def add_preempted(self, group) -> None:
        self._groups.appendleft(list(group))

    def peek(self) -> list[Request]:
        return self._groups[0]

    def pop(self) -> list[Request]:
        return self._groups.popleft()

    def remove(self, request: Request) -> None:
        for group in self._groups:
            if request in group:
                group.remove(request)
                if not group:
                    self._groups.remove(group)
                return

    def __iter__(self):
        return (r for group in list(self._groups) for r in group)

    def __contains__(self, request: Request) -> bool:
        return any(request in group for group in self._groups)

    def __len__(self) -> int:
        return len(self._groups)


class PriorityQueue(FCFSQueue):
    """Lowest (priority, arrival_time, request id) first, vLLM's request order (`Request.__lt__`); a group
    is ordered by its user request id. A preempted group is re-queued by the same key, so it runs again as
    soon as nothing more urgent waits."""

    def __init__(self):
        self._heap: list = []  # (priority, arrival_time, group id, seq, group)
        self._seq = itertools.count()  # last tie-break (vLLM: id()), so groups themselves are never compared

    def add(self, group) -> None:
        first = group[0]
        heapq.heappush(self._heap, (first.priority, first.arrival_time, first.group_id, next(self._seq), list(group)))

    add_preempted = add

    def peek(self) -> list[Request]:
        return self._heap[0][-1]

    def pop(self) -> list[Request]:
        return heapq.heappop(self._heap)[-1]

    def remove(self, request: Request) -> None:
        for i, entry in enumerate(self._heap):
            if request in entry[-1]:
                entry[-1].remove(request)
                if not entry[-1]:
                    self._heap.pop(i)
                    heapq.heapify(self._heap)
                return

    def __iter__(self):
        return (r for *_, group in sorted(self._heap, key=lambda e: e[:-1]) for r in group)

    def __contains__(self, request: Request) -> bool:
        return any(request in entry[-1] for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)


# BEGIN SOLUTION
# TASK victim (10 pts): each policy's victim rule: which running request to preempt when one cannot get blocks.
def newest(running: list[Request]) -> Request:
    """FCFS: the request admitted last, `running[-1]` (vLLM's); the oldest is never the victim while another
    runs, so it always makes progress. Returns that Request."""
    return running[-1]


def least_urgent(running: list[Request]) -> Request:
    """Priority: the Request with the largest (priority, arrival_time, group_id), the waiting queue's own order, so
    the most urgent group always makes progress (vLLM's key stops at arrival_time: chapter 5's ledger says why
    not here)."""
    return max(running, key=lambda r: (r.priority, r.arrival_time, r.group_id))


# END SOLUTION
