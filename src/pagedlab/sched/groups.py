"""Stage 1: the live request table, and how the children of one request are scheduled (stage 3: by sharing).

Builds on: request.py, sched/beam.py.
Read with: chapters/01-contiguous-static.md, chapters/03-copy-on-write.md.

The scheduler owns one `RequestTable`: the one record of which requests live.
A group is the n children of one user request ("{i}_{id}" when n > 1, as in
vLLM), admitted and preempted as one unit. It is a tuple, held by the table
and by each child (`Request.group`), and never changes. A group leaves the
table when its last child ends; from then on its ids are free again.

How a group's children are scheduled is a policy the stage's preset picks,
two siblings with the same methods: `NoSharing` (stages 1-2) computes every
child on its own; `PromptSharing` (stage 3 on) lets them share the prompt's
blocks and runs beam searches. Each method is one rule of that protocol, and a
fork is a named step (the first of `schedule()`, or a beam search's step in
`update()`), never a side effect of a query:

    step 1   leader (child 0) computes prompt[0 : p-1]; the followers wait (their target: nothing more)
    step 2   fork_ready: every follower gets the leader's table (ref_cnt + 1); each child
             then feeds prompt[p-1] itself and samples its own first token
"""

from __future__ import annotations

from pagedlab.request import Request, RequestStatus
from pagedlab.sched.beam import BeamGroup, is_beam_id
from pagedlab.sched.output import ModelRunnerOutput


class RequestTable:
    """The live groups and beam searches. Invariant: an id belongs to at most one live request (its own,
    a child's "{i}_{id}", or a live beam search's "{id}-beam{k}")."""

    def __init__(self):
        self.live: dict[str, tuple[Request, ...]] = {}  # group id -> its children, in child order
        self.child_ids: dict[str, str] = {}  # "{i}_{id}" of a live n > 1 request -> its group id
        self.beams: dict[str, BeamGroup] = {}  # live beam searches by request id (stage 3)
        self.finished_beams: list[BeamGroup] = []  # beam searches ended since the scheduler last reported

    def add(self, group) -> tuple[Request, ...]:
        group = tuple(group)
        for child in group:
            child.group = group
        self.live[group[0].group_id] = group
        self.child_ids.update((c.request_id, c.group_id) for c in group if c.parent_id is not None)
        return group

    def add_beam_search(self, beams: BeamGroup) -> None:
        self.beams[beams.request_id] = beams

    def owner_of(self, request_id: str) -> str | None:
        """The live request or beam search that `request_id` names (itself, a child, a beam), or None."""
        if request_id in self.live or request_id in self.beams:
            return request_id
        if request_id in self.child_ids:
            return self.child_ids[request_id]
        return next((b for b in self.beams if is_beam_id(request_id, b)), None)

    def all_ids(self) -> list[str]:
        """Every id a live group or child holds (a beam search's beams are not listed: see owner_of)."""
        return [*self.live, *self.child_ids]

    def end(self, request: Request) -> None:
        """`request` has finished: its group leaves the table once every child has; a beam leaves its search."""
        group = self.live.get(request.group_id)
        if group is not None and all(r.status.is_finished() for r in group):
            del self.live[request.group_id]
            for child in group:
                self.child_ids.pop(child.request_id, None)
        beams = self.beams.get(request.group_id)
        if beams is not None and request in beams.live:  # aborted from outside
            beams.live.remove(request)
        if beams is not None and beams.done:
            self.end_beam_search(beams)

    def end_beam_search(self, beams: BeamGroup) -> None:
        if self.beams.pop(beams.request_id, None) is not None:
            self.finished_beams.append(beams)

    def take_finished_beams(self) -> list[BeamGroup]:
        finished, self.finished_beams = self.finished_beams, []
        return finished


class NoSharing:
    """Stages 1-2: every child of a request is computed on its own, from its own prompt; no beam search."""

    supports_beam_search = False  # beams need fork and copy-on-write (stage 3)

    def __init__(self, table: RequestTable):
        self.table = table

    def add(self, group: tuple[Request, ...]) -> None:
        pass

    def target_tokens(self, request: Request) -> int:
        """How many of its tokens `request` may have computed at the end of this step: all of them."""
        return len(request.all_token_ids)

    def waits_for_fork(self, request: Request) -> bool:
        return False

    def fork_ready(self, kv) -> list[Request]:
        """The first step of schedule(): fork the requests that are due (none: nothing is shared)."""
        return []

    def prefill_tokens(self, group) -> int:
        """Tokens the group's first step feeds: each child its own prompt."""
        return sum(r.num_tokens - r.num_computed_tokens for r in group)

    def worst_case(self, group) -> list[Request]:
        """The requests a group may grow into; static admission reserves for all of them."""
        return list(group)

    def seats(self, group) -> int:
        """Running slots the group takes once admitted."""
        return len(group)

    def reserved_seats(self) -> int:
        """Slots promised to running groups beyond their running requests (none)."""
        return 0

    def split_beams(self, out: ModelRunnerOutput) -> tuple[ModelRunnerOutput, dict[str, dict[int, float]]]:
        return out, {}

    def step_beams(self, top: dict, max_model_len: int) -> tuple[list, list[Request]]:
        return [], []


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
    # TASK: the sharing protocol: followers wait, the leader stops one token short, then they fork from it.
    def target_tokens(self, request: Request) -> int:
        """Followers wait for the fork; the leader computes its prompt but the last token, the part they share."""
        family = self.waiting_for_fork.get(request.group_id) if self.waiting_for_fork else None
        if family is None:
            return len(request.all_token_ids)
        if request is not family[0]:
            return request.num_computed_tokens
        return request.num_prompt_tokens - 1

    def waits_for_fork(self, request: Request) -> bool:
        family = self.waiting_for_fork.get(request.group_id)
        return family is not None and request is not family[0]

    def fork_ready(self, kv) -> list[Request]:
        """Fork the followers of every leader whose shared prefill is done, before anyone writes: the blocks
        are shared, not copied. Returns the requests given a table."""
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
