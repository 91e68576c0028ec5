"""The no-cache oracle: stopping rules, seeded sampling keyed on (seed, position), beam search."""

import pytest
import torch

from pagedlab import BeamSearchParams, SamplingParams, oracle
from pagedlab.outputs import beam_score
from pagedlab.worker.sampling import sample

PROMPT = [3, 14, 15, 9, 26, 5]


def test_greedy_is_deterministic_and_records_gaps(random_model):
    a = oracle.greedy(random_model, PROMPT, max_tokens=10)
    b = oracle.greedy(random_model, PROMPT, max_tokens=10)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 10
    assert a.finish_reason == "length"
    assert all(g >= 0 for g in a.top2_gaps) and len(a.top2_gaps) == 10


def test_eos_stops_and_is_included(random_model):
    first = oracle.greedy(random_model, PROMPT, max_tokens=1).token_ids[0]
    out = oracle.greedy(random_model, PROMPT, max_tokens=10, eos_token_ids=(first,))
    assert out.token_ids == [first] and out.finish_reason == "stop"


def test_ignore_eos_keeps_going(random_model):
    first = oracle.greedy(random_model, PROMPT, max_tokens=1).token_ids[0]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    out = oracle.generate(random_model, PROMPT, params, eos_token_ids=(first,))
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_stop_token_ids(random_model):
    greedy = oracle.greedy(random_model, PROMPT, max_tokens=6).token_ids
    params = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[greedy[2]])
    out = oracle.generate(random_model, PROMPT, params)
    cut = greedy.index(greedy[2]) + 1
    assert out.token_ids == greedy[:cut] and out.finish_reason == "stop"


def test_max_model_len_caps_the_output(random_model):
    out = oracle.generate(random_model, PROMPT, SamplingParams(temperature=0, max_tokens=50), max_model_len=10)
    assert len(PROMPT) + len(out.token_ids) == 10 and out.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_seed_dependent(random_model):
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
    a = oracle.generate(random_model, PROMPT, params).token_ids
    assert a == oracle.generate(random_model, PROMPT, params).token_ids
    others = {tuple(oracle.generate(random_model, PROMPT, params, seed=s).token_ids) for s in range(8, 12)}
    assert len(others | {tuple(a)}) > 1, "different seeds should sample different outputs"


def test_sampling_keyed_on_seed_and_position_not_batch():
    torch.manual_seed(1)
    logits = torch.randn(4, 30)
    params = [SamplingParams(temperature=0.8, seed=s) for s in (1, 2, 3, 4)]
    batched = sample(logits, params, [1, 2, 3, 4], [5, 6, 7, 8])
    alone = [int(sample(logits[i : i + 1], [params[i]], [i + 1], [5 + i])[0]) for i in range(4)]
    assert batched.tolist() == alone


def test_top_k_one_is_greedy():
    logits = torch.randn(3, 30)
    params = [SamplingParams(temperature=1.5, top_k=1, seed=0)] * 3
    assert sample(logits, params, [0, 0, 0], [0, 1, 2]).tolist() == logits.argmax(-1).tolist()


def test_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([[5.0, 4.9, 0.0, -1.0, -2.0]])
    params = [SamplingParams(temperature=1.0, top_p=0.6, seed=0)]
    picks = {int(sample(logits, params, [0], [pos])[0]) for pos in range(200)}
    assert picks <= {0, 1} and len(picks) == 2


def test_beam_width_one_without_eos_is_greedy(random_model):
    beams = oracle.beam_search(random_model, PROMPT, BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True))
    greedy = oracle.greedy(random_model, PROMPT, max_tokens=8)
    assert beams[0].tokens == PROMPT + greedy.token_ids
    assert beams[0].cum_logprob == pytest.approx(sum(greedy.logprobs), abs=1e-4)


@pytest.mark.parametrize("width", [2, 4])
def test_beams_are_ranked_and_their_logprobs_add_up(random_model, width):
    eos = (1,)
    params = BeamSearchParams(beam_width=width, max_tokens=6, length_penalty=1.0)
    beams = oracle.beam_search(random_model, PROMPT, params, eos_token_ids=eos)
    assert len(beams) == width
    scores = [beam_score(b.tokens, b.cum_logprob, eos, 1.0) for b in beams]
    assert scores == sorted(scores, reverse=True)
    for b in beams:
        assert b.tokens[: len(PROMPT)] == PROMPT
        recomputed = sum(
            float(torch.log_softmax(oracle.last_logits(random_model, [b.tokens[:i]])[0], -1)[b.tokens[i]])
            for i in range(len(PROMPT), len(b.tokens))
        )
        assert b.cum_logprob == pytest.approx(recomputed, abs=1e-4)
        assert (b.finish_reason == "stop") == (b.tokens[-1] in eos)


def test_agrees_allows_a_different_token_only_at_a_near_tie():
    """The notebooks' and the tests' one rule: equal tokens, or a first difference where the oracle's top-2 logits
    were within NEAR_TIE (a float32 sum in another order, on another CPU or batch shape, may flip it)."""
    ref = oracle.OracleOutput([1], [5, 6, 7], [0.0] * 3, [0.5, 3e-5, 0.5], "length")
    assert oracle.agrees([5, 6, 7], ref) and oracle.agrees([5, 9, 2], ref)  # differs first at the near tie
    assert not oracle.agrees([4, 6, 7], ref) and not oracle.agrees([5, 6], ref) and not oracle.agrees([5, 6, 7, 8], ref)
