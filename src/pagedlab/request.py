"""Stage 1: one request's state as the scheduler and KV manager see it (pure Python, no torch).

Builds on: sampling_params.py.
Read with: chapters/01-contiguous-static.md.

A request is a list of token ids that grows. `num_computed_tokens` counts how
many of them already have K/V in the cache; the rest must be fed to the model.
That single number is the only difference between prefill and decode, which
is what lets a later stage mix them in one batch (as vLLM v1 does):

    all_token_ids:  [ p0 p1 p2 p3 p4 | o0 o1 ]      5 prompt + 2 output tokens
                      ^^^^^^^^^^^^^^^^^^^^ ^^
                      computed (K/V cached) new: fed to the model this step
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagedlab.sampling_params import SamplingParams


def max_output_tokens(prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """The output tokens a request may produce: prompt + max_tokens beyond max_model_len caps at the length
    limit (max_tokens=None: up to it)."""
    room = max_model_len - prompt_len
    return room if max_tokens is None else min(max_tokens, room)


class RequestStatus(enum.Enum):
    WAITING = enum.auto()  # queued, holds no KV
    RUNNING = enum.auto()  # admitted, holds KV
    PREEMPTED = enum.auto()  # evicted to make room; waits to run again (stage 5)
    FINISHED_STOPPED = enum.auto()  # EOS, a stop token id or a stop string
    FINISHED_LENGTH_CAPPED = enum.auto()  # max_tokens or max_model_len reached
    FINISHED_ABORTED = enum.auto()  # abort_request

    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True, eq=False)
class Request:
    """A request (or one child of an n > 1 request). Invariant: num_computed_tokens <= num_tokens."""

    request_id: str  # unique in the engine; a child is "{i}_{parent_id}" as in vLLM
    prompt_token_ids: list[int]  # never changes
    sampling_params: SamplingParams  # as given by the user
    max_tokens: int  # output tokens allowed: min(max_tokens, max_model_len - prompt length)
    eos_token_ids: tuple[int, ...] = ()  # model EOS ids (ignored with ignore_eos)
    arrival_time: float = 0.0  # seconds; FCFS order and latency metrics
    priority: int = 0  # lower runs first under the priority policy (stage 5)
    cache_salt: str | None = None  # isolates this request's prefix-cache entries (stage 4)
    parent_id: str | None = None  # the user's request id when this is a child of an n > 1 request
    child_index: int = 0  # i in 0 .. n-1; sampling uses seed + i
    prompt: str | None = None  # the prompt text, when it was given as text
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    all_token_ids: list[int] = field(default_factory=list)  # prompt + output, appended as tokens arrive
    output_logprobs: list[float] = field(default_factory=list)  # logprob of each output token
    cumulative_logprob: float = 0.0  # sum(output_logprobs), kept as tokens arrive
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # when sampling_params.logprobs is set
    block_hashes: list = field(default_factory=list)  # stage 4: chained hash of each full block, as tokens arrive
    num_cached_tokens: int | None = None  # prompt tokens the prefix cache served when first admitted (stage 4)
    first_token_time: float | None = None  # when the first output token was sampled
    finished_time: float | None = None  # when it finished
    group: tuple[Request, ...] = field(default=(), repr=False, compare=False)  # all children of its user request
    group_id: str = field(init=False)  # the id its group shares: the user's request id (parent_id or request_id)
    num_prompt_tokens: int = field(init=False)  # len(prompt_token_ids), which never changes

    def __post_init__(self):
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        self.group_id = self.parent_id or self.request_id
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @classmethod
    def new_group(cls, request_id, token_ids, params, max_tokens, eos_token_ids, arrival, priority, cache_salt, prompt):
        """The n children of one user request; with n > 1 child i is "{i}_{request_id}", as in vLLM.

        A tuple, which every child also holds as `group`: a group's members never change, so every part
        that holds it may share it safely.
        """
        n = params.n
        children = tuple(
            cls(
                request_id if n == 1 else f"{i}_{request_id}",
                token_ids,
                params,
                max_tokens,
                eos_token_ids,
                arrival,
                priority,
                cache_salt,
                parent_id=None if n == 1 else request_id,
                child_index=i,
                prompt=prompt,
            )
            for i in range(n)
        )
        for child in children:
            child.group = children
        return children

    @property
    def seed(self) -> int | None:
        seed = self.sampling_params.seed
        return None if seed is None else seed + self.child_index

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[len(self.prompt_token_ids) :]

    @property
    def max_num_tokens(self) -> int:
        """The longest this request can ever get: the worst case static admission reserves for."""
        return self.num_prompt_tokens + self.max_tokens

    def append_output_token(self, token_id: int, logprob: float) -> None:
        self.all_token_ids.append(token_id)
        self.output_logprobs.append(logprob)
        self.cumulative_logprob += logprob
