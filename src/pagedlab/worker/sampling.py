"""Foundation: turn a batch of logits into tokens, the same way for the oracle and every stage.

Builds on: sampling_params.py.
Read with: chapters/01-contiguous-static.md.

Sampling draws token = argmax(probs / q) with q ~ Exponential(1) (the
"exponential race", equivalent to sampling from probs, and what vLLM's
sampler does). For a request with a seed, q is generated from a generator
keyed on (seed, output position) alone, so the same request samples the same
tokens whether it runs alone, in a batch of 64, chunked, or after preemption.
Noise is drawn on the CPU so that GPU and CPU runs agree too.

Shapes: N rows (one per request sampled this step), V = vocab size.
"""

from __future__ import annotations

import torch

from pagedlab.sampling_params import SamplingParams

_GOLDEN = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1


def noise_key(seed: int, position: int) -> int:
    """A 63-bit generator seed determined by (seed, output position) only."""
    return (seed * _GOLDEN + position) & _MASK63


def exponential_noise(
    seeds: list[int | None], positions: list[int], vocab: int, generator: torch.Generator | None
) -> torch.Tensor:
    """[N, V] Exponential(1) noise; seeded rows are keyed on (seed, position), the rest use `generator`."""
    rows = []
    for seed, pos in zip(seeds, positions):
        g = generator if seed is None else torch.Generator().manual_seed(noise_key(seed, pos))
        rows.append(torch.empty(vocab).exponential_(generator=g))
    return torch.stack(rows)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask [N, V] logits outside each row's top-k and nucleus top-p to -inf (k = V, p = 1: off)."""
    sorted_logits, order = logits.sort(dim=-1)  # ascending
    vocab = logits.shape[-1]
    kth = sorted_logits.gather(1, (vocab - top_k).unsqueeze(1))  # [N, 1] the k-th largest value
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1 - top_p).unsqueeze(1)
    drop[:, -1] = False  # the most likely token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    seeds: list[int | None],
    positions: list[int],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """[N, V] float32 logits -> [N] token ids. Greedy rows take the argmax; the rest sample."""
    tokens = logits.argmax(dim=-1)
    random_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not random_rows:
        return tokens
    vocab = logits.shape[-1]
    chosen = [params[i] for i in random_rows]
    temperature = torch.tensor([p.temperature for p in chosen], device=logits.device)
    # top_k beyond the vocabulary means all of it, as vLLM clamps it (and before any tensor: 10**20 is no int64)
    top_k = torch.tensor([min(p.top_k, vocab) if p.top_k > 0 else vocab for p in chosen], device=logits.device)
    top_p = torch.tensor([p.top_p for p in chosen], device=logits.device)
    scaled = apply_top_k_top_p(logits[random_rows] / temperature[:, None], top_k, top_p)
    probs = scaled.softmax(dim=-1)
    q = exponential_noise([seeds[i] for i in random_rows], [positions[i] for i in random_rows], vocab, generator)
    tokens[random_rows] = (probs / q.to(probs.device)).argmax(dim=-1)
    return tokens


def top_logprobs(logprobs: torch.Tensor, wanted: list[int | None], tokens: list[int], chosen: list[float]) -> list:
    """Per sampled row of [N, V] logprobs: {token: logprob} of its `wanted` most likely tokens plus the sampled one,
    or None where none were asked for. As vLLM: 0 = the sampled token's alone, -1 = the whole vocabulary.
    One topk for the batch; what a row gets never depends on what the others asked for."""
    vocab = logprobs.shape[-1]
    ks = [None if w is None else vocab if w == -1 else w for w in wanted]
    k = max((x for x in ks if x is not None), default=0)
    values, ids = logprobs.topk(k, dim=-1) if k else (None, None)  # [N, k] each
    values, ids = (values.tolist(), ids.tolist()) if k else ([], [])
    top = []
    for i, ki in enumerate(ks):
        if ki is None:
            top.append(None)
            continue
        entry = dict(zip(ids[i][:ki], values[i][:ki])) if ki else {}
        entry[tokens[i]] = chosen[i]
        top.append(entry)
    return top
