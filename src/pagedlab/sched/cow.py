"""Stage 3: static batching over shared blocks: parallel sampling (n > 1) and beam search.

Builds on: sched/static.py, kv/cow.py (fork, copy-on-write), sched/beam.py.
Read with: chapters/03-copy-on-write.md.

Parallel sampling. The n children of a request have the same prompt, so the
first child (the leader) prefills it once, all but its last token; then the
others fork from it and every child feeds that last token itself and samples
its own first output token with its own seed:

    step 1   leader: prompt[0 : p-1]            (one prefill)
    step 2   fork -> every child feeds prompt[p-1], samples token 0 (CoW of the partly filled block)
    step 3+  each child decodes on its own, sharing every full prompt block

Beam search (as vLLM v0 ran it, on top of fork / CoW) is delegated to
`BeamGroup` in sched/beam.py; this scheduler routes each step's logprobs to it
and admits the group by its worst case, beam_width requests sharing the
prompt's full blocks (`CowKVCacheManager.worst_case_blocks`).
"""

from __future__ import annotations

from pagedlab.request import Request
from pagedlab.sched.beam import BeamGroup
from pagedlab.sched.output import ModelRunnerOutput, SchedulerOutput
from pagedlab.sched.static import StaticScheduler


class CowScheduler(StaticScheduler):
    supports_beam_search = True

    def __init__(self, config, kv_manager):
        super().__init__(config, kv_manager)
        self.families: dict[str, list[Request]] = {}  # n > 1 group id -> its children, leader first
        self.forked: set[str] = set()  # followers already forked from their leader (on their own since)
        self.beam_groups: dict[str, BeamGroup] = {}  # group id -> live beam search
        self.finished_beam_groups: list[BeamGroup] = []  # ended since the engine last looked

    def add_request(self, group: list[Request]) -> None:
        if len(group) > 1:
            self.families[group[0].group_id] = group
        super().add_request(group)

    def add_beam_group(self, beam_group: BeamGroup) -> None:
        self.beam_groups[beam_group.request_id] = beam_group
        super().add_request(beam_group.live)

    # BEGIN SOLUTION
    # TASK: parallel sampling over shared blocks: the leader prefills once, the others fork from it.
    def _num_new_tokens(self, request: Request) -> int:
        family = self.families.get(request.group_id)
        shared = request.num_prompt_tokens - 1
        if family is None or shared == 0 or request.request_id in self.forked:
            return super()._num_new_tokens(request)  # on its own (a forked child is, from then on)
        leader = family[0]
        if request is not leader:
            return 0  # waits for the leader's prefill, then is forked from it
        if leader.num_computed_tokens < shared:
            return shared - leader.num_computed_tokens  # the one shared prefill
        for follower in family[1:]:  # fork before anyone writes, so blocks are shared, not copied
            if follower.request_id not in self.forked and not follower.status.is_finished():
                self.kv.fork(leader, follower)
                follower.num_computed_tokens = shared
                self.forked.add(follower.request_id)
        return super()._num_new_tokens(leader)

    # END SOLUTION

    def _prefix_hit_tokens(self, request: Request) -> int:
        family = self.families.get(request.group_id)
        if family is not None and request is not family[0] and request.request_id not in self.forked:
            return 0  # followers fork from the leader instead of looking up the cache
        return super()._prefix_hit_tokens(request)

    def _prefill_tokens(self, group: list[Request]) -> int:
        """An n > 1 group prefills its prompt once (the leader), then one token per child."""
        if len(group) > 1 and group[0].num_computed_tokens == 0:
            return group[0].num_prompt_tokens + len(group) - 1
        return super()._prefill_tokens(group)

    def _worst_case(self, group: list[Request]) -> list[Request]:
        beams = self.beam_groups.get(group[0].group_id)
        return group * beams.width if beams is not None else group

    def update(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> list[Request]:
        beam_ids = {r.request_id for g in self.beam_groups.values() for r in g.live}
        plain, beams = _split(runner_output, beam_ids)
        advanced = super().update(scheduler_output, plain)
        for group in list(self.beam_groups.values()):
            self._step_beams(group, beams)
        return advanced

    def _step_beams(self, group: BeamGroup, beams: dict[str, dict[int, float]]) -> None:
        live = {b.request_id for b in group.live}
        group.pending.update({req_id: top for req_id, top in beams.items() if req_id in live})
        if not live <= group.pending.keys():
            return  # some live beam has not sampled yet (a later stage may split them across steps)
        top, group.pending = group.pending, {}
        forks, dropped = group.step(top, self.config.max_model_len)
        for parent, child in forks:
            self.kv.fork(parent, child)
            self.running.append(child)
        for beam in dropped:
            self._finish(beam, beam.status)
        if group.done:
            del self.beam_groups[group.request_id]
            self.finished_beam_groups.append(group)

    def _finish(self, request: Request, status) -> None:
        super()._finish(request, status)
        family = self.families.get(request.group_id)
        if family is not None and all(r.status.is_finished() for r in family):
            del self.families[request.group_id]
            self.forked.difference_update(r.request_id for r in family)
        beams = self.beam_groups.get(request.group_id)
        if beams is not None and request in beams.live:  # aborted from outside
            beams.live.remove(request)
            if beams.done:
                del self.beam_groups[request.group_id]
                self.finished_beam_groups.append(beams)


def _split(out: ModelRunnerOutput, beam_ids: set[str]) -> tuple[ModelRunnerOutput, dict[str, dict[int, float]]]:
    """Separate ordinary samples from beams' top logprobs."""
    plain = ModelRunnerOutput()
    beams: dict[str, dict[int, float]] = {}
    for i, req_id in enumerate(out.req_ids):
        if req_id in beam_ids:
            beams[req_id] = out.top_logprobs[i]
        else:
            plain.req_ids.append(req_id)
            plain.token_ids.append(out.token_ids[i])
            plain.logprobs.append(out.logprobs[i])
            plain.top_logprobs.append(out.top_logprobs[i])
    return plain, beams
