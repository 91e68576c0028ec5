"""The bundled tiny-shakespeare model ships as package data and loads like any Hugging Face folder."""

import json

import pytest

from pagedlab import load_model, oracle
from pagedlab.model.loader import bundled_model_path

# Recorded from the shipped weights: greedy output for "ROMEO:". Every top-2 gap on
# this path is above 0.06, so float noise cannot flip it; a change means the weights,
# tokenizer or model code changed.
ROMEO_GREEDY = "\nWhat shall be the seat of the seas of the seas,\nAnd the sea"


@pytest.fixture(scope="module")
def bundled():
    return load_model()


def test_loads_from_package_data(bundled):
    files = {p.name for p in bundled_model_path().iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    cfg = bundled.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads, "GQA: fewer KV heads than query heads"
    assert cfg.max_position_embeddings >= 1024
    assert cfg.eos_token_ids == (1,) and cfg.tie_word_embeddings


def test_a_few_megabytes():
    size = (bundled_model_path() / "model.safetensors").stat().st_size
    assert 1e6 < size < 10e6


def test_string_prompts_get_bos(bundled):
    ids = bundled.tokenizer.encode("ROMEO:")
    assert ids[0] == bundled.config.bos_token_id == 0
    assert bundled.tokenizer.decode(ids) == "ROMEO:"


def test_greedy_output_is_stable(bundled):
    out = oracle.greedy(bundled.model, bundled.tokenizer.encode("ROMEO:"), max_tokens=60)
    assert bundled.tokenizer.decode(out.token_ids) == ROMEO_GREEDY


def test_training_summary_is_recorded():
    summary = json.loads((bundled_model_path() / "training.json").read_text())
    assert summary["val_loss"] < 1.7
    assert summary["recipe"]["seed"] == 1337
