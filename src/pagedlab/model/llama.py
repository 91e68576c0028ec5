"""Foundation: a Llama-family decoder in plain torch (Llama, Qwen2, Qwen3).

Builds on: model/config.py (hyper-parameters), attention/base.py (the backend contract).
Read with: chapters/00-overview.md.

The module tree copies Hugging Face's parameter names (`model.layers.0.self_attn.q_proj`,
...) so a checkpoint loads with a plain `load_state_dict`. Tokens of every
request in a step are flattened into one dimension T, as vLLM does, and
attention is handed to a backend with the metadata the runner built; the model
itself keeps no cache and knows no stage.

Shapes: T tokens, E = hidden_size, H query heads, KVH key/value heads, D = head_dim, V = vocab.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pagedlab.attention.base import AttentionBackend
from pagedlab.model.config import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 as Hugging Face does (then cast back before the weight)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op: x * rsqrt(mean(x^2) + eps) * weight
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2] of rotary embeddings, with Llama-3 scaling when configured."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if cfg.rope_scaling is None:
        return inv_freq
    s = cfg.rope_scaling
    # Llama 3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s["factor"], inv_freq)
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"]
    )
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype):
    """cos [T, 1, D] and signed sin [T, 1, D] for every position of a step, once per forward pass (not per layer).

    The 'rotate half' layout pairs dimension i with i + D/2: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    With the halves of x swapped (a roll by D/2) and sin's first half negated, that is x * cos + roll(x) * sin."""
    freqs = positions[:, None].float() * inv_freq[None, :]  # [T, D/2]
    cos, sin = freqs.cos(), freqs.sin()
    return torch.cat((cos, cos), -1)[:, None].to(dtype), torch.cat((-sin, sin), -1)[:, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, D] by per-position angles: rope_tables' cos and signed sin [T, 1, D]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        e, hd, kvd = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        self.q_proj = nn.Linear(e, hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(e, kvd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(e, kvd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(hd, e, bias=cfg.o_proj_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x, cos, sin, attn: AttentionBackend, metadata: Any) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)  # [T, E] -> [T, H, D]
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)  # [T, E] -> [T, KVH, D]
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)  # [T, E] -> [T, KVH, D]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attn.forward(self.layer_idx, q, k, v, metadata)  # [T, H, D]
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))  # [T, H, D] -> [T, H*D]


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, attn, metadata):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """Hugging Face's `model.*`: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """The decoder plus its LM head. `forward` returns hidden states; `compute_logits` the logits.

    Splitting the two lets a runner project only the rows it samples from (the
    last token of each request), as vLLM does: a 200-token prefill needs one
    row of logits, not 200.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = DecoderStack(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend, metadata: Any
    ) -> torch.Tensor:
        """input_ids, positions: [T] -> hidden states [T, E]."""
        x = self.model.embed_tokens(input_ids)  # [T, E]
        cos, sin = rope_tables(self.inv_freq, positions, x.dtype)  # [T, 1, D] each
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn, metadata)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, E] -> [N, V] in float32 (sampling always works in float32)."""
        return self.lm_head(hidden).float()
