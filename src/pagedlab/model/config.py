"""Foundation: the model's shape, read from a Hugging Face `config.json`.

Builds on: nothing.
Read with: chapters/00-overview.md (the model is the one thing every stage shares).

One `ModelConfig` describes every decoder pagedlab runs: Llama (with Llama-3
`rope_scaling`), Qwen2 (q/k/v biases) and Qwen3 (q/k RMSNorm). It accepts both
the older `rope_theta` + `rope_scaling` keys and transformers 5's
`rope_parameters`. Anything it cannot run faithfully is a `ValueError` naming
the file and the field, never a silently different model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "llama3")
_REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class ModelConfig:
    """The hyper-parameters of one Llama-family decoder."""

    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int  # rows of the embedding and of the LM head
    hidden_size: int  # width of the residual stream
    intermediate_size: int  # width of the SwiGLU MLP
    num_hidden_layers: int  # decoder layers
    num_attention_heads: int  # query heads (H)
    num_key_value_heads: int  # key/value heads (KVH); H % KVH == 0 (grouped-query attention)
    head_dim: int  # D, per head; hidden_size // H unless config.json says otherwise
    max_position_embeddings: int  # longest position the model was configured for
    rms_norm_eps: float  # epsilon inside every RMSNorm
    rope_theta: float  # RoPE base
    rope_scaling: dict | None = None  # None or {"rope_type": "llama3", ...}
    attention_bias: bool = False  # q/k/v (and for Llama o) projections carry a bias
    o_proj_bias: bool = False  # Qwen2 has q/k/v biases but no o bias; Llama's attention_bias covers o too
    mlp_bias: bool = False  # Llama's optional MLP biases
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before RoPE
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    bos_token_id: int | None = None  # prepended to string prompts when the tokenizer says so
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)  # generation stops at any of these
    torch_dtype: str = "float32"  # dtype the checkpoint was saved in

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> ModelConfig:
        arch = _architecture(cfg, source)
        for name in _REQUIRED_FIELDS:
            if not isinstance(cfg.get(name), int) or cfg[name] <= 0:
                raise ValueError(f"{source}: field '{name}' must be a positive integer, got {cfg.get(name)!r}")
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ValueError(
                f"{source}: field 'num_key_value_heads' ({kv_heads}) must divide num_attention_heads ({heads})"
            )
        if cfg.get("use_sliding_window"):
            raise ValueError(f"{source}: field 'use_sliding_window' is true; sliding-window attention is not supported")
        theta, scaling = _rope(cfg, source)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        bias = is_qwen2 or bool(cfg.get("attention_bias", False))
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=bias,
            o_proj_bias=bias and not is_qwen2,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_as_tuple(cfg.get("eos_token_id")),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
        )

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        try:
            cfg = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(f"{path}: config.json is missing") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(cfg, source=str(path))


def _architecture(cfg: dict, source: str) -> str:
    archs = cfg.get("architectures") or []
    if not archs:
        by_type = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
        if cfg.get("model_type") in by_type:
            return by_type[cfg["model_type"]]
        raise ValueError(f"{source}: field 'architectures' is missing (expected one of {SUPPORTED_ARCHITECTURES})")
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{source}: field 'architectures' is {archs[0]!r}; supported: {SUPPORTED_ARCHITECTURES}")
    return archs[0]


def _rope(cfg: dict, source: str) -> tuple[float, dict | None]:
    """Return (rope_theta, scaling) from either the old or the transformers-5 keys."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{source}: field 'rope_type' is {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
    if rope_type == "default":
        return theta, None
    missing = [k for k in _LLAMA3_FIELDS if k not in params]
    if missing:
        raise ValueError(f"{source}: llama3 rope scaling needs field '{missing[0]}'")
    return theta, {"rope_type": "llama3", **{k: float(params[k]) for k in _LLAMA3_FIELDS}}


def _as_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
