"""Stage 2: what KV cache groups save a hybrid model: the same requests' K/V under three layouts, blocks counted by
the real managers.

Builds on: kv/cache_groups.py (the groups vLLM forms), kv/paged.py (PagedKVCacheManager: a full layer's blocks,
and with a window a sliding layer's), request.py.
Read with: chapters/02-paged-blocks.md (Sliding windows).

For each model shape and each request (its prompt fed in chunks of CHUNK tokens, as chunked prefill feeds a long
prompt, then one token a step to its length), a PagedKVCacheManager of each layer kind allocates what the request
needs and frees what falls behind a window; the request's peak of blocks held is taken per kind. (A window frees
only what lies behind the step's first query: a prompt fed whole would hold all its blocks for that one step.)
A layout then costs, per request:

    full-only     every layer keeps every block: the whole model as if no layer had a window
    hybrid        vLLM's groups: each group its kind's peak blocks x its layer slots (padding included)
    window-only   every layer slides: a floor no real hybrid model reaches (its full layers need the context)

in bytes: blocks x layer slots x block_size x 2 (K and V) x KV heads x head_dim x bytes per element. Nothing runs a
model and no engine keeps a table per group yet (issue 41): the counts are the managers', the layouts arithmetic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pagedlab.kv.cache_groups import kv_cache_groups
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams

BLOCK_SIZE = 16  # vLLM's default
CHUNK = 512  # prompt tokens fed per step (chunked prefill)
NUM_REQUESTS = 40
SEED = 0


@dataclass(frozen=True)
class Shape:
    """The part of a model's config.json that sizes its KV cache."""

    name: str
    layer_windows: tuple[int | None, ...]  # each layer's sliding window (None: full attention)
    num_kv_heads: int
    head_dim: int
    bytes_per_element: int  # 2: bfloat16

    def block_bytes(self, block_size: int = BLOCK_SIZE) -> int:
        """One layer's K and V for one block."""
        return 2 * block_size * self.num_kv_heads * self.head_dim * self.bytes_per_element


SHAPES = (  # as their config.json files on the Hugging Face Hub describe them (layer_types, windows, KV heads)
    Shape("gpt-oss-20b", (128, None) * 12, 8, 64, 2),  # 24 layers: sliding 128 and full, alternating
    Shape("gemma-3-4b", (((1024,) * 5 + (None,)) * 6)[:34], 4, 256, 2),  # 34 layers: five sliding 1024 to a full
)


def request_lengths(n: int = NUM_REQUESTS, seed: int = SEED) -> list[tuple[int, int]]:
    """(prompt, output) tokens: prompts of 256 to 8192 and outputs of 64 to 1024, log-uniform (long contexts are
    where windows pay)."""
    rng = random.Random(seed)
    return [(int(256 * 32 ** rng.random()), int(64 * 16 ** rng.random())) for _ in range(n)]


def peak_blocks(window: int | None, prompt: int, output: int, block_size: int = BLOCK_SIZE) -> int:
    """The most blocks one layer kind holds for a request over its life, as the real manager allocates and frees."""
    total = prompt + output
    kv = PagedKVCacheManager(total // block_size + 2, block_size, total, window or 0)
    request = Request("r", [0] * prompt, SamplingParams(max_tokens=output), output, ())
    peak = 0
    while request.num_computed_tokens < total - 1:  # the last sampled token is never fed back
        left = prompt - request.num_computed_tokens
        new = min(CHUNK, left) if left > 0 else 1
        if kv.allocate_slots(request, new) is None:
            raise AssertionError("the pool was sized for the whole request")
        peak = max(peak, kv.num_used_blocks)
        request.num_computed_tokens += new
    return peak


def layout_bytes(shape: Shape, lengths: list[tuple[int, int]]) -> dict[str, int]:
    """Bytes held at their peaks by `lengths`' requests, summed, under each layout."""
    kinds = set(shape.layer_windows)
    per_kind = {w: sum(peak_blocks(w, p, o) for p, o in lengths) for w in kinds}
    layers, block = len(shape.layer_windows), shape.block_bytes()
    hybrid = sum(per_kind[g.window] * g.size for g in kv_cache_groups(shape.layer_windows))
    windows = [w for w in kinds if w is not None]
    return {
        "full-only": per_kind[None] * layers * block,
        "hybrid": hybrid * block,
        "window-only": min(per_kind[w] for w in windows) * layers * block,
    }


def saving_rows(lengths: list[tuple[int, int]] | None = None) -> list[dict]:
    """One row per shape and layout: GiB held, and the share of full-only's."""
    lengths = lengths or request_lengths()
    rows = []
    for shape in SHAPES:
        held = layout_bytes(shape, lengths)
        groups = kv_cache_groups(shape.layer_windows)
        rows += [{"model": shape.name, "layout": layout, "groups": len(groups) if layout == "hybrid" else 1,
                  "gib": value / 2**30, "share_of_full": value / held["full-only"]}
                 for layout, value in held.items()]  # fmt: skip
    return rows


TABLE_HEAD = "| model (layers) | groups | full-only | hybrid: vLLM's groups | window-only |\n|---|---|---|---|---|"


def table_lines(rows: list[dict] | None = None) -> list[str]:
    """The chapter's table (chapters/02-paged-blocks.md, Sliding windows), one line per model; a test holds the
    chapter to it."""
    rows = rows or saving_rows()
    lines = [TABLE_HEAD]
    for shape in SHAPES:
        r = {x["layout"]: x for x in rows if x["model"] == shape.name}
        windows = [w for w in shape.layer_windows if w is not None]
        layers = f"{len(windows)} sliding of {windows[0]} : {shape.layer_windows.count(None)} full"
        held = [_held(r[layout], layout != "full-only") for layout in ("full-only", "hybrid", "window-only")]
        lines.append(f"| {shape.name} ({layers}) | {r['hybrid']['groups']} | {' | '.join(held)} |")
    return lines


def _held(row: dict, with_share: bool) -> str:
    return f"{row['gib']:.2f} GiB" + (f" ({100 * row['share_of_full']:.1f} %)" if with_share else "")
