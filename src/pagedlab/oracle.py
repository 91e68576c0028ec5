"""Foundation: the no-cache oracle every stage is checked against.

Builds on: model/llama.py, attention/base.py (NoCacheAttention), worker/sampling.py.
Read with: chapters/00-overview.md.

The oracle keeps no KV cache at all: to choose output token i it runs the
whole sequence (prompt + i - 1 outputs) through the model again. That is
quadratic and slow, and obviously right, which is the point. Every stage of
pagedlab must produce the oracle's greedy tokens (and, with per-request seeds,
its sampled tokens); Hugging Face transformers in turn checks the oracle.

Alongside each token the oracle records the gap between its top-2 logits: a
cached engine computes the same numbers in another order, so when two tokens
are within float noise (gap < 1e-4) a different pick is not a bug
(chapters/97-architecture.md, Invariants).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedlab.attention.base import NoCacheAttention
from pagedlab.model.llama import CausalLM
from pagedlab.outputs import BeamSearchSequence, beam_score
from pagedlab.request import max_output_tokens
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.worker.sampling import sample


@dataclass
class _SeqBounds:
    """NoCacheAttention's metadata: where each sequence starts in the flattened tokens."""

    query_start_loc: list[int]  # [0, len0, len0 + len1, ...]


@dataclass
class OracleOutput:
    """The oracle's answer for one request."""

    prompt_token_ids: list[int]  # as given
    token_ids: list[int]  # output tokens (a final EOS / stop token id included)
    logprobs: list[float]  # logprob of each chosen token under the raw distribution
    top2_gaps: list[float]  # top-1 minus top-2 logit at each output position
    finish_reason: str  # "stop" | "length"


NEAR_TIE = 1e-4  # a top-2 logit gap below this may flip with the order of a float32 sum (batch shape, CPU)


def agrees(got: list[int], expected: OracleOutput) -> bool:
    """The rule every equivalence check uses (chapters/97-architecture.md, Invariants): `got` equals the oracle's
    tokens, or first differs from them where the oracle's top-2 logits were within NEAR_TIE of each other."""
    for i, (a, b) in enumerate(zip(got, expected.token_ids)):
        if a != b:
            return expected.top2_gaps[i] < NEAR_TIE
    return len(got) == len(expected.token_ids)


@torch.inference_mode()
def last_logits(model: CausalLM, sequences: list[list[int]]) -> torch.Tensor:
    """Run whole sequences through the model; return the logits [N, V] after each one's last token."""
    device = model.lm_head.weight.device
    ids = torch.tensor([t for s in sequences for t in s], device=device)
    positions = torch.cat([torch.arange(len(s), device=device) for s in sequences])
    bounds = [0]
    for s in sequences:
        bounds.append(bounds[-1] + len(s))
    attn = NoCacheAttention(model.config.num_queries_per_kv, model.config.head_dim, model.config.layer_windows)
    hidden = model(ids, positions, attn, _SeqBounds(bounds))  # [T, E]
    return model.compute_logits(hidden[torch.tensor(bounds[1:], device=device) - 1])  # [N, V]


def generate(
    model: CausalLM,
    prompt_token_ids: list[int],
    params: SamplingParams,
    eos_token_ids: tuple[int, ...] = (),
    max_model_len: int | None = None,
    seed: int | None = None,
) -> OracleOutput:
    """Generate one completion by full recomputation. `seed` overrides params.seed (child i uses seed + i)."""
    max_model_len = max_model_len or model.config.max_position_embeddings
    limit = max_output_tokens(len(prompt_token_ids), params.max_tokens, max_model_len)
    seed = params.seed if seed is None else seed
    stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    generator = torch.Generator().manual_seed(0)
    out = OracleOutput(list(prompt_token_ids), [], [], [], "length")
    while len(out.token_ids) < limit:
        logits = last_logits(model, [out.prompt_token_ids + out.token_ids])  # [1, V]
        token = int(sample(logits, [params], [seed], [len(out.token_ids)], generator)[0])
        top2 = logits[0].topk(2).values
        out.top2_gaps.append(float(top2[0] - top2[1]))
        out.logprobs.append(float(torch.log_softmax(logits[0], -1)[token]))
        out.token_ids.append(token)
        if token in stop_ids:
            out.finish_reason = "stop"
            break
    return out


def greedy(model: CausalLM, prompt_token_ids: list[int], max_tokens: int, **kwargs) -> OracleOutput:
    return generate(model, prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens), **kwargs)


def beam_search(
    model: CausalLM,
    prompt_token_ids: list[int],
    params: BeamSearchParams,
    eos_token_ids: tuple[int, ...] = (),
    max_model_len: int | None = None,
) -> list[BeamSearchSequence]:
    """vLLM's beam search, by full recomputation; returns the best `beam_width` sequences, best first.

    Each step every live beam proposes its 2 * beam_width most likely next tokens;
    a candidate ending in EOS is set aside as finished (unless ignore_eos), and
    the best `beam_width` of the rest by cumulative logprob stay live.
    """
    max_model_len = max_model_len or model.config.max_position_embeddings
    width = params.beam_width
    steps = max_output_tokens(len(prompt_token_ids), params.max_tokens, max_model_len)
    live = [BeamSearchSequence(list(prompt_token_ids), 0.0)]
    finished: list[BeamSearchSequence] = []
    for _ in range(steps):
        logprobs = torch.log_softmax(last_logits(model, [b.tokens for b in live]), dim=-1)  # [beams, V]
        values, ids = logprobs.topk(min(2 * width, logprobs.shape[-1]), dim=-1)
        candidates = []
        for beam, beam_values, beam_ids in zip(live, values.tolist(), ids.tolist()):
            for lp, token in zip(beam_values, beam_ids):
                cand = BeamSearchSequence(beam.tokens + [token], beam.cum_logprob + lp)
                ends = token in eos_token_ids and not params.ignore_eos
                cand.finish_reason = "stop" if ends else None
                (finished if ends else candidates).append(cand)
        live = sorted(candidates, key=lambda c: c.cum_logprob, reverse=True)[:width]
        if not live:
            break
    for beam in live:
        beam.finish_reason = "length"
    ranked = sorted(
        finished + live,
        key=lambda c: beam_score(c.tokens, c.cum_logprob, eos_token_ids, params.length_penalty),
        reverse=True,
    )
    return ranked[:width]
