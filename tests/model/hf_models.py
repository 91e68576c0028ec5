"""Tiny random Hugging Face models, built offline, for parity tests.

The init range is large (0.25 instead of 0.02) so that logits are spread out
and greedy choices are not decided by float noise.
"""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.25,
    bos_token_id=1,
    eos_token_id=2,
)

KINDS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            "rope_theta": 500000.0,
        },
    ),
    "llama-tied-bias": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True},
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": False}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    # Sliding windows of 8 (chapters/02-paged-blocks.md, Sliding windows): every layer, or the second only.
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8, "head_dim": 16}),
    "qwen2-window": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0},
    ),
    "qwen2-mixed": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    # A hybrid model as transformers' newer configs write one (gpt-oss, Gemma): `layer_types`, layer by layer.
    "qwen2-hybrid": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            "use_sliding_window": True,
            "sliding_window": 8,
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        },
    ),
}


def build_hf_model(kind: str, seed: int = 0):
    """A random transformers model of the given kind, float32, eval mode."""
    import transformers

    config_cls, model_cls, extra = KINDS[kind]
    config = getattr(transformers, config_cls)(**(COMMON | extra))
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).float().eval()
    return model


def save_hf_model(kind: str, folder: Path, seed: int = 0, **save_kwargs):
    model = build_hf_model(kind, seed)
    model.save_pretrained(folder, safe_serialization=True, **save_kwargs)
    return model


def greedy_folders(tmp_path_factory, kinds, prompts: list[list[int]], max_new_tokens: int) -> dict:
    """kind -> (a saved tiny model's folder, transformers' greedy tokens for each prompt, EOS ignored)."""
    out = {}
    for kind in kinds:
        folder = tmp_path_factory.mktemp(kind)
        hf = save_hf_model(kind, folder)
        with torch.no_grad():
            want = [
                hf.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None)[
                    0, len(p) :
                ].tolist()
                for p in prompts
            ]
        out[kind] = (folder, want)
    return out
