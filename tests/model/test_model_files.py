"""model/files.py: every file the loader reads from a model folder is a regular file inside it, of a sane size;
and config.json's numbers are what transformers would accept, not silently replaced by defaults."""

import json
import os
import shutil
import signal
import stat
import warnings

import pytest

from pagedlab import load_model
from pagedlab.model.config import ModelConfig
from pagedlab.model.files import JSON_LIMIT, model_file
from pagedlab.model.loader import bundled_model_path
from pagedlab.model.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(os.name != "posix", reason="symlinks, FIFOs and /dev/zero")


@pytest.fixture
def folder(tmp_path):
    """A writable copy of the bundled model's folder, and a file outside it."""
    dst = tmp_path / "model"
    shutil.copytree(bundled_model_path(), dst)
    (tmp_path / "outside.txt").write_text("{{ 'a secret outside the folder' }}")
    return dst


@pytest.fixture
def deadline():
    """A read that blocks (a FIFO opened for reading) fails the test instead of hanging the suite."""

    def expired(*_):
        raise TimeoutError("blocked on a file")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _replace(path, target):
    path.unlink()
    path.symlink_to(target)


def test_config_json_linked_to_dev_zero_is_refused_before_any_byte_is_read(folder):
    _replace(folder / "config.json", "/dev/zero")  # read_text() would read until MemoryError
    with pytest.raises(ValueError, match=r"config.json: config.json resolves outside the model folder \(to /dev/zero"):
        load_model(folder)
    if os.geteuid() != 0:
        return
    (folder / "config.json").unlink()
    os.mknod(folder / "config.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero itself, inside the folder
    with pytest.raises(ValueError, match=r"config.json: .*config.json is a character device, not a regular file"):
        load_model(folder)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                  "chat_template.jinja", "model.safetensors"])  # fmt: skip
def test_a_fifo_never_blocks_the_loader(folder, deadline, name):
    if (folder / name).exists():
        (folder / name).unlink()
    os.mkfifo(folder / name)  # no writer: an open() for reading would wait for ever
    with pytest.raises(ValueError, match=rf"{name}: .*{name} is a FIFO, not a regular file"):
        load_model(folder)


@pytest.mark.parametrize("name", ["chat_template.jinja", "model.safetensors", "config.json", "tokenizer.json"])
def test_a_symlink_out_of_the_folder_is_refused(folder, name):
    # chat_template.jinja -> a file outside would have become every chat prompt; the weights another model's
    target = folder.parent / "outside.txt"
    if name == "model.safetensors":
        target = folder.parent / "other.safetensors"
        shutil.copy(folder / name, target)
    if (folder / name).exists():
        (folder / name).unlink()
    (folder / name).symlink_to(target)
    with pytest.raises(ValueError, match=rf"{name}: {name} resolves outside the model folder \(to .*{target.name}\)"):
        load_model(folder)


def test_a_symlink_to_another_file_of_the_folder_is_fine(folder):
    (folder / "weights").mkdir()
    os.replace(folder / "model.safetensors", folder / "weights" / "real.safetensors")
    (folder / "model.safetensors").symlink_to("weights/real.safetensors")
    (folder / "config.json").rename(folder / "config.real.json")
    (folder / "config.json").symlink_to(folder / "config.real.json")  # absolute, but inside
    assert load_model(folder).tokenizer is not None


def test_the_hugging_face_hub_cache_layout_loads(tmp_path):
    # hub cache: snapshots/<rev>/NAME -> ../../blobs/<hash>; the blobs folder belongs to the same model
    repo = tmp_path / "hub" / "models--someone--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, src in enumerate(sorted(bundled_model_path().iterdir())):
        shutil.copy(src, blobs / f"blob{i}")
        (snapshot / src.name).symlink_to(f"../../blobs/blob{i}")
    assert load_model(snapshot).tokenizer is not None
    (snapshot / "chat_template.jinja").symlink_to(tmp_path / "elsewhere.jinja")  # out of the repo: refused
    (tmp_path / "elsewhere.jinja").write_text("x")
    with pytest.raises(ValueError, match="chat_template.jinja resolves outside the model folder"):
        load_model(snapshot)


def test_a_broken_symlink_or_a_folder_in_place_of_a_file_names_the_file(folder):
    (folder / "tokenizer_config.json").symlink_to(folder / "nothing.json")
    with pytest.raises(ValueError, match=r"tokenizer_config.json is missing \(a symlink to nothing\)"):
        load_model(folder)
    (folder / "tokenizer_config.json").unlink()
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").mkdir()
    with pytest.raises(ValueError, match=r"tokenizer.json: not a readable tokenizer file \(tokenizer.json is a fol"):
        load_model(folder)


def test_text_files_are_read_up_to_a_limit_real_models_pass(folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config) + " " * JSON_LIMIT)  # valid JSON, 16 MiB of spaces
    with pytest.raises(ValueError, match=r"config.json: config.json is \d+ bytes, over the 16 MiB limit"):
        load_model(folder)
    (folder / "chat_template.jinja").write_text("x" * (2 << 20))
    with pytest.raises(ValueError, match=r"chat_template.jinja is \d+ bytes, over the 1 MiB limit for a chat template"):
        Tokenizer.from_folder(folder)


def test_a_chat_template_file_inside_the_folder_is_the_template(folder):
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    tok = Tokenizer.from_folder(folder)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi!"


def test_shards_named_by_the_index_are_checked_like_any_file(folder, deadline):
    shutil.copy(folder / "model.safetensors", folder.parent / "shard.safetensors")
    (folder / "model-00001-of-00001.safetensors").symlink_to(folder.parent / "shard.safetensors")
    (folder / "model.safetensors").unlink()
    index = {"weight_map": {"model.norm.weight": "model-00001-of-00001.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="model-00001-of-00001.safetensors resolves outside the model folder"):
        load_model(folder)
    (folder / "model-00001-of-00001.safetensors").unlink()
    os.mkfifo(folder / "model-00001-of-00001.safetensors")
    with pytest.raises(ValueError, match="model-00001-of-00001.safetensors is a FIFO"):
        load_model(folder)


def test_model_file_refuses_names_that_climb_out(folder):
    assert model_file(folder, "config.json") == folder / "config.json"
    assert model_file(folder, "absent.json", required=False) is None
    for name in ("../outside.txt", str(folder.parent / "outside.txt")):
        with pytest.raises(ValueError, match="resolves outside the model folder"):
            model_file(folder, name)


# -- config.json's numbers -------------------------------------------------------------------------


def _config(**changes) -> dict:
    cfg = json.loads((bundled_model_path() / "config.json").read_text())
    return cfg | changes


# transformers types these fields without None ("expected float, got NoneType"): a null is no model
NULLS = ["rms_norm_eps", "max_position_embeddings", "rope_theta", "tie_word_embeddings", "attention_bias",
         "mlp_bias", "use_sliding_window", "vocab_size", "intermediate_size"]  # fmt: skip


@pytest.mark.parametrize("field", NULLS)
def test_a_null_where_transformers_needs_a_value_is_refused(field):
    with pytest.raises(ValueError, match=rf"config.json: field '{field}' is (null|missing)"):
        ModelConfig.from_dict(_config(**{field: None}))


def test_a_null_where_transformers_allows_one_means_the_default():
    cfg = ModelConfig.from_dict(_config(num_key_value_heads=None, head_dim=None, sliding_window=None))
    assert cfg.num_key_value_heads == cfg.num_attention_heads
    assert cfg.head_dim == cfg.hidden_size // cfg.num_attention_heads


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(rms_norm_eps=float("nan")), "field 'rms_norm_eps' must be a positive number"),
        (dict(rms_norm_eps=float("inf")), "field 'rms_norm_eps' must be a positive number"),
        (dict(rope_theta=0), "field 'rope_theta' must be a positive number"),
        (dict(head_dim=7), "field 'head_dim' is 7; RoPE needs an even head_dim"),
        (dict(num_attention_heads=0), "field 'num_attention_heads' must be a positive integer"),
        (dict(vocab_size=0), "field 'vocab_size' must be a positive integer"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": None}), "field 'rope_theta' is null"),
        (dict(eos_token_id=[1, 10**6]), r"field 'eos_token_id' is 1000000, outside the vocabulary"),
        (dict(bos_token_id=10**6), r"field 'bos_token_id' is 1000000, outside the vocabulary"),
    ],
)
def test_numbers_out_of_range_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict(_config(**changes))


def test_a_llama_asking_for_a_sliding_window_is_told_it_has_full_attention():
    # transformers' LlamaConfig has no window fields and its Llama attends to everything: so does pagedlab, aloud
    with pytest.warns(UserWarning, match="field 'use_sliding_window' is ignored: LlamaForCausalLM has full attention"):
        cfg = ModelConfig.from_dict(_config(use_sliding_window=True, sliding_window=4))
    assert cfg.layer_windows == () and cfg.kv_window is None
    with pytest.warns(UserWarning, match="field 'sliding_window' is ignored"):
        ModelConfig.from_dict(_config(sliding_window=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Llama without window fields, or a Mistral with one: no warning
        ModelConfig.from_dict(_config())
        mistral = ModelConfig.from_dict(_config(architectures=["MistralForCausalLM"], sliding_window=4))
    assert set(mistral.layer_windows) == {4}


def test_generation_config_eos_ids_are_checked_against_the_vocabulary(folder):
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 99999]}))
    with pytest.raises(ValueError, match=r"generation_config.json: field 'eos_token_id' is 99999, outside"):
        load_model(str(folder))
