"""Stage 1: what every scheduler shares: the queues, update() after the forward pass, stop checks, finishing.

Builds on: request.py, sched/groups.py, sched/queue.py, sched/output.py, a KV manager.
Read with: chapters/01-contiguous-static.md, chapters/05-continuous-batching.md.

A scheduler answers one question per step, `schedule()`: who runs and with
how many tokens. Static batching (sched/static.py) and continuous batching
(sched/continuous.py) answer it differently, as two siblings of this class;
everything else is the same for both and lives here:

    add_request      a group joins `waiting`, and the live table (`requests`)
    update           after the forward pass: num_computed_tokens, sampled tokens, stop checks, beams
    finish_requests  abort, or a stop string the engine found: end requests now and free their KV
    check_invariants what every step must leave true

`_record` is how either schedule() puts a request in the batch, with the blocks
allocate_slots appended; a table made outside allocate_slots (at admission, at
a fork) is sent whole as it is made (`_send_table`). That is all the runner
needs to keep its copy of every table (sched/output.py).
vLLM: vllm/v1/core/sched/scheduler.py (update_from_output, finish_requests), vllm/v1/core/sched/utils.py.
"""

from __future__ import annotations

from pagedlab.config import EngineConfig
from pagedlab.errors import InvariantError, check
from pagedlab.request import Request, RequestStatus
from pagedlab.sched.beam import BeamGroup
from pagedlab.sched.groups import NoSharing, RequestTable
from pagedlab.sched.output import ModelRunnerOutput, SchedulerOutput, SchedulerUpdate
from pagedlab.sched.policies import POLICIES


def check_stop(request: Request, max_model_len: int) -> RequestStatus | None:
    """vLLM's stop rules in its current order (vllm/v1/core/sched/utils.py): EOS, then stop token ids,
    then length. So an EOS sampled as the last allowed token finishes with "stop", not "length"."""
    tokens, params = request.all_token_ids, request.sampling_params
    last = tokens[-1]
    if (last in request.eos_token_ids and not params.ignore_eos) or last in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED
    if len(tokens) - request.num_prompt_tokens >= request.max_tokens or len(tokens) >= max_model_len:
        return RequestStatus.FINISHED_LENGTH_CAPPED
    return None


class Scheduler:
    """Invariants: len(running) plus the seats promised to beam searches <= max_num_seqs; a running request is
    RUNNING and holds KV, a waiting one holds none unless swapped out; every block is freed exactly once."""

    def __init__(self, config: EngineConfig, kv_manager, sharing: type = NoSharing):
        self.config = config
        self.kv = kv_manager
        self.requests = RequestTable()  # every live group and beam search
        self.sharing = sharing(self.requests)  # how a group's children are scheduled (stage 3: they share)
        self.policy = POLICIES[config.scheduling_policy]  # the waiting queue's order and the victim rule
        self.waiting = self.policy.queue()  # groups, in the order they will be admitted
        self.running: list[Request] = []  # admitted requests holding KV, in admission order
        self.finished_req_ids: set[str] = set()  # ended since the last schedule(); the runner drops them
        self.num_preemptions = 0  # requests preempted so far (stage 5)
        self._unsent_tables: list[Request] = []  # tables made by update() (beam forks), for the next step's output

    @property
    def supports_beam_search(self) -> bool:
        return self.sharing.supports_beam_search

    def add_request(self, group) -> None:
        group = self.requests.add(group)
        self.sharing.add(group)
        self.waiting.add(group)

    def add_beam_search(self, beams: BeamGroup) -> None:
        self.requests.add_beam_search(beams)
        self.waiting.add(beams.live)

    def check_admissible(self, group) -> None:
        """A group that could never be admitted is a ValueError now, not a request waiting forever."""
        if len(group) > self.config.max_num_seqs:
            raise ValueError(f"n: {len(group)} children exceed max_num_seqs ({self.config.max_num_seqs})")
        if not self.kv.can_ever_admit(list(group)):
            raise ValueError(
                f"num_kv_blocks: {self.config.num_kv_blocks} blocks can never hold this request's worst case "
                f"(prompt + max_tokens for each of its {len(group)} children)"
            )

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def schedule(self) -> SchedulerOutput:
        raise NotImplementedError  # static batching and continuous batching differ exactly here

    def _begin_step(self) -> SchedulerOutput:
        """A step's output, starting with the ids ended since the last step and the forks due now."""
        out = SchedulerOutput(finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        for request in self._unsent_tables + self.sharing.fork_ready(self.kv):
            self._send_table(request, out)
        self._unsent_tables = []
        return out

    def _send_table(self, request: Request, out: SchedulerOutput) -> None:
        """A table made outside allocate_slots (prefix-cache hits at admission, a swap-in, a fork) goes to the
        runner whole; an empty one needs no message (the runner starts a request it does not know empty)."""
        block_ids = self.kv.get_block_ids(request)  # (a hybrid model's: one list per group, kv/hybrid.py)
        has_blocks = any(block_ids) if isinstance(block_ids, tuple) else bool(block_ids)
        if has_blocks and not request.status.is_finished():
            out.new_block_tables[request.request_id] = block_ids

    def _record(self, request: Request, num_new: int, new_blocks: list[int], out: SchedulerOutput) -> None:
        """Put `request` in the batch with `num_new` tokens; `new_blocks`: what allocate_slots just appended."""
        if new_blocks:
            out.new_block_ids[request.request_id] = new_blocks
        out.scheduled.append(request)
        out.num_scheduled_tokens[request.request_id] = num_new

    def _end_step(self, out: SchedulerOutput) -> SchedulerOutput:
        out.block_copies = self.kv.take_block_copies()
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        if out.total_num_scheduled_tokens > self.config.max_num_batched_tokens:
            raise InvariantError(f"{out.total_num_scheduled_tokens} tokens scheduled: the token budget is exceeded")
        if out.preempted_req_ids:
            sent = out.num_scheduled_tokens.keys() | out.new_block_tables.keys() | out.new_block_ids.keys()
            sent |= {c.request_id for c in out.block_copies}
            if sent & out.preempted_req_ids:
                raise InvariantError(f"{sorted(sent & out.preempted_req_ids)}: preempted, yet sent to the runner")
        return out

    def update(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> SchedulerUpdate:
        """Advance every scheduled request; append sampled tokens; finish those that stop; step beam searches."""
        num_scheduled, by_id = scheduler_output.num_scheduled_tokens, {}
        for request in scheduler_output.scheduled:
            request.num_computed_tokens += num_scheduled[request.request_id]
            by_id[request.request_id] = request
        plain, beam_top = self.sharing.split_beams(runner_output)
        max_model_len, advanced = self.config.max_model_len, []
        for req_id, token, logprob, top in zip(plain.req_ids, plain.token_ids, plain.logprobs, plain.top_logprobs):
            request = by_id[req_id]
            request.all_token_ids.append(token)  # Request.append_output_token, inlined: this runs for every
            request.output_logprobs.append(logprob)  # request at every step
            request.cumulative_logprob += logprob
            if top is not None:
                request.top_logprobs.append(top)
            status = check_stop(request, max_model_len)
            if status is not None:
                self._finish(request, status)
            advanced.append(request)
        if beam_top:
            self._step_beams(beam_top)
        return SchedulerUpdate(advanced, self.requests.take_finished_beams())

    def _step_beams(self, top: dict[str, dict[int, float]]) -> None:
        """A new beam forks from its parent (their blocks shared) and joins `running`; dropped beams are freed."""
        forks, dropped = self.sharing.step_beams(top, self.config.max_model_len)
        for parent, child in forks:
            self.kv.fork(parent, child)
            self.running.append(child)
            self._unsent_tables.append(child)
        for beam in dropped:
            self._finish(beam, beam.status)

    def finish_requests(self, request_ids, status: RequestStatus) -> list[Request]:
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
        self.requests.end(request)

    def check_invariants(self) -> None:
        seats = len(self.running) + self.sharing.reserved_seats()
        check(seats <= self.config.max_num_seqs, "running requests (and seats promised to beams) exceed max_num_seqs")
        check(all(r.status == RequestStatus.RUNNING for r in self.running), "a running request is not RUNNING")
        waiting = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        check(all(r.status in waiting for r in self.waiting), "a waiting request is neither WAITING nor PREEMPTED")
        live = {r.request_id for group in self.requests.live.values() for r in group if not r.status.is_finished()}
        queued = {r.request_id for r in self.running} | {r.request_id for r in self.waiting}
        check(live <= queued, "a live request is neither running nor waiting")
        self.kv.check_invariants()
