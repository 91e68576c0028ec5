"""Stage 1: static batching: admit a batch by its worst case, run it to completion, then the next.

Builds on: sched/base.py (queues, update, finishing), a KV manager (kv/contiguous.py at stage 1).
Read with: chapters/01-contiguous-static.md.

    step 1        step 2 .. k                      step k+1
    prefill A B C decode A B C, A finishes early   (A's seat stays empty until B and C finish)
                                                   admit D E F ...

A request is admitted only if its worst case fits (prompt + max_tokens for
each of its n children) so the batch can never run out of KV memory midway.
The price: short requests wait for the longest one, and memory is reserved for
tokens that are never generated. Stage 5 (continuous batching) removes both.

Stages 1-4 all use this scheduler; only the KV manager behind it changes, and
from stage 3 the children of a request share their prompt (sched/groups.py).
vLLM never batched statically; this is the paper's Orca-style baseline.
"""

from __future__ import annotations

from pagedlab.errors import InvariantError
from pagedlab.request import Request, RequestStatus
from pagedlab.sched.base import Scheduler
from pagedlab.sched.output import SchedulerOutput


class StaticScheduler(Scheduler):
    """Invariant (beyond the base's): nothing is admitted while a batch is running, and an admitted
    batch's worst case always fits, so allocate_slots never fails mid-batch."""

    def check_admissible(self, group) -> None:
        super().check_admissible(group)
        tokens = self.sharing.prefill_tokens(tuple(group))
        if tokens > self.config.max_num_batched_tokens:  # a static batch prefills in one step
            raise ValueError(
                f"prompt: {tokens} prompt tokens exceed max_num_batched_tokens ({self.config.max_num_batched_tokens})"
            )

    # BEGIN SOLUTION
    # TASK static-schedule (50 pts): static scheduling: admit a whole batch by worst case when none is running, then
    # feed every request.
    def schedule(self) -> SchedulerOutput:
        """One step: _begin_step; when nothing runs, admit a batch (_admit_batch); feed every running request up to
        the sharing's target (allocate_slots, whose None is an InvariantError: worst-case admission guaranteed the
        room), each through _record; _end_step's output."""
        out = self._begin_step()
        if not self.running:
            self._admit_batch(out)
        for request in self.running:
            num_new = self.sharing.target_tokens(request) - request.num_computed_tokens
            if num_new > 0:
                new_blocks = self.kv.allocate_slots(request, num_new)
                if new_blocks is None:
                    raise InvariantError(f"{request.request_id}: no room although worst-case admission guarantees it")
                self._record(request, num_new, new_blocks, out)
        return self._end_step(out)

    def _admit_batch(self, out: SchedulerOutput) -> None:
        """Admit groups in queue order (each through _admit) while the batch still fits: its worst case's seats
        (<= max_num_seqs), its prefill tokens (<= max_num_batched_tokens, summed over the batch) and
        kv.can_admit(worst case, admitted so far); stop at the first group that does not."""
        budget = self.config.max_num_batched_tokens
        admitted: list[Request] = []  # worst case of the batch so far (a beam search counts beam_width times)
        while self.waiting:
            group = self.waiting.peek()
            worst = self.sharing.worst_case(group)
            tokens = self.sharing.prefill_tokens(group)
            if len(admitted) + len(worst) > self.config.max_num_seqs or tokens > budget:
                break
            if not self.kv.can_admit(worst, admitted):
                break
            for request in self.waiting.pop():
                self._admit(request, out)
            admitted += worst
            budget -= tokens

    # END SOLUTION

    def _admit(self, request: Request, out: SchedulerOutput) -> None:
        """Into the batch; its table starts with what the prefix cache holds (stage 4), unless it will fork."""
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        if not self.sharing.waits_for_fork(request):
            request.num_computed_tokens = self.kv.lookup_prefix(request)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = request.num_computed_tokens
        self._send_table(request, out)
