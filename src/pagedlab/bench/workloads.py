"""Benchmarks: seeded synthetic request streams shaped like the vLLM paper's datasets.

Builds on: nothing (pure Python, no torch, no numpy: the same seed gives the same stream everywhere).
Read with: chapters/97-architecture.md (Benchmarks), chapters/02-paged-blocks.md.

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

A shared-prefix stream (the paper's §6.4) has concrete prompt tokens: one
prefix cut from a tokenized corpus, shared by every request, then a short
suffix of each request's own (see `shared_prefix_requests`).

Benches that run a real model need real prompts of the sampled lengths:
`corpus_prompts` cuts them from a tokenized corpus, each <bos> + a run of text.
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


# --- shared prefix (the paper's §6.4) -------------------------------------------------------------------------------

# The paper's translation prompts (LLaMA-13B, WMT16 En-De): an instruction and one or five translation examples shared
# by every request, then the sentence to translate. Prefix lengths in tokens of whatever tokenizer cut the corpus.
SHARED_PREFIX_LENS: dict[str, int] = {"one-shot": 80, "five-shot": 341}


@dataclass(frozen=True, slots=True)
class PrefixedRequest:
    """One request of a shared-prefix stream: its prompt tokens start with the prefix every request shares."""

    prompt_token_ids: tuple[int, ...]  # the shared prefix, then this request's own suffix
    output_len: int  # output tokens to generate (enforced with ignore_eos), >= 1
    num_prefix_tokens: int  # leading tokens shared with every other request of the stream

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


def shared_prefix_requests(
    workload: str,
    corpus_ids: list[int],
    num_requests: int,
    seed: int = 0,
    suffix_lens: tuple[int, int] = (8, 20),
    output_lens: tuple[int, int] = (4, 16),
) -> list[PrefixedRequest]:
    """`num_requests` seeded prompts: the first SHARED_PREFIX_LENS[workload] tokens of `corpus_ids`, then a suffix
    cut from a random place in the rest of it; suffix and output lengths are uniform over the inclusive ranges.

    `corpus_ids` is a text as the model's tokenizer encodes it (<bos> first, if it adds one), so the shared
    prefix is what the model would see for a text prompt.
    """
    if workload not in SHARED_PREFIX_LENS:
        raise ValueError(f"workload must be one of {sorted(SHARED_PREFIX_LENS)}, got {workload!r}")
    prefix_len = SHARED_PREFIX_LENS[workload]
    if not (1 <= suffix_lens[0] <= suffix_lens[1] and 1 <= output_lens[0] <= output_lens[1]):
        raise ValueError(f"suffix_lens, output_lens: need (lo, hi), 1 <= lo <= hi, got {suffix_lens}, {output_lens}")
    if len(corpus_ids) < prefix_len + suffix_lens[1]:
        need = prefix_len + suffix_lens[1]
        raise ValueError(f"corpus_ids: {len(corpus_ids)} tokens, but {workload} needs at least {need}")
    rng, prefix = random.Random(f"{workload}-{seed}"), tuple(corpus_ids[:prefix_len])
    specs = []
    for _ in range(num_requests):
        suffix_len = rng.randint(*suffix_lens)
        start = rng.randrange(prefix_len, len(corpus_ids) - suffix_len + 1)
        suffix = tuple(corpus_ids[start : start + suffix_len])
        specs.append(PrefixedRequest(prefix + suffix, rng.randint(*output_lens), prefix_len))
    return specs


# --- real prompts of sampled lengths (benches that run a model) -----------------------------------------------------


def corpus_prompts(
    specs: list[RequestSpec], corpus_ids: list[int], seed: int = 0, bos_token_id: int = 0
) -> list[list[int]]:
    """One prompt per spec, exactly `prompt_len` tokens: <bos>, then `prompt_len - 1` consecutive tokens cut from a
    seeded random place in `corpus_ids` (a text as the model's tokenizer encodes it; a leading <bos> is skipped).

    A model's behaviour depends on what it reads: `[0] * prompt_len` would be far outside what it was trained on.
    """
    body = corpus_ids[1:] if corpus_ids[:1] == [bos_token_id] else corpus_ids
    longest = max((s.prompt_len for s in specs), default=1)
    if len(body) < longest - 1:
        raise ValueError(f"corpus_ids: {len(body)} tokens after <bos>, but a prompt of {longest} needs {longest - 1}")
    rng = random.Random(f"prompts-{seed}")
    prompts = []
    for spec in specs:
        start = rng.randrange(len(body) - (spec.prompt_len - 1) + 1)
        prompts.append([bos_token_id, *body[start : start + spec.prompt_len - 1]])
    return prompts
