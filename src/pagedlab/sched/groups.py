"""Stage 1: the live request table, and the rule that schedules every child of a request on its own.

Builds on: request.py, sched/beam.py.
Read with: chapters/01-contiguous-static.md, chapters/03-copy-on-write.md.

The scheduler owns one `RequestTable`: the one record of which requests live.
A group is the n children of one user request ("{i}_{id}" when n > 1, as in
vLLM), admitted and preempted as one unit. It is a tuple, held by the table
and by each child (`Request.group`), and never changes. A group leaves the
table when its last child ends; from then on its ids are free again.

How a group's children are scheduled is a policy the stage's preset picks,
two siblings with the same methods: `NoSharing` here (stages 1-2) computes
every child on its own; `PromptSharing` (sched/sharing.py, stage 3 on) lets
them share the prompt's blocks and runs beam searches.
"""

from __future__ import annotations

from pagedlab.request import Request
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
