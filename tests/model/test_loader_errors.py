"""Every way a model folder can be wrong gets a ValueError naming the file and the field."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedlab import load_model
from pagedlab.model.loader import bundled_model_path


@pytest.fixture
def folder(tmp_path):
    """A writable copy of the bundled model's folder."""
    dst = tmp_path / "model"
    shutil.copytree(bundled_model_path(), dst)
    return dst


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))


def _edit_weights(folder, edit):
    weights = load_file(str(folder / "model.safetensors"))
    edit(weights)
    save_file(weights, str(folder / "model.safetensors"))


def test_copy_of_bundled_model_loads(folder):
    assert load_model(folder).tokenizer is not None


def test_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match="neither 'tiny-shakespeare', 'smollm2-135m-instruct' nor a folder"):
        load_model(tmp_path / "nope")


def test_missing_config(folder):
    (folder / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json is missing"):
        load_model(folder)


def test_config_not_json(folder):
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(folder)


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"])
def test_missing_required_field(folder, field):
    _edit_config(folder, **{field: None})
    with pytest.raises(ValueError, match=f"config.json: field '{field}'"):
        load_model(folder)


def test_unsupported_architecture(folder):
    _edit_config(folder, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="field 'architectures' is 'GPT2LMHeadModel'"):
        load_model(folder)


def test_unknown_rope_scaling_type(folder):
    _edit_config(folder, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="field 'rope_type' is 'yarn'"):
        load_model(folder)


def test_incomplete_llama3_rope_scaling(folder):
    _edit_config(folder, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="needs field 'low_freq_factor'"):
        load_model(folder)


def test_kv_heads_must_divide_heads(folder):
    _edit_config(folder, num_key_value_heads=3)
    with pytest.raises(ValueError, match="field 'num_key_value_heads'"):
        load_model(folder)


def test_missing_weights_file(folder):
    (folder / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="model.safetensors is missing"):
        load_model(folder)


def test_pickle_checkpoint_refused(folder):
    (folder / "model.safetensors").unlink()
    torch.save({}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="safetensors only"):
        load_model(folder)


def test_missing_tensor(folder):
    _edit_weights(folder, lambda w: w.pop("model.norm.weight"))
    with pytest.raises(ValueError, match="tensor 'model.norm.weight' is missing"):
        load_model(folder)


def test_misshapen_tensor_names_config(folder):
    _edit_config(folder, intermediate_size=100)
    with pytest.raises(ValueError, match=r"model.safetensors: tensor 'model.layers.0.mlp.\w+_proj.weight' has shape"):
        load_model(folder)


def test_unexpected_tensor(folder):
    _edit_config(folder, num_hidden_layers=1)
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.1"):
        load_model(folder)


def test_untied_head_without_lm_head(folder):
    _edit_config(folder, tie_word_embeddings=False)
    with pytest.raises(ValueError, match="tensor 'lm_head.weight' is missing"):
        load_model(folder)


def test_sharded_index_with_missing_shard(folder):
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="shard 'model-00002-of-00002.safetensors'"):
        load_model(folder)


def test_bad_tokenizer_file(folder):
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match="tokenizer.json: not a readable tokenizer file"):
        load_model(folder)


def test_folder_without_tokenizer_loads_for_token_ids(folder):
    (folder / "tokenizer.json").unlink()
    loaded = load_model(folder)
    assert loaded.tokenizer is None


# config.json fields of the wrong type or sign: each names the file and the field.
CONFIG_FIELDS = [
    ("num_key_value_heads", "2"),
    ("num_key_value_heads", -1),
    ("head_dim", 0),
    ("hidden_size", 32.5),
    ("vocab_size", True),
    ("max_position_embeddings", -5),
    ("rms_norm_eps", "x"),
    ("rms_norm_eps", 0),
    ("rope_theta", -1),
    ("tie_word_embeddings", "yes"),
    ("attention_bias", 1),
    ("mlp_bias", "no"),
    ("use_sliding_window", "false"),
    ("eos_token_id", "2"),
    ("eos_token_id", [1, "2"]),
    ("eos_token_id", -1),
    ("bos_token_id", "<bos>"),
    ("architectures", "LlamaForCausalLM"),
    ("rope_scaling", "linear"),
    ("torch_dtype", 5),
]


@pytest.mark.parametrize("field, value", CONFIG_FIELDS, ids=[f"{f}={v!r}" for f, v in CONFIG_FIELDS])
def test_config_field_of_the_wrong_type_or_sign(folder, field, value):
    _edit_config(folder, **{field: value})
    with pytest.raises(ValueError, match=rf"config.json.*field '{field}'"):
        load_model(folder)


def test_json_null_means_the_default(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg |= {"head_dim": None, "rope_scaling": None, "bos_token_id": None, "torch_dtype": None}
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_model(folder).config.head_dim == cfg["hidden_size"] // cfg["num_attention_heads"]


def test_a_config_whose_weights_cannot_fit_is_refused_before_any_is_built(folder):
    _edit_config(folder, hidden_size=2**20, intermediate_size=2**22, num_hidden_layers=4096)
    with pytest.raises(ValueError, match=r"config.json: the weights take .* TiB.* available"):
        load_model(folder)


def _write_weights_file(folder, data):
    (folder / "model.safetensors").write_bytes(data)


@pytest.mark.parametrize(
    "damage",
    ["empty", "truncated", "garbage", "directory"],
)
def test_a_damaged_safetensors_file_names_itself(folder, damage):
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    if damage == "directory":
        weights.unlink()
        weights.mkdir()
    else:
        weights.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "garbage": b"\xff" * 64}[damage])
    with pytest.raises(ValueError, match=r"model.safetensors: not a readable safetensors file"):
        load_model(folder)


INDEXES = [
    ("{ not json", r"not valid JSON"),
    ("[]", r"expected a JSON object"),
    ('{"weight_map": []}', r"field 'weight_map'"),
    ('{"weight_map": {"model.norm.weight": 5}}', r"field 'weight_map'"),
    ('{"weight_map": {"model.norm.weight": "../outside.safetensors"}}', r"shard '../outside.safetensors' .* outside"),
    ('{"weight_map": {"model.norm.weight": "/etc/passwd"}}', r"shard '/etc/passwd' .* outside"),
]


@pytest.mark.parametrize(
    "text, message", INDEXES, ids=["not-json", "a-list", "map-a-list", "shard-an-int", "dotdot", "absolute"]
)
def test_a_malformed_index_names_the_file_and_field(folder, text, message):
    (folder.parent / "outside.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (folder / "model.safetensors.index.json").write_text(text)
    with pytest.raises(ValueError, match=rf"model.safetensors.index.json: .*{message}"):
        load_model(folder)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{ not json", "not valid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"eos_token_id": "2"}', "field 'eos_token_id'"),
    ],
)
def test_a_malformed_generation_config(folder, text, message):
    (folder / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match=rf"generation_config.json.*{message}"):
        load_model(folder)
