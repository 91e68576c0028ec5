"""Stage 2: KV cache groups: a hybrid model's layers split as vLLM v1 splits them, one block table per group.

Builds on: nothing (plain data: each layer's sliding window, as model/config.py reads it).
Read with: chapters/02-paged-blocks.md (Sliding windows), chapters/97-architecture.md (Layout).

Models now mix layer kinds: gpt-oss alternates sliding-window and full-attention layers, Gemma 3 has five
sliding layers to each full one. A sliding layer never reads a block wholly behind its window again, a full layer
reads every block, so one block table cannot serve both: vLLM v1 keeps one table per *KV cache group*, a set of
layers of one kind, and every group allocates from one shared pool. Its rule
(vllm/v1/core/kv_cache_planning.py, _get_kv_cache_groups_uniform_page_size), for layers of one page size:

    1. bucket the layers by kind, in the order the kinds first appear:   sliding-8 (0, 2, 4, 5)   full (1, 3)
    2. group_size = the fewest layers of a kind (the "1" of an n:1 pattern), or the most, when the most is
       under 1.5 x the fewest (12 sliding + 13 full: pad to 13 each rather than cut 13 into 12 + 1)
    3. cut each bucket into cdiv(len, group_size) groups, layer i going to group i % n (layers[i::n]), so that
       every group spans the model's depth; a short group is padded (its padding slots hold no layer, yet a
       block of any group is group_size layers' K/V: padding is memory held for nothing)

       sliding-8 (0, 4)   sliding-8 (2, 5)   full (1, 3)        group_size 2: three tables per request

A block of the pool holds group_size layers' K/V for one group at a time; which group owns a block is the block
table's business, not the pool's. kv/hybrid.py keeps one table per group in this order (stages.make_kv_manager
builds it when a model's layers differ), and the runner gives each layer its own group's table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedlab.kv.block_pool import cdiv

PAD_RATIO = 1.5  # vLLM's heuristic: below this ratio of most to fewest layers, pad to the most


@dataclass(frozen=True)
class KVCacheGroup:
    """One group: layers of one kind sharing one block table per request."""

    window: int | None  # the layers' sliding window in tokens; None: full attention
    layers: tuple[int, ...]  # the model's layer indices, in order
    size: int  # layer slots in each of the group's blocks: len(layers) plus padding

    @property
    def num_padding(self) -> int:
        return self.size - len(self.layers)

    @property
    def kind(self) -> str:
        return "full" if self.window is None else f"sliding-{self.window}"


def kv_cache_groups(layer_windows: Sequence[int | None]) -> list[KVCacheGroup]:
    """The groups of a model whose layer i has sliding window layer_windows[i] (None: full attention), as
    vLLM forms them (the module docstring). One kind alone is one group of every layer."""
    if not layer_windows:
        raise ValueError("layer_windows: a model has at least one layer")
    buckets: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        buckets.setdefault(window, []).append(layer)
    fewest, most = min(map(len, buckets.values())), max(map(len, buckets.values()))
    size = most if most < fewest * PAD_RATIO else fewest
    groups = []
    for window, layers in buckets.items():
        n = cdiv(len(layers), size)
        groups += [KVCacheGroup(window, tuple(layers[i::n]), size) for i in range(n)]
    return groups
