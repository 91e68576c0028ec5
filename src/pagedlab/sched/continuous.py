"""Stage 5: continuous batching: one token budget per step, chunked prefill, preemption.

Builds on: sched/base.py (queues, update, finishing), sched/groups.py (sharing), kv/swap.py.
Read with: chapters/05-continuous-batching.md.

Every step the batch is formed anew, as in vLLM v1 (vllm/v1/core/sched/scheduler.py):

    budget = max_num_batched_tokens
    1. running requests, in order: each gets num_tokens - num_computed_tokens new tokens
       (1 for a decode; a prefill chunk capped by long_prefill_token_threshold and the budget).
       No blocks for it?  preempt the lowest-priority running group (FCFS: the newest) and retry;
       if it was the victim itself, go on with the next one (it may fit in the blocks just freed).
       A request alone in the engine is not capped by the threshold: it starves nobody.
    2. waiting groups, in queue order, while budget, max_num_seqs and the KV cache allow,
       counting prefix-cache hits first; a group is admitted only if blocks for its whole
       current length fit (not just its first chunk). Never in a step that preempted.

Prefill and decode differ only in how far num_computed_tokens lags num_tokens,
so one batch mixes them. A preempted request frees its blocks and starts over
(recompute); the prefix cache usually gives most of them back.
"""

from __future__ import annotations

from pagedlab.errors import InvariantError
from pagedlab.request import Request, RequestStatus
from pagedlab.sched.base import Scheduler
from pagedlab.sched.groups import NoSharing
from pagedlab.sched.output import SchedulerOutput


class ContinuousScheduler(Scheduler):
    """Invariants (beyond the base's): a step's tokens <= max_num_batched_tokens; nobody is admitted in a
    step that preempted; a preempted group waits at the front (FCFS) or by its priority."""

    def __init__(self, config, kv_manager, sharing: type = NoSharing):
        super().__init__(config, kv_manager, sharing)
        self._budget = 0  # tokens left in the step being scheduled
        self._threshold = 0  # this step's long_prefill_token_threshold: 0 (no cap) when one request is alone
        self._preempted_now = False  # this step preempted someone: admit nobody

    # BEGIN SOLUTION
    # TASK schedule (40 pts): continuous scheduling: running first under one token budget, preempting when blocks run
    # out,
    # then waiting groups, never in a step that preempted.
    def schedule(self) -> SchedulerOutput:
        """One step: _begin_step; a budget of max_num_batched_tokens; the running requests (_schedule_running);
        then, unless this step preempted, the waiting groups (_schedule_waiting); _end_step's output."""
        out = self._begin_step()
        self._budget, self._preempted_now = self.config.max_num_batched_tokens, False
        self._threshold = self._prefill_threshold()
        self._schedule_running(out)
        if not self._preempted_now:
            self._schedule_waiting(out)
        return self._end_step(out)

    def _schedule_running(self, out: SchedulerOutput) -> None:
        """Each running request in order, while budget is left: its new tokens (within its prompt up to the
        sharing's target, after it every token it lacks; more than one is a chunk, capped by _chunk), its blocks
        from allocate_slots, preempting when the pool is short (_preempt_until_it_fits); stop once the request
        itself was preempted. Each scheduled request joins out.scheduled, num_scheduled_tokens, new_block_ids."""
        running, target, allocate = RequestStatus.RUNNING, self.sharing.target_tokens, self.kv.allocate_slots
        scheduled, num_scheduled, new_block_ids = out.scheduled, out.num_scheduled_tokens, out.new_block_ids
        for request in list(self.running):  # (local names, _record inlined: this runs for every request every step)
            if self._budget <= 0:
                break
            if request.status is not running:
                continue  # preempted earlier in this step
            if request.num_computed_tokens < request.num_prompt_tokens:  # in its prompt: sharing may hold it back
                num_new = target(request) - request.num_computed_tokens
            else:  # past its prompt: every token it has but the cache lacks (1, for a decode)
                num_new = len(request.all_token_ids) - request.num_computed_tokens
            if num_new > 1:  # a prefill chunk (a decode's one token always fits: the budget is > 0)
                num_new = self._chunk(num_new, self._budget)
            elif num_new == 0:
                continue
            new_blocks = allocate(request, num_new)
            if new_blocks is None:
                new_blocks = self._preempt_until_it_fits(request, num_new, out)
                if new_blocks is None:  # the request itself was the victim: it freed its blocks, so those after
                    continue  # it (more urgent, under priority; FCFS preempted them all already) may still fit
            if new_blocks:
                new_block_ids[request.request_id] = new_blocks
            scheduled.append(request)
            num_scheduled[request.request_id] = num_new
            self._budget -= num_new

    def _preempt_until_it_fits(self, request: Request, num_new: int, out: SchedulerOutput) -> list[int] | None:
        """No blocks for `request`: preempt victims until allocate_slots succeeds; None if `request` was one."""
        while (new_blocks := self.kv.allocate_slots(request, num_new)) is None:
            victims = self._victim_group()
            self._preempt(victims, out)
            if request in victims:
                return None
        return new_blocks

    def _schedule_waiting(self, out: SchedulerOutput) -> None:
        """Admit waiting groups in queue order while budget is left and the seats allow (running + seats promised
        to beams + the group's seats <= max_num_seqs); stop at the first group that does not fit (_admit_group:
        head-of-line, the queue's order is the policy)."""
        while self.waiting and self._budget > 0:
            group = self.waiting.peek()
            if len(self.running) + self.sharing.reserved_seats() + self.sharing.seats(group) > self.config.max_num_seqs:
                break
            if not self._admit_group(group, out):
                break  # head-of-line: the queue's order is the policy
            self.waiting.pop()

    # END SOLUTION

    def _prefill_threshold(self) -> int:
        """long_prefill_token_threshold keeps one long prefill from starving the others of the budget; a request
        alone starves nobody, so it gets the whole budget (vLLM's schedule(), since its PR #57951)."""
        alone = len(self.running) + sum(1 for _ in self.waiting) <= 1
        return 0 if alone else self.config.long_prefill_token_threshold

    def _chunk(self, num_new: int, budget: int) -> int:
        """Cap a request's new tokens by this step's long_prefill_token_threshold (0 = no cap) and the budget left."""
        threshold = self._threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return num_new if num_new <= budget else budget

    def _admit_group(self, group: list[Request], out: SchedulerOutput) -> bool:
        """All or nothing: blocks for every member's whole length (less its cache hits) must be free."""
        plan, budget, needed = [], self._budget, 0
        for request in group:
            num_new, hits, blocks = self._plan_admission(request, budget)
            needed += blocks
            budget -= num_new
            plan.append((request, hits, num_new))
        if needed > self.kv.num_free_blocks:
            return False
        for request, hits, _ in plan:  # take every hit before allocating, so that none is evicted meanwhile
            self._admit(request, hits, out)
        for request, _, num_new in plan:
            if num_new:
                new_blocks = self.kv.allocate_slots(request, num_new)
                if new_blocks is None:
                    raise InvariantError(f"{request.request_id}: no room although the group's blocks were counted")
                self._record(request, num_new, new_blocks, out)
                self._budget -= num_new
        return True

    def _plan_admission(self, request: Request, budget: int) -> tuple[int, list, int]:
        """(tokens to feed now, prefix-cache hits, free blocks it takes) for one member of a group."""
        if self.sharing.waits_for_fork(request):
            return 0, [], 0
        target = self.sharing.target_tokens(request)  # a leader still stops one short of its prompt
        if self.kv.is_swapped(request):  # resumes where it stopped, once its blocks are back
            num_new = self._chunk(target - request.num_computed_tokens, budget)
            return num_new, [], self.kv.blocks_to_swap_in(request, num_new)
        hits = self.kv.get_computed_blocks(request)
        hit_tokens = self.kv.num_hit_tokens(hits)
        num_new = self._chunk(target - hit_tokens, budget)
        # Admitted only if blocks for its whole current length fit, not just the first chunk's (vLLM's
        # scheduler_reserve_full_isl): a request admitted on its first chunk alone would soon preempt someone.
        # With a sliding window, blocks behind it are freed as it moves: it never holds more than max_blocks_held.
        # And the chunk itself must fit, uncapped: hits padded with null blocks can outnumber the cap, and the
        # capped count then says 0 although this chunk needs a block (vLLM checks both, in allocate_slots).
        whole = min(request.num_tokens, self.config.max_model_len) - hit_tokens
        blocks = self.kv.admission_blocks(request, hits, num_new, whole, self.config.max_num_batched_tokens)
        return num_new, hits, blocks

    def _admit(self, request: Request, hits: list, out: SchedulerOutput) -> None:
        """From waiting to running: swapped back in, or starting its table with its cache hits."""
        if self.kv.is_swapped(request):
            out.swap_in += self.kv.swap_in(request)
        else:
            request.num_computed_tokens = self.kv.take_hits(request, hits)
            if request.num_cached_tokens is None:  # as vLLM, the hits of its first admission
                request.num_cached_tokens = request.num_computed_tokens
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self._send_table(request, out)

    # BEGIN SOLUTION
    # TASK preempt (25 pts): preempt the policy's victim with its whole group (swap out if asked and it fits, else
    # recompute), refund tokens it was given this step, withdraw any table sent for it this step (a fork's), admit
    # nobody after.
    def _victim_group(self) -> list[Request]:
        """The running members, in running order, of the group of self.policy.victim(self.running)."""
        victim = self.policy.victim(self.running)
        return [r for r in self.running if r.group_id == victim.group_id]

    def _preempt(self, group: list[Request], out: SchedulerOutput) -> None:
        """Preempt every request of `group`: tokens it was given this step are refunded to the budget and it leaves
        out.scheduled, num_scheduled_tokens, new_block_ids and new_block_tables; it leaves `running`; its blocks
        are swapped out (preemption_mode "swap" and kv.can_swap_out(group): out.swap_out gets the pairs) or freed
        with num_computed_tokens reset to 0 (recompute); status PREEMPTED, in out.preempted_req_ids,
        num_preemptions + 1. Then the group waits again (waiting.add_preempted) and nobody is admitted this step."""
        swap = self.config.preemption_mode == "swap" and self.kv.can_swap_out(group)
        for request in group:
            if request.request_id in out.num_scheduled_tokens:  # already given tokens this step: refund them
                self._budget += out.num_scheduled_tokens.pop(request.request_id)
                out.scheduled.remove(request)
                out.new_block_ids.pop(request.request_id, None)
            # A table sent this step (a fork, a resend) is about to be freed: the runner must never install it.
            out.new_block_tables.pop(request.request_id, None)
            self.running.remove(request)
            if swap:
                out.swap_out += self.kv.swap_out(request)
            else:
                self.kv.free(request)
                request.num_computed_tokens = 0
            request.status = RequestStatus.PREEMPTED
            out.preempted_req_ids.add(request.request_id)
            self.num_preemptions += 1
        self.waiting.add_preempted(group)
        self._preempted_now = True

    # END SOLUTION
