"""Stage 1: static batching: admit a batch by its worst case, run it to completion, then the next.

Builds on: request.py, sched/output.py, a KV manager (kv/contiguous.py at stage 1).
Read with: chapters/01-contiguous-static.md.

    step 1        step 2 .. k                      step k+1
    prefill A B C decode A B C, A finishes early   (A's seat stays empty until B and C finish)
                                                   admit D E F ...

A request is admitted only if its worst case fits (prompt + max_tokens for
each of its n children) so the batch can never run out of KV memory midway.
The price: short requests wait for the longest one, and memory is reserved for
tokens that are never generated. Stage 5 (continuous batching) removes both.

Stages 1-4 all use this scheduler; only the KV manager behind it changes.
"""

from __future__ import annotations

from collections import deque

from pagedlab.config import EngineConfig
from pagedlab.errors import InvariantError, check
from pagedlab.request import Request, RequestStatus
from pagedlab.sched.output import ModelRunnerOutput, SchedulerOutput


def check_stop(request: Request, max_model_len: int) -> RequestStatus | None:
    """vLLM's stop rules in its current order (vllm/v1/core/sched/utils.py): EOS, then stop token ids,
    then length. So an EOS sampled as the last allowed token finishes with "stop", not "length"."""
    last = request.all_token_ids[-1]
    params = request.sampling_params
    if (not params.ignore_eos and last in request.eos_token_ids) or last in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if request.num_output_tokens >= request.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None


class StaticScheduler:
    """Invariants: len(running) <= max_num_seqs; a step's tokens <= max_num_batched_tokens;
    nothing is admitted while a batch is running."""

    supports_beam_search = False  # beams need fork / copy-on-write (stage 3)
    num_preemptions = 0  # static admission never preempts (stage 5 does)

    def __init__(self, config: EngineConfig, kv_manager):
        self.config = config
        self.kv = kv_manager
        self.waiting: deque[Request] = deque()  # FCFS; the children of a group are adjacent
        self.running: list[Request] = []  # the current batch
        self.finished_req_ids: set[str] = set()  # ended since the last schedule()

    def check_admissible(self, group: list[Request]) -> None:
        """A group that could never be admitted is a ValueError now, not a request waiting forever."""
        prompt_tokens = self._prefill_tokens(group)
        if len(group) > self.config.max_num_seqs:
            raise ValueError(f"n: {len(group)} children exceed max_num_seqs ({self.config.max_num_seqs})")
        if prompt_tokens > self.config.max_num_batched_tokens:
            raise ValueError(
                f"prompt: {prompt_tokens} prompt tokens exceed max_num_batched_tokens "
                f"({self.config.max_num_batched_tokens})"
            )
        if not self.kv.can_ever_admit(group):
            raise ValueError(
                f"num_kv_blocks: {self.config.num_kv_blocks} blocks can never hold this request's worst case "
                f"(what the KV manager reserves for each of its {len(group)} children)"
            )

    def add_request(self, group: list[Request]) -> None:
        self.waiting.extend(group)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # BEGIN SOLUTION
    # TASK: static scheduling: admit a whole batch by worst case when none is running, then feed every request.
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput([], [], finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        if not self.running:
            self._admit_batch()
        for request in list(self.running):
            num_new = self._num_new_tokens(request)
            if num_new > 0:
                self._schedule_request(request, num_new, out)
        out.block_copies = self.kv.take_block_copies()
        return out

    def _schedule_request(self, request: Request, num_new: int, out: SchedulerOutput) -> None:
        if self.kv.allocate_slots(request, num_new) is None:
            raise InvariantError(f"{request.request_id}: no room although worst-case admission guarantees it")
        update = self.kv.table_update(request)
        if update is not None:
            out.new_block_ids[request.request_id] = update
        out.scheduled.append(request)
        out.num_scheduled_tokens.append(num_new)

    def _admit_batch(self) -> None:
        """Admit groups FCFS while the batch's worst case (every seat, every block) still fits."""
        budget = self.config.max_num_batched_tokens
        admitted: list[Request] = []  # worst case of the batch so far (a beam group counts beam_width times)
        while self.waiting:
            group = self._next_group()
            worst = self._worst_case(group)
            tokens = self._prefill_tokens(group)
            if len(admitted) + len(worst) > self.config.max_num_seqs or tokens > budget:
                break
            if not self.kv.can_admit(worst, admitted):
                break
            for request in group:
                self.waiting.popleft()
                self._admit(request)
            admitted += worst
            budget -= tokens

    # END SOLUTION

    def _admit(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        request.num_computed_tokens = self._prefix_hit_tokens(request)
        if request.num_cached_tokens is None:
            request.num_cached_tokens = request.num_computed_tokens

    def _prefix_hit_tokens(self, request: Request) -> int:
        """Tokens whose K/V the prefix cache already holds (stage 4); 0 before."""
        return self.kv.lookup_prefix(request)

    def _num_new_tokens(self, request: Request) -> int:
        """Static batching feeds every running request all its known tokens (the prompt, then 1)."""
        return request.num_tokens - request.num_computed_tokens

    def _prefill_tokens(self, group: list[Request]) -> int:
        """Tokens the group's first step feeds (the whole batch's prompts must fit one step)."""
        return sum(r.num_tokens - r.num_computed_tokens for r in group)

    def _worst_case(self, group: list[Request]) -> list[Request]:
        """The requests a group may grow into; admission reserves for all of them."""
        return group

    def _next_group(self) -> list[Request]:
        """The first waiting request and its siblings (an n > 1 request is admitted as one unit)."""
        group_id = self.waiting[0].group_id
        group = []
        for request in self.waiting:
            if request.group_id != group_id:
                break
            group.append(request)
        return group

    def update(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> list[Request]:
        """Advance every scheduled request; append sampled tokens; finish those that stop.

        Returns the requests that sampled a token (finished ones included).
        """
        for request, num in zip(scheduler_output.scheduled, scheduler_output.num_scheduled_tokens):
            request.num_computed_tokens += num
        by_id = {r.request_id: r for r in scheduler_output.scheduled}
        advanced = []
        for i, req_id in enumerate(runner_output.req_ids):
            request = by_id[req_id]
            request.append_output_token(runner_output.token_ids[i], runner_output.logprobs[i])
            if runner_output.top_logprobs[i] is not None:
                request.top_logprobs.append(runner_output.top_logprobs[i])
            status = check_stop(request, self.config.max_model_len)
            if status is not None:
                self._finish(request, status)
            advanced.append(request)
        return advanced

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]:
        """End requests from outside (abort, a stop string); returns those that were still alive."""
        ids = set(request_ids)
        ended = [r for r in list(self.waiting) + self.running if r.request_id in ids]
        for request in ended:
            self._finish(request, status)
        return ended

    def _finish(self, request: Request, status: RequestStatus) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        self.kv.free(request)
        self.finished_req_ids.add(request.request_id)

    def check_invariants(self) -> None:
        check(len(self.running) <= self.config.max_num_seqs, "running exceeds max_num_seqs")
        check(all(r.status == RequestStatus.RUNNING for r in self.running), "a running request is not RUNNING")
        check(all(r.status == RequestStatus.WAITING for r in self.waiting), "a waiting request is not WAITING")
        self.kv.check_invariants()
