"""Benchmarks: seeded synthetic request streams shaped like the vLLM paper's datasets.

Builds on: nothing (pure Python, no torch, no numpy: the same seed gives the same stream everywhere).
Read with: DESIGN.md §6, chapters/02-paged-blocks.md.

The paper (Kwon et al., SOSP 2023, Fig. 11) samples prompts and outputs from
two datasets. We keep only their shape: a long-tailed length distribution with
the dataset's mean, drawn from a lognormal and clipped to what a model with
`max_model_len` context can hold:

    workload    input mean   output mean   tail
    sharegpt       161           338       long (real conversations)
    alpaca          19            58       short (instructions)

    prompt_len ~ clip(round(LogNormal(mu_in, sigma)), 1, max_model_len - 1)
    output_len ~ clip(round(LogNormal(mu_out, sigma)), 1, max_model_len - prompt_len)
    with mu = ln(mean) - sigma**2 / 2, so that E[LogNormal] = mean before clipping.

Output lengths are enforced by the benches (`ignore_eos`), never left to the model.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One synthetic request: how long its prompt is and how many tokens it will generate."""

    prompt_len: int  # prompt tokens, >= 1
    output_len: int  # output tokens to generate (enforced with ignore_eos), >= 1

    @property
    def final_len(self) -> int:
        """Tokens the request holds when it finishes: prompt + output."""
        return self.prompt_len + self.output_len


@dataclass(frozen=True, slots=True)
class LengthShape:
    """A dataset's length distribution: lognormal input and output lengths with these means."""

    input_mean: float  # mean prompt length in tokens (before clipping)
    output_mean: float  # mean output length in tokens (before clipping)
    sigma: float  # lognormal shape: larger = longer tail (1.0 gives a coefficient of variation ~1.3)


WORKLOADS: dict[str, LengthShape] = {
    "sharegpt": LengthShape(input_mean=161, output_mean=338, sigma=1.0),
    "alpaca": LengthShape(input_mean=19, output_mean=58, sigma=0.8),
}


def _lognormal_len(rng: random.Random, mean: float, sigma: float, upper: int) -> int:
    mu = math.log(mean) - sigma**2 / 2
    return min(max(1, round(rng.lognormvariate(mu, sigma))), upper)


def sample_requests(workload: str, num_requests: int, seed: int = 0, max_model_len: int = 2048) -> list[RequestSpec]:
    """`num_requests` seeded (prompt_len, output_len) pairs of `workload`; prompt + output <= max_model_len."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, got {workload!r}")
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2 (one prompt and one output token), got {max_model_len}")
    shape, rng = WORKLOADS[workload], random.Random(f"{workload}-{seed}")
    specs = []
    for _ in range(num_requests):
        prompt_len = _lognormal_len(rng, shape.input_mean, shape.sigma, max_model_len - 1)
        output_len = _lognormal_len(rng, shape.output_mean, shape.sigma, max_model_len - prompt_len)
        specs.append(RequestSpec(prompt_len, output_len))
    return specs
