"""Stage 5: continuous batching: one token budget per step, chunked prefill, preemption.

Builds on: sched/cow.py (n > 1 sharing, beams, update), kv/prefix.py, sched/queue.py.
Read with: chapters/05-continuous-batching.md.

Every step the batch is formed anew, as in vLLM v1 (vllm/v1/core/sched/scheduler.py):

    budget = max_num_batched_tokens
    1. running requests, in order: each gets num_tokens - num_computed_tokens new tokens
       (1 for a decode; a prefill chunk capped by long_prefill_token_threshold and the budget).
       No blocks for it?  preempt the lowest-priority running group (FCFS: the newest) and retry.
    2. waiting groups, in queue order, while budget, max_num_seqs and the KV cache allow,
       counting prefix-cache hits first. Never in a step that preempted.

Prefill and decode differ only in how far num_computed_tokens lags num_tokens,
so one batch mixes them. A preempted request frees its blocks and starts over
(recompute); the prefix cache usually gives most of them back.
"""

from __future__ import annotations

from pagedlab.errors import InvariantError, check
from pagedlab.request import Request, RequestStatus
from pagedlab.sched.beam import BeamGroup
from pagedlab.sched.cow import CowScheduler
from pagedlab.sched.output import SchedulerOutput
from pagedlab.sched.queue import make_queue


class ContinuousScheduler(CowScheduler):
    """Invariants: a step's tokens <= max_num_batched_tokens; seats (running, plus the beams a
    running beam search may still fork) <= max_num_seqs; every block freed exactly once."""

    def __init__(self, config, kv_manager):
        super().__init__(config, kv_manager)
        self.waiting = make_queue(config.scheduling_policy)  # groups, FCFS or by priority
        self.num_preemptions = 0  # requests preempted so far
        self._budget = 0  # tokens left in the step being scheduled
        self._preempted_now = False  # this step preempted someone: admit nobody

    def add_request(self, group: list[Request]) -> None:
        if len(group) > 1:
            self.families[group[0].group_id] = group
        self.waiting.add(group)

    def add_beam_group(self, beam_group: BeamGroup) -> None:
        self.beam_groups[beam_group.request_id] = beam_group
        self.waiting.add(list(beam_group.live))

    def check_admissible(self, group: list[Request]) -> None:
        """Chunked prefill accepts any prompt length; only a group that can never hold its KV is refused."""
        if len(group) > self.config.max_num_seqs:
            raise ValueError(f"n: {len(group)} children exceed max_num_seqs ({self.config.max_num_seqs})")
        if not self.kv.can_ever_admit(group):
            raise ValueError(
                f"num_kv_blocks: {self.config.num_kv_blocks} blocks can never hold this request's worst case "
                f"(prompt + max_tokens for each of its {len(group)} children); it would be preempted forever"
            )

    # BEGIN SOLUTION
    # TASK: continuous scheduling: running first under one token budget, preempting when blocks run out,
    # then waiting groups, never in a step that preempted.
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput([], [], finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        self._budget, self._preempted_now = self.config.max_num_batched_tokens, False
        self._schedule_running(out)
        if not self._preempted_now:
            self._schedule_waiting(out)
        out.block_copies = self.kv.take_block_copies()
        if out.total_num_scheduled_tokens > self.config.max_num_batched_tokens:
            raise InvariantError(f"{out.total_num_scheduled_tokens} tokens scheduled: the token budget is exceeded")
        return out

    def _schedule_running(self, out: SchedulerOutput) -> None:
        for request in list(self.running):
            if self._budget <= 0:
                break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            num_new = self._chunk(self._num_new_tokens(request))
            if num_new == 0:
                continue
            if not self._allocate_or_preempt(request, num_new, out):
                break  # the request itself was the one preempted
            self._record(request, num_new, out)

    def _allocate_or_preempt(self, request: Request, num_new: int, out: SchedulerOutput) -> bool:
        while self.kv.allocate_slots(request, num_new) is None:
            victims = self._victim_group()
            self._preempt(victims, out)
            if request in victims:
                return False
        return True

    def _schedule_waiting(self, out: SchedulerOutput) -> None:
        while self.waiting and self._budget > 0:
            group = self.waiting.peek()
            if self._num_seats() + self._seats_for(group) > self.config.max_num_seqs:
                break
            if not self._admit_group(group, out):
                break  # head-of-line: the queue's order is the policy
            self.waiting.pop()

    # END SOLUTION

    def _chunk(self, num_new: int) -> int:
        """Cap a request's new tokens by long_prefill_token_threshold (0 = no cap) and the budget."""
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0:
            num_new = min(num_new, threshold)
        return min(num_new, self._budget)

    def _record(self, request: Request, num_new: int, out: SchedulerOutput) -> None:
        update = self.kv.table_update(request)
        if update is not None:
            out.new_block_ids[request.request_id] = update
        out.scheduled.append(request)
        out.num_scheduled_tokens.append(num_new)
        self._budget -= num_new

    def _admit_group(self, group: list[Request], out: SchedulerOutput) -> bool:
        """All or nothing: every member's cache hits and first chunk must fit in the free blocks."""
        plan, budget, needed = [], self._budget, 0
        for request in group:
            num_new, hits, blocks = self._plan_admission(request, budget)
            needed += blocks
            budget -= num_new
            plan.append((request, hits, num_new))
        if needed > self.kv.num_free_blocks:
            return False
        for request, hits, _ in plan:  # touch every hit before allocating, so none is evicted meanwhile
            if self.kv.is_swapped(request):
                out.swap_in += self.kv.swap_in(request)
            else:
                request.num_computed_tokens = self.kv.take_hits(request, hits)
                if request.num_cached_tokens is None:  # as vLLM, the hits of its first admission
                    request.num_cached_tokens = request.num_computed_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
        for request, _, num_new in plan:
            if num_new:
                if self.kv.allocate_slots(request, num_new) is None:
                    raise InvariantError(f"{request.request_id}: no room although the group's blocks were counted")
                self._record(request, num_new, out)
        return True

    def _plan_admission(self, request: Request, budget: int) -> tuple[int, list, int]:
        """(tokens to feed now, prefix-cache hits, free blocks it takes) for one member of a group."""
        if self._waits_for_leader(request):
            return 0, [], 0
        if self.kv.is_swapped(request):  # resumes where it stopped, once its blocks are back
            num_new = min(self._chunk(request.num_tokens - request.num_computed_tokens), budget)
            return num_new, [], self.kv.blocks_to_swap_in(request, num_new)
        hits = self.kv.get_computed_blocks(request)
        target = request.num_prompt_tokens - 1 if self._is_unforked_leader(request) else request.num_tokens
        num_new = min(self._chunk(target - len(hits) * self.kv.block_size), budget)
        return num_new, hits, self.kv.blocks_to_admit(request, hits, num_new)

    def _waits_for_leader(self, request: Request) -> bool:
        family = self.families.get(request.group_id)
        return family is not None and request is not family[0] and request.request_id not in self.forked

    def _is_unforked_leader(self, request: Request) -> bool:
        family = self.families.get(request.group_id)
        return (
            family is not None
            and request is family[0]
            and request.num_prompt_tokens > 1
            and any(r.request_id not in self.forked for r in family[1:])
        )

    def _seats_for(self, group: list[Request]) -> int:
        beams = self.beam_groups.get(group[0].group_id)
        return beams.width if beams is not None else len(group)

    def _num_seats(self) -> int:
        """Running requests, plus the beams a running beam search may still fork."""
        reserved = sum(
            g.width - len(g.live)
            for g in self.beam_groups.values()
            if g.live and g.live[0].status == RequestStatus.RUNNING
        )
        return len(self.running) + reserved

    def _victim_group(self) -> list[Request]:
        """FCFS: the newest running request's group; priority: the group of the largest (priority, arrival)."""
        if self.config.scheduling_policy == "priority":
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
        else:
            victim = self.running[-1]
        return [r for r in self.running if r.group_id == victim.group_id]

    def _preempt(self, group: list[Request], out: SchedulerOutput) -> None:
        """Swap the group's blocks out to the CPU pool if asked and they fit; else recompute:
        free them and forget the progress. Either way the group waits again."""
        swap = self.config.preemption_mode == "swap" and self.kv.can_swap_out(group)
        for request in group:
            if request in out.scheduled:  # already given tokens this step: refund them
                i = out.scheduled.index(request)
                self._budget += out.num_scheduled_tokens.pop(i)
                out.scheduled.pop(i)
                out.new_block_ids.pop(request.request_id, None)
            self.running.remove(request)
            if swap:
                out.swap_out += self.kv.swap_out(request)
            else:
                self.kv.free(request)
                request.num_computed_tokens = 0
            request.status = RequestStatus.PREEMPTED
            self.num_preemptions += 1
        self.waiting.add_preempted(group)
        self._preempted_now = True

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def check_invariants(self) -> None:
        check(self._num_seats() <= self.config.max_num_seqs, "seats exceed max_num_seqs")
        check(all(r.status == RequestStatus.RUNNING for r in self.running), "a running request is not RUNNING")
        waiting = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        check(all(r.status in waiting for r in self.waiting), "a waiting request is neither WAITING nor PREEMPTED")
        self.kv.check_invariants()
