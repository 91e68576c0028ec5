"""SamplingParams / BeamSearchParams: vLLM's defaults, and a ValueError naming each bad field."""

import pytest

from pagedlab import BeamSearchParams, SamplingParams


def test_defaults_equal_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens) == (1, 1.0, 1.0, 0, 16)
    assert (p.seed, p.stop, p.stop_token_ids, p.ignore_eos, p.logprobs) == (None, [], [], False, None)


def test_stop_string_becomes_list():
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -1}, "seed"),
        ({"logprobs": -2}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"n": True}, "n"),
    ],
)
def test_invalid_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, field", [({"beam_width": 0}, "beam_width"), ({"max_tokens": 0}, "max_tokens")])
def test_invalid_beam_params(kwargs, field):
    base = {"beam_width": 2, "max_tokens": 4} | kwargs
    with pytest.raises(ValueError, match=rf"BeamSearchParams\.{field}"):
        BeamSearchParams(**base)


def test_a_top_k_beyond_the_vocabulary_samples_as_top_k_off():
    """vLLM accepts any top_k >= 1 and clamps it to the vocabulary; 10**20 once overflowed int64 in the sampler,
    inside an engine step."""
    import torch

    from pagedlab.worker.sampling import sample

    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    huge, off = SamplingParams(top_k=10**20, seed=3), SamplingParams(top_k=0, seed=3)
    assert sample(logits, [huge, huge], [3, 4], [0, 0]).tolist() == sample(logits, [off, off], [3, 4], [0, 0]).tolist()


def test_a_stop_string_must_be_text():
    with pytest.raises(ValueError, match="SamplingParams.stop: not valid Unicode text"):
        SamplingParams(stop=["ok", "\ud800"])
