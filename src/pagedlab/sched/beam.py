"""Stage 3: one beam search, run by the engine step by step on top of fork and copy-on-write.

Builds on: request.py, outputs.py (beam_score).
Read with: chapters/03-copy-on-write.md.

Each step every live beam proposes its 2 * beam_width most likely next tokens
(the runner returns them as top logprobs). A candidate ending in EOS is set
aside as a finished sequence and takes no live slot; the best `beam_width` of
the rest by cumulative logprob stay live. A beam chosen once continues in
place; chosen again, it is forked (its blocks shared, ref_cnt + 1); never
chosen, it is dropped and its blocks freed:

    step t:   b0 -> (b0,"a") (b0,"e")      b1 -> (b1,"o")      b2 -> nothing kept
    step t+1: b0 continues with "a", fork b3 = b0 + "e", b1 + "o", b2 freed

Same rules as `oracle.beam_search`, which checks it. vLLM: BeamSearchOfflineMixin.beam_search in
vllm/entrypoints/generate/beam_search/offline.py;
in v0.10.2 vllm/beam_search.py, whose v0 engine ran beams in the block manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedlab.outputs import BeamSearchSequence, beam_score
from pagedlab.request import Request, RequestStatus
from pagedlab.sampling_params import BeamSearchParams, SamplingParams


def beam_request_id(request_id: str, k: int) -> str:
    """The id of beam k of search `request_id`; ids of this shape are reserved while the search runs."""
    return f"{request_id}-beam{k}"


def is_beam_id(request_id: str, search_id: str) -> bool:
    """Whether `request_id` has the shape of a beam id of search `search_id` ("{search_id}-beam{k}")."""
    prefix = f"{search_id}-beam"
    return request_id.startswith(prefix) and request_id[len(prefix) :].isdigit()


@dataclass
class BeamGroup:
    """A beam search in flight. Invariant: len(live) <= beam_width; live is in rank order."""

    request_id: str  # the user's id
    params: BeamSearchParams  # width, max_tokens, length penalty, ignore_eos
    live: list[Request]  # beams still growing, best first
    max_steps: int  # output tokens at most (max_tokens capped by max_model_len)
    finished: list[BeamSearchSequence] = field(default_factory=list)  # set aside (EOS) or ended at length
    steps: int = 0  # expansion steps done
    num_beams_made: int = 1  # ids handed out so far ("{request_id}-beam{k}")
    num_prompt_tokens: int = 0  # set from the first beam
    pending: dict = field(default_factory=dict)  # beam id -> top logprobs sampled, until every live beam has them

    def __post_init__(self):
        self.num_prompt_tokens = self.live[0].num_prompt_tokens

    @classmethod
    def start(cls, request_id, token_ids, params, max_steps, eos_token_ids, arrival, prompt) -> BeamGroup:
        """A new search: one beam holding the prompt, asking for 2 * beam_width candidates each step."""
        k = 2 * params.beam_width
        sampling = SamplingParams(temperature=0.0, max_tokens=max_steps, ignore_eos=True, logprobs=k)
        first = Request(
            beam_request_id(request_id, 0),
            token_ids,
            sampling,
            max_steps,
            eos_token_ids,
            arrival,
            parent_id=request_id,
            prompt=prompt,
        )
        return cls(request_id, params, [first], max_steps)

    @property
    def width(self) -> int:
        return self.params.beam_width

    @property
    def done(self) -> bool:
        return not self.live

    # BEGIN SOLUTION
    # TASK beam-step (35 pts): one beam-search step: expand, set EOS candidates aside, keep the best, fork or drop the
    # beams.
    def step(self, top: dict[str, dict[int, float]], max_model_len: int) -> tuple[list, list[Request]]:
        """One step. top[beam id] = {token: logprob} for each live beam, best first. Of each beam's first
        2 * width candidates, one ending in EOS (unless ignore_eos) is set aside in `finished` as
        BeamSearchSequence(tokens + [eos], cum logprob, None, "stop"); of the rest, the best `width` by cumulative
        logprob stay (ties: in candidate order). A beam kept once grows in place; kept again, it is forked first
        (_clone, before any beam grows); never kept, it is dropped (status FINISHED_STOPPED). After max_steps
        steps every live beam is finished ("length") and dropped. `live` becomes the kept beams, best first.
        Returns (forks as (parent, new beam), beams to free)."""
        candidates = []
        for beam in self.live:
            cum = sum(beam.output_logprobs)
            for token, lp in list(top[beam.request_id].items())[: 2 * self.width]:
                if token in beam.eos_token_ids and not self.params.ignore_eos:
                    self.finished.append(BeamSearchSequence(beam.all_token_ids + [token], cum + lp, None, "stop"))
                else:
                    candidates.append((beam, token, cum + lp, lp))
        keep = sorted(candidates, key=lambda c: c[2], reverse=True)[: self.width]
        plan, forks, used = [], [], set()
        for beam, token, _, lp in keep:
            target = beam if beam.request_id not in used else self._clone(beam)
            if target is not beam:
                forks.append((beam, target))
            used.add(beam.request_id)
            plan.append((target, token, lp))
        dropped = [b for b in self.live if b.request_id not in used]
        for target, token, lp in plan:  # after cloning: a fork copies its parent before the parent grows
            target.append_output_token(token, lp)
        self.live = [target for target, _, _ in plan]
        self.steps += 1
        if self.steps >= self.max_steps:
            self.finished += [
                BeamSearchSequence(list(b.all_token_ids), sum(b.output_logprobs), None, "length") for b in self.live
            ]
            dropped, self.live = dropped + self.live, []
        for beam in dropped:
            beam.status = RequestStatus.FINISHED_STOPPED
        return forks, dropped

    # END SOLUTION

    def _clone(self, beam: Request) -> Request:
        child = Request(
            beam_request_id(self.request_id, self.num_beams_made),
            beam.prompt_token_ids,
            beam.sampling_params,
            beam.max_tokens,
            beam.eos_token_ids,
            beam.arrival_time,
            parent_id=self.request_id,
            prompt=beam.prompt,
            status=RequestStatus.RUNNING,
            num_computed_tokens=beam.num_computed_tokens,
            all_token_ids=list(beam.all_token_ids),
            output_logprobs=list(beam.output_logprobs),
            cumulative_logprob=beam.cumulative_logprob,
        )
        self.num_beams_made += 1
        return child

    def best(self, eos_token_ids: tuple[int, ...]) -> list[BeamSearchSequence]:
        """The best beam_width sequences by length-penalized score, best first."""
        score = lambda s: beam_score(s.tokens, s.cum_logprob, eos_token_ids, self.params.length_penalty)
        return sorted(self.finished, key=score, reverse=True)[: self.width]
