"""Stage 3: the children of an n > 1 request share their prompt's blocks through fork; beam searches.

Builds on: sched/groups.py (the live request table; NoSharing, the rule this one replaces), kv/cow.py (fork).
Read with: chapters/03-copy-on-write.md.

The children of a request have the same prompt, so the first child (the
leader) computes it once, all but its last token; the others wait, then fork
from it and each feeds that last token itself, sampling its own first output
token with its own seed. Each method below is one rule of that protocol, with
the same names as NoSharing's, and a fork is a named step (the first of
`schedule()`, or a beam search's step in `update()`), never a side effect of a
question such as "how many tokens may this request take":

    step 1   leader: prompt[0 : p-1]; the followers wait (their target: nothing more)
    step 2   fork_ready: every follower gets the leader's table (ref_cnt + 1); each child
             feeds prompt[p-1] itself (copy-on-write of the partly filled block)
    step 3+  each child decodes on its own, sharing every full prompt block

Beam searches (as vLLM v0 ran them, on top of fork and copy-on-write) are
stepped here too: `split_beams` takes the beams' top logprobs out of a step's
samples, `step_beams` lets each search choose (sched/beam.py), and the
scheduler forks the new beams and frees the dropped ones.
vLLM v0.10.2: vllm/core/scheduler.py, vllm/core/block_manager.py (fork); v1 runs n > 1 as separate requests.
"""

from __future__ import annotations

from pagedlab.request import Request, RequestStatus
from pagedlab.sched.groups import RequestTable
from pagedlab.sched.output import ModelRunnerOutput


class PromptSharing:
    """Stage 3: the children of an n > 1 request share the prompt's blocks through fork; beam searches.

    Invariant: a group id is in `waiting_for_fork` until its leader's shared prefill is done and its
    followers are forked (or the group has ended)."""

    supports_beam_search = True

    def __init__(self, table: RequestTable):
        self.table = table
        self.waiting_for_fork: dict[str, tuple[Request, ...]] = {}  # group id -> family whose followers wait

    def add(self, group: tuple[Request, ...]) -> None:
        if len(group) > 1 and group[0].num_prompt_tokens > 1:  # a 1-token prompt has nothing to share
            self.waiting_for_fork[group[0].group_id] = group

    # BEGIN SOLUTION
    # TASK n-sharing (30 pts): the sharing protocol: followers wait, the leader stops one token short, then they fork
    # from it.
    def target_tokens(self, request: Request) -> int:
        """The tokens `request` should have computed after this step: all its tokens, except in a family still
        waiting for its fork (waiting_for_fork), where the leader (family[0]) stops at its prompt but the last
        token (the part the family shares) and a follower stays where it is."""
        family = self.waiting_for_fork.get(request.group_id) if self.waiting_for_fork else None
        if family is None:
            return len(request.all_token_ids)
        if request is not family[0]:
            return request.num_computed_tokens
        return request.num_prompt_tokens - 1

    def waits_for_fork(self, request: Request) -> bool:
        """True for a follower (not the leader) of a family in waiting_for_fork: it takes no tokens, no blocks."""
        family = self.waiting_for_fork.get(request.group_id)
        return family is not None and request is not family[0]

    def fork_ready(self, kv) -> list[Request]:
        """For every family whose leader is RUNNING with its shared prefill done (num_prompt_tokens - 1 computed),
        fork each follower from it (kv.fork; num_computed_tokens copied) and forget the family; a family whose group
        ended (no longer in table.live) is forgotten unforked. Returns the followers given a table, in order."""
        forked = []
        for group_id, family in list(self.waiting_for_fork.items()):
            leader = family[0]
            if group_id not in self.table.live:  # ended (aborted) before its fork
                del self.waiting_for_fork[group_id]
            elif leader.status == RequestStatus.RUNNING and leader.num_computed_tokens == leader.num_prompt_tokens - 1:
                for follower in family[1:]:
                    kv.fork(leader, follower)
                    follower.num_computed_tokens = leader.num_computed_tokens
                    forked.append(follower)
                del self.waiting_for_fork[group_id]
        return forked

    # END SOLUTION

    def prefill_tokens(self, group) -> int:
        """An n > 1 group prefills its prompt once (the leader), then one token per child."""
        first = group[0]
        if first.group_id in self.waiting_for_fork and first.num_computed_tokens == 0:
            return first.num_prompt_tokens + len(group) - 1
        return sum(r.num_tokens - r.num_computed_tokens for r in group)

    def worst_case(self, group) -> list[Request]:
        """A beam search may grow into beam_width beams, each its first beam's worst case."""
        beams = self.table.beams.get(group[0].group_id)
        return list(group) * beams.width if beams is not None else list(group)

    def seats(self, group) -> int:
        beams = self.table.beams.get(group[0].group_id)
        return beams.width if beams is not None else len(group)

    def reserved_seats(self) -> int:
        """The beams a running beam search may still fork."""
        running = (b for b in self.table.beams.values() if b.live and b.live[0].status == RequestStatus.RUNNING)
        return sum(b.width - len(b.live) for b in running)

    # --- beam searches, stepped in update() -----------------------------------------------------------

    def split_beams(self, out: ModelRunnerOutput) -> tuple[ModelRunnerOutput, dict[str, dict[int, float]]]:
        """Separate ordinary samples from the beams' top logprobs."""
        if not self.table.beams:
            return out, {}
        beam_ids = {r.request_id for b in self.table.beams.values() for r in b.live}
        plain, top = ModelRunnerOutput(), {}
        for req_id, token, logprob, tops in zip(out.req_ids, out.token_ids, out.logprobs, out.top_logprobs):
            if req_id in beam_ids:
                top[req_id] = tops
            else:
                plain.req_ids.append(req_id)
                plain.token_ids.append(token)
                plain.logprobs.append(logprob)
                plain.top_logprobs.append(tops)
        return plain, top

    def step_beams(self, top: dict[str, dict[int, float]], max_model_len: int) -> tuple[list, list[Request]]:
        """Expand every search whose live beams have all sampled: (forks as (parent, new beam); beams to free)."""
        forks, dropped = [], []
        for beams in list(self.table.beams.values()):
            live = {b.request_id for b in beams.live}
            beams.pending.update({req_id: t for req_id, t in top.items() if req_id in live})
            if not live or not live <= beams.pending.keys():
                continue  # some live beam has not sampled yet (a chunked or preempted one)
            sampled, beams.pending = beams.pending, {}
            step_forks, gone = beams.step(sampled, max_model_len)
            dropped += gone
            if beams.done:  # it ended at its length: the new beams were set aside as finished sequences
                self.table.end_beam_search(beams)
            else:
                forks += step_forks
        return forks, dropped
