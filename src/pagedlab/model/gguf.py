"""Foundation: a Llama GGUF file (llama.cpp's format) converted into a Hugging Face folder.

Builds on: model/config.py (the folder it writes is what load_model reads), model/tokenizer.py.
Read with: chapters/07-real-model.md.

A GGUF file holds everything a model needs in one place: metadata (the architecture's sizes, the
tokenizer's vocabulary and merges, the chat template) and tensors, most of them quantized into
blocks of 32 weights that share a scale. pagedlab computes in float, so the conversion reads the
file with llama.cpp's own `gguf` package (`pip install pagedlab[real]`), dequantizes every tensor,
and writes the folder any Hugging Face checkpoint would be:

    config.json  generation_config.json  model.safetensors  tokenizer.json  tokenizer_config.json

Two things are not a plain copy:
- llama.cpp's converter permutes the rows of Q and K within each head, for its RoPE kernel, which
  rotates adjacent pairs (x0, x1), (x2, x3)... where Hugging Face's Llama rotates the halves
  (x0, x_{D/2}), ... . `unpermute` undoes it exactly as transformers' GGUF loader does; without it
  the model still runs and answers nonsense.
- The tokenizer is rebuilt from the vocabulary and merges (a byte-level BPE) with the pre-tokenizer
  llama.cpp names in `tokenizer.ggml.pre`.

Nothing in the file is believed unchecked (model/gguf_checks.py): its header is walked with every
count bounded by the file's size before llama.cpp's reader sees it, and the metadata must agree
with itself and with the tensors. The folder is written under a temporary name beside `out_dir`
and renamed into place whole, so a conversion that fails leaves nothing behind.

vLLM read GGUF too (vllm/model_executor/model_loader/gguf_loader.py, v0.10.2; gone by 0.33), keeping the
quantized blocks and dequantizing inside its kernels; this file trades that memory for simplicity.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import numpy as np
import torch

from pagedlab.model import gguf_checks as checks
from pagedlab.model.files import regular_file

# The tensor types this converter reads (tests write each of the first six).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
ARCHITECTURES = ("llama",)

# llama.cpp's tensor names -> Hugging Face Llama's ("{i}" is the layer).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# tokenizer.ggml.pre -> whether digits are split one by one before byte-level BPE (llama.cpp's
# llama-vocab.cpp: "smollm" and "starcoder" put "\p{N}" before GPT-2's pattern).
_PRE_TOKENIZERS = {"default": False, "gpt-2": False, "smollm": True, "starcoder": True, "refact": True}

# GGUF token types (llama.cpp's llama_token_type): 3 control (special), 4 user-defined.
_CONTROL, _USER_DEFINED = 3, 4


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ValueError("model: reading a GGUF file needs the `gguf` package: pip install 'pagedlab[real]'") from None
    return gguf


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32", progress: bool = False) -> Path:
    """Write the Hugging Face folder of a Llama GGUF file into `out_dir`; returns `out_dir`.

    `dtype` ("float32" or "bfloat16") is how the dequantized weights are stored: float32 keeps them
    exactly (a Q4_1 weight is scale * q + min in float32), bfloat16 halves the folder. `progress`: a bar.
    Anything this cannot convert (another architecture, tensor type or tokenizer) is a ValueError
    naming the field, raised before anything is written; an error while writing removes what was written.
    """
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype: {dtype!r}; choose 'float32' or 'bfloat16'")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out_dir: {str(out)!r} already exists and is not an empty folder")
    reader = read_gguf(gguf_path)
    meta = metadata(reader)
    config = hf_config(meta, has_output=any(t.name == "output.weight" for t in reader.tensors), dtype=dtype)
    _check_tensors(reader, config)
    tokenizer = build_tokenizer(meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.partial-{secrets.token_hex(4)}"  # beside it: the rename stays on one disk
    staging.mkdir()
    try:
        _write_folder(staging, reader, config, meta, tokenizer, dtype, Path(gguf_path).name, progress)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(staging, out)  # one rename: the folder appears whole or not at all
    except BaseException:  # KeyboardInterrupt too: no half-written folder stays behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _write_folder(out: Path, reader, config: dict, meta: dict, tokenizer, dtype: str, source: str, progress: bool):
    """The five files of the Hugging Face folder, written into `out`."""
    from tqdm import tqdm

    weights = {}
    for tensor in tqdm(reader.tensors, desc="dequantize", unit="tensor", disable=not progress):
        name, weight = hf_tensor(tensor, config)
        weights[name] = torch.from_numpy(weight).to(getattr(torch, dtype))
    from safetensors.torch import save_file

    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt", "source": source})
    _write_json(out / "config.json", config)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    _write_json(out / "generation_config.json", {k: v for k, v in generation.items() if v is not None})
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config(meta))


def read_gguf(path: str | Path):
    """llama.cpp's reader over the file, once its header has been walked with every count bounded."""
    gguf = _gguf()
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model: GGUF file {str(path)!r} not found")
    regular_file(path, "GGUF file")  # a FIFO or a device is refused before it is opened
    try:
        checks.check_layout(path)  # its ValueError names the field or tensor at fault
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises ValueError, struct.error, ... on a damaged file
        raise ValueError(f"{path.name}: not a readable GGUF file ({e})") from None


def metadata(reader) -> dict:
    """Every metadata field as a plain Python value (lists for arrays)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        out[key] = value
    return out


def hf_config(meta: dict, has_output: bool, dtype: str = "float32") -> dict:
    """config.json for Hugging Face's LlamaForCausalLM, from the GGUF metadata."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"general.architecture: {arch!r} is not supported; this converter reads {ARCHITECTURES}")

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ValueError(f"{arch}.rope.scaling.type: {scaling!r} is not supported (only unscaled RoPE)")
    heads = checks.count(meta, f"{arch}.attention.head_count")
    kv_heads = checks.count(meta, f"{arch}.attention.head_count_kv", default=heads)
    if heads % kv_heads:
        raise ValueError(f"{arch}.attention.head_count_kv: {kv_heads} does not divide head_count ({heads})")
    hidden = checks.count(meta, f"{arch}.embedding_length")
    tokens = checks.string_list(meta, "tokenizer.ggml.tokens")
    vocab = checks.count(meta, f"{arch}.vocab_size", default=len(tokens))
    if vocab != len(tokens):  # llama.cpp's vocabulary is the token list; the embedding has one row per token
        raise ValueError(f"{arch}.vocab_size: {vocab}, but tokenizer.ggml.tokens lists {len(tokens)} tokens")
    special = [f"tokenizer.ggml.{kind}_token_id" for kind in ("bos", "eos", "padding", "unknown")]
    bos, eos, _, _ = (checks.token_id(meta, key, vocab) for key in special)  # each a token of the vocabulary
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": checks.count(meta, f"{arch}.feed_forward_length"),
        "num_hidden_layers": checks.count(meta, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": checks.head_dim(meta, arch, hidden, heads),
        "max_position_embeddings": checks.count(meta, f"{arch}.context_length"),
        "rms_norm_eps": _float32(checks.number(meta, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32(checks.number(meta, f"{arch}.rope.freq_base", default=10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": not has_output,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": dtype,
    }


def _float32(x) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def _check_tensors(reader, config: dict) -> None:
    """Each tensor of a supported type and a Llama's name; then all of them, of the shapes the config implies."""
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in SUPPORTED_TYPES:
            raise ValueError(f"{tensor.name}: tensor type {kind} is not supported (supported: {SUPPORTED_TYPES})")
        _hf_name(tensor.name, config)
    checks.check_shapes(reader.tensors, config, "llama.block_count")


def _hf_name(name: str, config: dict) -> str:
    base, _, suffix = name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES and parts[1].isdigit():
        if int(parts[1]) < config["num_hidden_layers"]:
            return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    elif base in _GLOBAL_NAMES and suffix == "weight":
        return f"{_GLOBAL_NAMES[base]}.weight"
    raise ValueError(f"{name}: not a tensor of a Llama model (rope_freqs and other extras are not supported)")


def hf_tensor(tensor, config: dict) -> tuple[str, np.ndarray]:
    """One GGUF tensor as (Hugging Face name, float32 array in Hugging Face's shape)."""
    gguf = _gguf()
    name = _hf_name(tensor.name, config)
    weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    # GGUF lists dimensions innermost first; numpy (and Hugging Face) outermost first.
    weight = np.array(weight.reshape(tuple(int(d) for d in reversed(tensor.shape))), dtype=np.float32)  # a copy
    if name.endswith("q_proj.weight"):
        weight = unpermute(weight, config["num_attention_heads"])
    elif name.endswith("k_proj.weight"):
        weight = unpermute(weight, config["num_key_value_heads"])
    return name, weight


def unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order: per head, rows (0, D/2, 1, D/2+1, ...) back to (0, 1, ..., D-1).

    llama.cpp's convert_hf_to_gguf.py writes w.reshape(heads, 2, D/2, in).swapaxes(1, 2); this is its inverse.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def build_tokenizer(meta: dict):
    """The `tokenizers` byte-level BPE that the GGUF's vocabulary, merges and pre-tokenizer name describe."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"tokenizer.ggml.model: {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre: {pre!r} is not supported (known: {', '.join(_PRE_TOKENIZERS)})")
    tokens = checks.tokenizer_tokens(meta)
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = HFTokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if _PRE_TOKENIZERS[pre]:
        digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
        tok.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=ty == _CONTROL, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in special if a.special])
    tok.add_tokens([a for a in special if not a.special])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], int(bos))]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    from pagedlab.model.tokenizer import Tokenizer

    return Tokenizer(tok)


def tokenizer_config(meta: dict) -> dict:
    """tokenizer_config.json: the chat template and the special tokens' text, as Hugging Face writes them."""
    tokens = meta["tokenizer.ggml.tokens"]

    def text(key: str):
        i = meta.get(key)
        return None if i is None else tokens[int(i)]

    out = {
        "bos_token": text("tokenizer.ggml.bos_token_id"),
        "eos_token": text("tokenizer.ggml.eos_token_id"),
        "pad_token": text("tokenizer.ggml.padding_token_id"),
        "unk_token": text("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    return {k: v for k, v in out.items() if v is not None}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
