"""A tiny Llama written as a GGUF file by the test itself, as llama.cpp's converter writes one.

The source is a random transformers Llama with a byte-level BPE tokenizer trained on a few lines.
Its tensors are stored in the types of TENSOR_TYPES (quantized ones included), Q and K permuted as
llama.cpp's convert_hf_to_gguf.py permutes them. `roundtrip_model` is the source with every weight
replaced by what its quantized form decodes to: the float model the GGUF file really holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

TEXT = [
    "What is the capital of France? The capital of France is Paris.",
    "Write a haiku about the sea: waves fold into foam, salt wind, 1234 gulls.",
    "Explain photosynthesis in one sentence, please, and don't be long.",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\nHi! How can I help?<|im_end|>",
]
ROPE_THETA = 10000.0
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# HF tensor suffix -> GGUF type: every type the converter promises, quantized ones on the big matrices.
TENSOR_TYPES = {
    "embed_tokens.weight": "Q8_0",
    "q_proj.weight": "Q4_0",
    "k_proj.weight": "Q4_1",
    "v_proj.weight": "F16",
    "o_proj.weight": "BF16",
    "gate_proj.weight": "Q8_0",
    "up_proj.weight": "Q4_1",
    "down_proj.weight": "Q4_0",
    "lm_head.weight": "Q8_0",
}
_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def train_tokenizer(vocab_size: int = 320):
    """A byte-level BPE (GPT-2 style) tokenizer with ChatML's special tokens as ids 0-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT * 4, trainer)
    return tok


def _gguf_name(hf_name: str) -> str:
    if hf_name in _TO_GGUF:
        return _TO_GGUF[hf_name]
    _, _, layer, *rest = hf_name.split(".")
    module, suffix = ".".join(rest[:-1]), rest[-1]
    return f"blk.{layer}.{_LAYER[module]}.{suffix}"


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _type_of(hf_name: str) -> str:
    return next((t for suffix, t in TENSOR_TYPES.items() if hf_name.endswith(suffix)), "F32")


def write_tiny_gguf(path: Path, arch: str = "llama", extra_tensor=None, seed: int = 0):
    """Write the GGUF; returns (roundtrip transformers model, source tokenizer)."""
    import gguf
    import transformers

    tok = train_tokenizer()
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    config = transformers.LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.25,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    merges = tok.to_str()  # the trained merges, as "a b" strings
    import json

    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in json.loads(merges)["model"]["merges"]])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    roundtrip = {}
    for name, tensor in model.state_dict().items():
        w = tensor.numpy().astype(np.float32)
        if name.endswith("q_proj.weight"):
            w = _permute(w, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = _permute(w, config.num_key_value_heads)
        qtype = getattr(gguf.GGMLQuantizationType, _type_of(name))
        data = gguf.quants.quantize(w, qtype)
        writer.add_tensor(_gguf_name(name), data, raw_dtype=qtype)
        back = gguf.quants.dequantize(data, qtype).reshape(w.shape)
        if name.endswith("q_proj.weight"):
            back = _unpermute(back, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            back = _unpermute(back, config.num_key_value_heads)
        roundtrip[name] = torch.from_numpy(np.array(back, dtype=np.float32))
    if extra_tensor is not None:
        writer.add_tensor(*extra_tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model.load_state_dict(roundtrip)
    return model, tok


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
