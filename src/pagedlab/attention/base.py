"""Foundation: the contract between the model and an attention backend.

Builds on: nothing.
Read with: chapters/00-overview.md.

The model never knows which stage it runs in. Each decoder layer computes q, k
and v for the step's tokens and hands them to a backend together with explicit
metadata that the runner built for this step (no module globals). What the
backend does with them is the whole difference between stages: recompute
everything (the oracle), keep a contiguous cache (stage 1), a paged cache
(stages 2-5) or run Triton kernels over it (stage 6).

Shapes (defined once here and used in every backend):
    T   = tokens in this step, all requests flattened together
    H   = query heads, KVH = key/value heads, D = head_dim
    q: [T, H, D]   k, v: [T, KVH, D]   -> out: [T, H, D]
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class AttentionBackend(Protocol):
    """Anything with these two methods can serve the model's attention."""

    name: str  # what `llm.engine.attention_backend` reports

    def prepare(self, metadata: Any) -> None:
        """Once per step, before the first layer: work every layer would repeat (most backends: none)."""

    def forward(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: Any
    ) -> torch.Tensor: ...


class LayerWindows:
    """Each layer's sliding window, set on a backend by stages.make_attention (None: full attention)."""

    windows: tuple[int | None, ...] = ()  # () = no layer has one

    def window(self, layer_idx: int) -> int | None:
        return self.windows[layer_idx] if self.windows else None


def allocate_kv_cache(num_layers, num_kv_blocks, block_size, num_kv_heads, head_dim, dtype, device) -> torch.Tensor:
    """One tensor for the whole cache, [layers, 2 (k, v), num_kv_blocks, block_size, KVH, D]: every cached
    backend of every stage reads this layout.

    kv_cache[layer] unpacks into that layer's (k, v); a block copy or swap of
    every layer at once is one indexing op on dimension 2.
    """
    shape = (num_layers, 2, num_kv_blocks, block_size, num_kv_heads, head_dim)
    return torch.zeros(shape, dtype=dtype, device=device)


def repeat_kv(x: torch.Tensor, num_queries_per_kv: int) -> torch.Tensor:
    """[..., KVH, D] -> [..., H, D]: each KV head serves `num_queries_per_kv` query heads (GQA)."""
    if num_queries_per_kv == 1:
        return x
    return x.repeat_interleave(num_queries_per_kv, dim=-2)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None
) -> torch.Tensor:
    """Attention of the last `Tq` positions of a sequence over its last `Tk` keys.

    q: [Tq, H, D], k/v: [Tk, H, D] with Tk >= Tq; query i sits at position Tk - Tq + i
    and sees keys 0 .. Tk - Tq + i (counted from the first key given). With a sliding `window` W,
    it sees only the keys j with i' - W < j <= i' (i' its position): W keys, itself included, as
    transformers' `kv_idx > q_idx - sliding_window`. Computed in float32 for every dtype.
    """
    tq, tk = q.shape[0], k.shape[0]
    qh, kh, vh = q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1)  # [H, T*, D]
    scores = torch.matmul(qh, kh.transpose(1, 2)) * scale  # [H, Tq, Tk]
    q_pos = torch.arange(tk - tq, tk, device=q.device)[:, None]
    k_pos = torch.arange(tk, device=q.device)[None, :]
    hidden = k_pos > q_pos if window is None else (k_pos > q_pos) | (k_pos <= q_pos - window)
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, vh).transpose(0, 1).to(q.dtype)  # [H, Tq, D] -> [Tq, H, D]


class NoCacheAttention(LayerWindows):
    """The oracle's backend: every call sees whole sequences, so nothing is cached.

    metadata: `query_start_loc`, a list [0, len0, len0+len1, ...] cutting the
    flattened tokens into sequences; each sequence attends causally to itself.
    """

    name = "no-cache"

    def __init__(self, num_queries_per_kv: int, head_dim: int, windows: tuple[int | None, ...] = ()):
        self.num_queries_per_kv = num_queries_per_kv
        self.scale = head_dim**-0.5
        self.windows = windows  # each layer's sliding window (None: full attention); () = none anywhere

    def forward(self, layer_idx, q, k, v, metadata):
        out = torch.empty_like(q)
        bounds = metadata.query_start_loc
        window = self.window(layer_idx)
        for start, end in zip(bounds[:-1], bounds[1:]):
            kk = repeat_kv(k[start:end], self.num_queries_per_kv)  # [len, H, D]
            vv = repeat_kv(v[start:end], self.num_queries_per_kv)
            out[start:end] = causal_attention(q[start:end], kk, vv, self.scale, window)
        return out


def window_start(seq_len: int, first_query_pos: int, window: int | None) -> int:
    """The first context position any of a request's queries can see (0 without a window): keys before
    it are never read, so their blocks may be gone (kv/paged.py frees them)."""
    return 0 if window is None else max(0, first_query_pos - window + 1)
