"""model/gguf.py: a GGUF file the test writes itself converts to the weights it holds, the tokens its
tokenizer gives, and the greedy tokens transformers computes from the same file."""

import json

import numpy as np
import pytest
import torch

from pagedlab import LLM, SamplingParams
from pagedlab.model.gguf import convert_gguf
from pagedlab.model.tokenizer import Tokenizer
from tests.model.gguf_files import CHATML, TEXT, _permute, _unpermute, write_tiny_gguf

gguf = pytest.importorskip("gguf")
PROMPTS = ["What is the capital of", "Write a haiku", "<|im_start|>user\nhello there<|im_end|>\n", "1234 gulls"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf path, converted folder, roundtrip transformers model, source tokenizer)."""
    root = tmp_path_factory.mktemp("gguf")
    path = root / "tiny.gguf"
    model, tok = write_tiny_gguf(path)
    return path, convert_gguf(path, root / "hf"), model, tok


def test_the_test_permutation_is_llama_cpps_and_invertible():
    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads of 4 rows
    assert _permute(w, 2)[:, 0].tolist() == [0, 6, 3, 9, 12, 18, 15, 21]  # rows 0, 2, 1, 3 of each head
    assert (_unpermute(_permute(w, 2), 2) == w).all()


def test_the_file_holds_every_promised_tensor_type(tiny):
    kinds = {t.tensor_type.name for t in gguf.GGUFReader(str(tiny[0])).tensors}
    assert kinds == {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"}


def test_the_weights_are_what_the_file_holds(tiny):
    from safetensors.torch import load_file

    _, folder, model, _ = tiny
    got, want = load_file(str(folder / "model.safetensors")), model.state_dict()
    assert got.keys() == want.keys()
    for name in want:  # exactly: dequantizing is deterministic float32 arithmetic
        assert torch.equal(got[name], want[name]), name


def test_the_folder_is_a_hugging_face_llama(tiny):
    _, folder, model, _ = tiny
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert config[field] == getattr(model.config, field), field
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 10000.0  # float32 metadata, written back
    assert json.loads((folder / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == CHATML and tok_config["eos_token"] == "<|im_end|>"


def test_the_tokenizer_equals_its_source_and_transformers_reading_of_the_file(tiny):
    from transformers import AutoTokenizer

    path, folder, _, source = tiny
    ours = Tokenizer.from_folder(folder)
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXT + ["naïve café 🙂", "  two  spaces\tand\ttabs\n\n", "<|im_end|><|im_start|>"]:
        ids = ours.encode(text)
        assert ids == source.encode(text).ids == theirs(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == source.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("stage", [2, 5])
def test_greedy_tokens_equal_transformers_loading_the_same_gguf(tiny, stage):
    from transformers import AutoModelForCausalLM

    path, folder, _, _ = tiny
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    llm = LLM(str(folder), stage=stage)
    prompts = [llm.get_tokenizer().encode(p) for p in PROMPTS]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    for ids, out in zip(prompts, outs):
        x = torch.tensor([ids])
        want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False, eos_token_id=None)
        assert list(out.outputs[0].token_ids) == want[0, len(ids) :].tolist()


def test_bfloat16_halves_the_folder_and_rounds_the_weights(tiny, tmp_path):
    from safetensors.torch import load_file

    path, folder, model, _ = tiny
    half = convert_gguf(path, tmp_path / "bf16", dtype="bfloat16")
    assert (half / "model.safetensors").stat().st_size < 0.6 * (folder / "model.safetensors").stat().st_size
    got = load_file(str(half / "model.safetensors"))["lm_head.weight"]
    assert got.dtype == torch.bfloat16 and torch.equal(got, model.state_dict()["lm_head.weight"].bfloat16())


def test_what_it_cannot_convert_is_a_value_error_naming_the_field_and_writes_nothing(tmp_path):
    cases = [
        (dict(arch="qwen2"), "general.architecture: 'qwen2' is not supported"),
        (dict(extra_tensor=("rope_freqs.weight", np.ones(32, np.float32))), "rope_freqs.weight: not a tensor"),
        (dict(extra_tensor=("blk.0.attn_q.bias", np.ones(64, np.int32))), "tensor type I32 is not supported"),
    ]
    for i, (kwargs, message) in enumerate(cases):
        path = tmp_path / f"bad{i}.gguf"
        write_tiny_gguf(path, **kwargs)
        with pytest.raises(ValueError, match=message):
            convert_gguf(path, tmp_path / f"out{i}")
        assert not (tmp_path / f"out{i}").exists()
    with pytest.raises(ValueError, match="not found"):
        convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(ValueError, match="junk.gguf: not a readable GGUF file"):
        convert_gguf(tmp_path / "junk.gguf", tmp_path / "out")
    with pytest.raises(ValueError, match="dtype: 'float16'"):
        convert_gguf(tmp_path / "junk.gguf", tmp_path / "out", dtype="float16")
