"""Foundation: what generation returns, shaped like vLLM's `RequestOutput` and `BeamSearchOutput`.

Builds on: nothing.
Read with: chapters/01-contiguous-static.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One of a request's n completions."""

    index: int  # which child (0 .. n-1)
    text: str  # decoded output; EOS and a matched stop string are left out
    token_ids: list[int]  # output tokens; an EOS or stop token id that ended it is included
    cumulative_logprob: float | None  # sum of the chosen tokens' logprobs (raw model distribution)
    logprobs: list[dict[int, float]] | None  # per output token: {token id: logprob} of the top-k and the chosen
    finish_reason: str | None = None  # "stop" | "length" | "abort", None while running

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """Everything known about one request so far (the engine returns one per step per request)."""

    request_id: str  # the id given to add_request
    prompt: str | None  # the prompt text, when it was given as text
    prompt_token_ids: list[int]  # the prompt as the model saw it (with <bos> if the tokenizer adds it)
    outputs: list[CompletionOutput]  # one per child, in child order
    finished: bool = False  # every child has a finish_reason
    metrics: dict = field(default_factory=dict)  # arrival_time, first_token_time, finished_time (seconds)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at its first admission (stage 4+)


@dataclass
class BeamSearchSequence:
    """One finished beam: prompt and output tokens together, as vLLM returns them."""

    tokens: list[int]  # prompt + output tokens
    cum_logprob: float  # sum of the output tokens' logprobs
    text: str | None = None  # decoded output tokens (prompt excluded), when a tokenizer is present
    finish_reason: str | None = None  # "stop" (emitted EOS) | "length"


@dataclass
class BeamSearchOutput:
    """The best `beam_width` sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(tokens: list[int], cum_logprob: float, eos_token_ids: tuple[int, ...], length_penalty: float) -> float:
    """vLLM's beam score: cum_logprob / len ** length_penalty, len counting the prompt but not a final EOS."""
    length = len(tokens) - (1 if tokens and tokens[-1] in eos_token_ids else 0)
    return cum_logprob / (length**length_penalty)
