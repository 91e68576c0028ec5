"""Foundation: what a user asks of one request (`SamplingParams`) or of a beam search (`BeamSearchParams`).

Builds on: nothing.
Read with: chapters/01-contiguous-static.md.

The defaults are vLLM's, field for field, so a script moves between pagedlab
and vLLM unchanged. Invalid values are a ValueError naming the field, raised
when the params are built, long before a request reaches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's output tokens (vLLM's `SamplingParams`)."""

    n: int = 1  # completions per prompt; child i samples with seed + i
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = off
    max_tokens: int | None = 16  # output tokens at most; None = up to max_model_len
    seed: int | None = None  # per-request seed; randomness is keyed on (seed, output position)
    stop: str | list[str] | None = None  # stop strings, excluded from the text
    stop_token_ids: list[int] | None = None  # extra token ids that end the request (kept in token_ids)
    ignore_eos: bool = False  # keep generating past EOS (benchmarks enforce output lengths this way)
    logprobs: int | None = None  # how many top logprobs to return per output token

    def __post_init__(self):
        _check_int(self.n, "n", minimum=1)
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        _check_int(self.top_k, "top_k", minimum=-1)
        if self.max_tokens is not None:
            _check_int(self.max_tokens, "max_tokens", minimum=1)
        if self.seed is not None:
            _check_int(self.seed, "seed", minimum=0)
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", minimum=0)
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"SamplingParams.stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        ids = list(self.stop_token_ids or [])
        for i in ids:
            _check_int(i, "stop_token_ids", minimum=0)
        object.__setattr__(self, "stop_token_ids", ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's `BeamSearchParams`: keep the `beam_width` best sequences by cumulative logprob."""

    beam_width: int  # live beams kept each step
    max_tokens: int  # output tokens at most per beam
    length_penalty: float = 1.0  # final score = cum_logprob / len ** length_penalty (len includes the prompt)
    ignore_eos: bool = False  # if False, a beam that emits EOS is set aside as finished

    def __post_init__(self):
        _check_int(self.beam_width, "beam_width", minimum=1, owner="BeamSearchParams")
        _check_int(self.max_tokens, "max_tokens", minimum=1, owner="BeamSearchParams")
        if not isinstance(self.length_penalty, (int, float)):
            raise ValueError(f"BeamSearchParams.length_penalty must be a number, got {self.length_penalty!r}")


def _check_int(value, name: str, minimum: int, owner: str = "SamplingParams") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an integer >= {minimum}, got {value!r}")
