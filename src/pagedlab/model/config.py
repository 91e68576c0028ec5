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

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from pagedlab.model.files import read_model_json

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "llama3")
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
    # Sliding-window attention, per layer: None = full attention; W = the query at position i sees keys
    # i - W < j <= i (W keys, itself included: transformers' `kv_idx > q_idx - sliding_window`).
    layer_windows: tuple[int | None, ...] = ()

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def kv_window(self) -> int | None:
        """The window the KV cache may forget behind: every layer's, if every layer has one (their largest)."""
        if not self.layer_windows or any(w is None for w in self.layer_windows):
            return None
        return max(self.layer_windows)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def num_parameters(self) -> int:
        """Weights of the module this config builds (what the loader will read), counted from the shapes alone."""
        e, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = e * q + 2 * e * kv + q * e
        attention += (q + 2 * kv) * self.attention_bias + e * self.o_proj_bias + 2 * self.head_dim * self.qk_norm
        mlp = 3 * e * self.intermediate_size + (2 * self.intermediate_size + e) * self.mlp_bias
        layer = attention + mlp + 2 * e  # + two RMSNorms
        embeddings = self.vocab_size * e * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_hidden_layers * layer + e  # + the final norm

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> ModelConfig:
        arch = _architecture(cfg, source)
        read = _Reader(cfg, source)
        heads, kv_heads, head_dim = _heads(read, source)
        windows = _layer_windows(cfg, read, arch, read.integer("num_hidden_layers"), source)
        theta, scaling = _rope(cfg, read, source)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        bias = is_qwen2 or read.flag("attention_bias")
        return cls(
            architecture=arch,
            vocab_size=read.integer("vocab_size"),
            hidden_size=read.integer("hidden_size"),
            intermediate_size=read.integer("intermediate_size"),
            num_hidden_layers=read.integer("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=read.integer("max_position_embeddings", default=2048),
            rms_norm_eps=read.number("rms_norm_eps", default=1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            attention_bias=bias,
            o_proj_bias=bias and not is_qwen2,
            mlp_bias=read.flag("mlp_bias"),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=read.flag("tie_word_embeddings"),
            bos_token_id=read.integer("bos_token_id", default=None, minimum=0),
            eos_token_ids=read.token_ids("eos_token_id"),
            torch_dtype=read.string("torch_dtype", default=None) or read.string("dtype", default="float32"),
            layer_windows=windows,
        ).check_token_ids(source)

    def check_token_ids(self, source: str) -> ModelConfig:
        """bos and eos ids must name tokens of the vocabulary: an eos the model can never sample never stops it."""
        for name, ids in (("bos_token_id", (self.bos_token_id,)), ("eos_token_id", self.eos_token_ids)):
            bad = [t for t in ids if t is not None and t >= self.vocab_size]
            if bad:
                raise ValueError(
                    f"{source}: field '{name}' is {bad[0]}, outside the vocabulary (0 .. {self.vocab_size - 1})"
                )
        return self

    @staticmethod
    def token_ids_field(cfg: dict, name: str, source: str) -> tuple[int, ...]:
        """A token id or a list of them, as config.json and generation_config.json write EOS ids."""
        return _Reader(cfg, source).token_ids(name)

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        """config.json (or another name) of a folder, read through model/files.py's checks."""
        path = Path(path)
        return cls.from_dict(read_model_json(path.parent, path.name), source=str(path))


_REQUIRED = object()  # a field with no default
# The fields whose JSON null means "the default", because transformers types them `X | None` too
# (LlamaConfig's num_key_value_heads, head_dim, ...). Anywhere else transformers refuses a null
# ("expected float, got NoneType"), so pagedlab does: `rms_norm_eps: null` is no model.
_NULLABLE = frozenset({"num_key_value_heads", "head_dim", "bos_token_id", "eos_token_id", "sliding_window",
                       "layer_types", "torch_dtype", "dtype", "rope_scaling", "rope_parameters"})  # fmt: skip


class _Reader:
    """Typed reads of config.json fields: JSON null counts as absent; a wrong type or sign names the field."""

    def __init__(self, cfg: dict, source: str):
        self.cfg, self.source = cfg, source

    def _get(self, name: str, default):
        value = self.cfg.get(name)
        if value is None and default is _REQUIRED:
            raise ValueError(f"{self.source}: field '{name}' is missing")
        if value is None and name in self.cfg and name not in _NULLABLE:
            raise ValueError(f"{self.source}: field '{name}' is null; give it a value or leave it out")
        return value

    def _fail(self, name: str, wanted: str):
        return ValueError(f"{self.source}: field '{name}' must be {wanted}, got {self.cfg[name]!r}")

    def integer(self, name: str, default=_REQUIRED, minimum: int = 1):
        value = self._get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._fail(name, "a positive integer" if minimum == 1 else f"an integer >= {minimum}")
        return value

    def number(self, name: str, default) -> float:
        value = self._get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise self._fail(name, "a positive number")
        return float(value)

    def flag(self, name: str, default: bool = False) -> bool:
        value = self._get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(name, "true or false")
        return value

    def string(self, name: str, default):
        value = self._get(name, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._fail(name, "a string")
        return value

    def token_ids(self, name: str) -> tuple[int, ...]:
        """A token id or a list of them (Llama 3 lists several EOS ids)."""
        value = self._get(name, ())
        values = () if value is None else [value] if not isinstance(value, list) else value
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
            raise self._fail(name, "a token id or a list of token ids (integers >= 0)")
        return tuple(values)


def _heads(read: _Reader, source: str) -> tuple[int, int, int]:
    """(H, KVH, D): KVH divides H (grouped-query attention), D is even (RoPE rotates the halves of a head)."""
    heads = read.integer("num_attention_heads")
    kv_heads = read.integer("num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise ValueError(
            f"{source}: field 'num_key_value_heads' ({kv_heads}) must divide num_attention_heads ({heads})"
        )
    hidden = read.integer("hidden_size")
    head_dim = read.integer("head_dim", default=hidden // heads)
    if head_dim < 1:
        raise ValueError(f"{source}: field 'hidden_size' ({hidden}) is smaller than num_attention_heads ({heads})")
    if head_dim % 2:
        raise ValueError(f"{source}: field 'head_dim' is {head_dim}; RoPE needs an even head_dim")
    return heads, kv_heads, head_dim


def _layer_windows(cfg: dict, read, arch: str, num_layers: int, source: str) -> tuple[int | None, ...]:
    """Each layer's sliding window, as transformers reads the config (() when no layer has one).

    Mistral: every layer, when `sliding_window` is set. Qwen2 / Qwen3: only with `use_sliding_window`, on the
    layers `layer_types` marks "sliding_attention" (else those from `max_window_layers` on). Llama: none.
    """
    window = read.integer("sliding_window", default=None)
    flag = read.flag("use_sliding_window")  # read (and type-checked) whatever the architecture
    if arch == "LlamaForCausalLM" and (flag or window is not None):
        _warn_llama_window(source, "use_sliding_window" if flag else "sliding_window")
    if arch == "MistralForCausalLM":
        uses = window is not None
    else:  # Qwen2 / Qwen3 only with use_sliding_window; Llama has none
        uses = flag and arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
    if not uses:
        return ()
    if window is None:
        raise ValueError(f"{source}: field 'sliding_window' is missing although use_sliding_window is true")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or not set(types) <= {
            "full_attention", "sliding_attention"
        }:  # fmt: skip
            raise ValueError(f"{source}: field 'layer_types' must list 'full_attention' or 'sliding_attention' "
                             f"for each of the {num_layers} layers, got {types!r}")  # fmt: skip
        sliding = [t == "sliding_attention" for t in types]
    elif arch == "MistralForCausalLM":
        sliding = [True] * num_layers
    else:
        first = read.integer("max_window_layers", default=num_layers, minimum=0)
        sliding = [i >= first for i in range(num_layers)]
    windows = tuple(window if s else None for s in sliding)
    return windows if any(w is not None for w in windows) else ()


def _warn_llama_window(source: str, name: str) -> None:
    """A Llama folder that asks for a sliding window gets full attention, and is told so.

    transformers' LlamaConfig has no window fields: it keeps them as unknown attributes and its
    LlamaForCausalLM attends to every earlier token, so the folder's outputs are full attention's.
    pagedlab computes what transformers computes (a warning, not a refusal: the folder is a valid
    Llama), but never drops the field in silence: whoever wrote it may have meant a Mistral.
    """
    warnings.warn(
        f"{source}: field '{name}' is ignored: LlamaForCausalLM has full attention in every layer "
        "(as in transformers); use MistralForCausalLM or Qwen2ForCausalLM for a sliding window",
        stacklevel=4,
    )


def _architecture(cfg: dict, source: str) -> str:
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"{source}: field 'architectures' must be a list of class names, got {archs!r}")
    if not archs:
        by_type = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "qwen3": "Qwen3ForCausalLM"}  # fmt: skip
        if cfg.get("model_type") in by_type:
            return by_type[cfg["model_type"]]
        raise ValueError(f"{source}: field 'architectures' is missing (expected one of {SUPPORTED_ARCHITECTURES})")
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{source}: field 'architectures' is {archs[0]!r}; supported: {SUPPORTED_ARCHITECTURES}")
    return archs[0]


def _rope(cfg: dict, read: _Reader, source: str) -> tuple[float, dict | None]:
    """Return (rope_theta, scaling) from either the old or the transformers-5 keys."""
    key = "rope_parameters" if cfg.get("rope_parameters") is not None else "rope_scaling"
    params = cfg.get(key) or {}
    if not isinstance(params, dict):
        raise ValueError(f"{source}: field '{key}' must be an object, got {params!r}")
    scaling = _Reader(params, f"{source} ({key})")
    theta = scaling.number("rope_theta", default=None) or read.number("rope_theta", default=10000.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"{source}: field 'rope_type' is {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
    if rope_type == "default":
        return theta, None
    missing = [k for k in _LLAMA3_FIELDS if params.get(k) is None]
    if missing:
        raise ValueError(f"{source}: llama3 rope scaling needs field '{missing[0]}'")
    return theta, {"rope_type": "llama3", **{k: scaling.number(k, default=None) for k in _LLAMA3_FIELDS}}
