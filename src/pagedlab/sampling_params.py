"""Foundation: what a user asks of one request (`SamplingParams`) or of a beam search (`BeamSearchParams`).

Builds on: nothing.
Read with: chapters/01-contiguous-static.md.

The defaults are vLLM's, field for field, so a script moves between pagedlab
and vLLM unchanged. Invalid values are a ValueError naming the field, raised
when the params are built, long before a request reaches the engine; the checks
that need the model (stop token ids inside the vocabulary, logprobs within
`max_logprobs`) are the engine's, at `add_request` (engine/validation.py).

Temperature follows vLLM's thresholds: below 1e-5 is greedy (argmax), and a
positive value below 1e-2 is raised to 1e-2 with a warning, since dividing the
logits by a tiny number overflows to inf and the softmax to NaN. NaN and
infinite values are refused outright.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

_SAMPLING_EPS = 1e-5  # vLLM: a temperature below this is greedy
_MAX_TEMP = 1e-2  # vLLM: a smaller positive temperature is raised to this (its softmax would overflow)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's output tokens (vLLM's `SamplingParams`)."""

    n: int = 1  # completions per prompt; child i samples with seed + i
    temperature: float = 1.0  # below 1e-5 (0, say) = greedy; in [1e-5, 1e-2) raised to 1e-2, as vLLM
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = off
    max_tokens: int | None = 16  # output tokens at most; None = up to max_model_len
    seed: int | None = None  # per-request seed; randomness is keyed on (seed, output position)
    stop: str | list[str] | None = None  # stop strings, excluded from the text
    stop_token_ids: list[int] | None = None  # extra token ids that end the request (kept in token_ids)
    ignore_eos: bool = False  # keep generating past EOS (benchmarks enforce output lengths this way)
    logprobs: int | None = None  # top logprobs per output token, plus the sampled one's; 0 = only the sampled
    # token's; -1 = the whole vocabulary (the engine refuses more than its max_logprobs)

    def __post_init__(self):
        _check_int(self.n, "n", minimum=1)
        _check_real(self.temperature, "temperature", "a finite number >= 0", lambda t: t >= 0)
        if _SAMPLING_EPS <= self.temperature < _MAX_TEMP:
            warnings.warn(
                f"SamplingParams.temperature {self.temperature} is below {_MAX_TEMP}, which may overflow the "
                f"softmax; raised to {_MAX_TEMP} (as vLLM does)",
                stacklevel=3,
            )
            object.__setattr__(self, "temperature", _MAX_TEMP)
        _check_real(self.top_p, "top_p", "a number in (0, 1]", lambda p: 0 < p <= 1)
        _check_int(self.top_k, "top_k", minimum=-1)
        if self.max_tokens is not None:
            _check_int(self.max_tokens, "max_tokens", minimum=1)
        if self.seed is not None:
            _check_int(self.seed, "seed", minimum=0)
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", minimum=-1)
        _check_bool(self.ignore_eos, "ignore_eos")
        object.__setattr__(self, "stop", _as_stop_strings(self.stop))
        object.__setattr__(self, "stop_token_ids", _as_token_ids(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        """vLLM's rule: a temperature below 1e-5 means argmax."""
        return self.temperature < _SAMPLING_EPS


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
        _check_real(self.length_penalty, "length_penalty", "a finite number", lambda _: True, "BeamSearchParams")
        _check_bool(self.ignore_eos, "ignore_eos", owner="BeamSearchParams")


def _check_int(value, name: str, minimum: int, owner: str = "SamplingParams") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an integer >= {minimum}, got {value!r}")


def _check_real(value, name: str, wanted: str, ok, owner: str = "SamplingParams") -> None:
    """A finite int or float (never a bool, NaN or infinity) for which ok(value) holds."""
    real = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not real or not ok(value):
        raise ValueError(f"{owner}.{name} must be {wanted}, got {value!r}")


def _check_bool(value, name: str, owner: str = "SamplingParams") -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def check_text(value: str, name: str) -> str:
    """A user string must be valid Unicode text: a lone surrogate ("\\ud800" in JSON) has no UTF-8 form. (Every door
    checks its strings with this: prompts, stop strings, salts, chat messages, templates.)"""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{name}: not valid Unicode text (a lone surrogate at character {e.start})") from None
    return value


def _as_stop_strings(stop) -> list[str]:
    """None | str | a list of non-empty strings -> a list of them."""
    if stop is None:
        return []
    strings = [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, (list, tuple)) else None
    if strings is None or any(not isinstance(s, str) or not s for s in strings):
        raise ValueError(f"SamplingParams.stop must be a non-empty string or a list of them, got {stop!r}")
    for s in strings:
        check_text(s, "SamplingParams.stop")
    return strings


def _as_token_ids(ids) -> list[int]:
    """None | a list of token ids >= 0 -> a list of them (the engine checks them against its vocabulary)."""
    if ids is None:
        return []
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"SamplingParams.stop_token_ids must be a list of token ids, got {ids!r}")
    for i in ids:
        _check_int(i, "stop_token_ids", minimum=0)
    return list(ids)
