"""Our decoder equals Hugging Face transformers on tiny random Llama, Qwen2 and Qwen3 models."""

import pytest
import torch

from pagedlab import load_model, oracle
from tests.model.hf_models import KINDS, save_hf_model

pytestmark = pytest.mark.numerics  # floats torch computed: run again on its other CPU kernels

transformers = pytest.importorskip("transformers")

PROMPT = [1, 5, 17, 42, 8, 90, 33, 3, 64, 21, 7, 11]


@pytest.fixture(scope="module", params=sorted(KINDS))
def pair(request, tmp_path_factory):
    """(hf_model, our_loaded_model) for one kind, through save_pretrained + our loader."""
    folder = tmp_path_factory.mktemp(request.param)
    hf = save_hf_model(request.param, folder)
    return hf, load_model(folder)


def test_logits_equal_transformers(pair):
    hf, ours = pair
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0]  # [T, V]
        ids = torch.tensor(PROMPT)
        hidden = ours.model(ids, torch.arange(len(PROMPT)), _no_cache(ours), _bounds(len(PROMPT)))
        got = ours.model.compute_logits(hidden)
    assert expected.abs().max() > 1.0, "logits should be spread out (large init range)"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_oracle_greedy_equals_hf_generate(pair):
    hf, ours = pair
    with torch.no_grad():
        hf_out = hf.generate(
            torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(PROMPT) :].tolist()
    got = oracle.greedy(ours.model, PROMPT, max_tokens=12).token_ids  # no EOS ids: never stops early
    assert got == hf_out


def test_sharded_checkpoint_loads(tmp_path):
    hf = save_hf_model("qwen3", tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = load_model(tmp_path)
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0, -1]
    got = oracle.last_logits(ours.model, [PROMPT])[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_config_fields_read(pair):
    hf, ours = pair
    cfg = ours.config
    assert cfg.num_key_value_heads == hf.config.num_key_value_heads
    assert cfg.tie_word_embeddings == bool(hf.config.tie_word_embeddings)
    assert cfg.eos_token_ids == (2,)


def _no_cache(loaded):
    from pagedlab.attention.base import NoCacheAttention

    return NoCacheAttention(loaded.config.num_queries_per_kv, loaded.config.head_dim, loaded.config.layer_windows)


def _bounds(n):
    from pagedlab.oracle import _SeqBounds

    return _SeqBounds([0, n])


def test_num_parameters_counts_the_checkpoint(pair):
    """What the memory check counts before loading equals what Hugging Face builds (tied heads counted once)."""
    hf, ours = pair
    assert ours.config.num_parameters == sum(p.numel() for p in hf.parameters())
    assert ours.config.num_parameters == sum(p.numel() for p in ours.model.parameters())
