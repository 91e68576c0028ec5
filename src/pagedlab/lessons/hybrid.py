"""Stage 2: what KV cache groups save a hybrid model: the same requests' K/V under three layouts, blocks counted by
the real managers.

Builds on: kv/hybrid.py (HybridKVCacheManager: a table per group over one pool), kv/cache_groups.py (the groups
vLLM forms), kv/paged.py (PagedKVCacheManager: one kind of layer alone), request.py.
Read with: chapters/02-paged-blocks.md (Hybrid models: one table per group).

For each model shape and each request (its prompt fed in chunks of CHUNK tokens, as chunked prefill feeds a long
prompt, then one token a step to its length), the managers allocate what the request needs and free what falls
behind a window, and the request's peak of blocks held is taken. (A window frees only what lies behind the step's
first query: a prompt fed whole would hold all its blocks for that one step.) A layout then costs, per request:

    full-only     every layer keeps every block: the whole model as if no layer had a window
    hybrid        vLLM's groups: the coordinator's peak of blocks (every group's table together, one pool) x the
                  layer slots of a block (group_size, padding included)
    window-only   every layer slides: a floor no real hybrid model reaches (its full layers need the context)

in bytes: blocks x layer slots x block_size x 2 (K and V) x KV heads x head_dim x bytes per element. No model
runs: the counts are the managers', the bytes arithmetic (`pagedlab bench memory --layouts` prints them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pagedlab.kv.cache_groups import KVCacheGroup, kv_cache_groups
from pagedlab.kv.hybrid import HybridKVCacheManager
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
    return _peak(PagedKVCacheManager(total // block_size + 2, block_size, total, window or 0), prompt, output)


def hybrid_peak_blocks(groups: list[KVCacheGroup], prompt: int, output: int, block_size: int = BLOCK_SIZE) -> int:
    """The most blocks a request holds over its life in every group's table together, as the coordinator
    (kv/hybrid.py) allocates them from one pool and each windowed group frees behind its window."""
    total = prompt + output
    pool = len(groups) * (total // block_size + 2) + 1  # every group's whole table, and the null block
    return _peak(HybridKVCacheManager(PagedKVCacheManager, groups, pool, block_size, total), prompt, output)


def _peak(kv, prompt: int, output: int) -> int:
    """Feed one request through `kv` (its prompt in chunks of CHUNK, then a token a step) and return the most blocks
    in use at once; `kv`'s pool is sized for the whole request."""
    request = Request("r", [0] * prompt, SamplingParams(max_tokens=output), output, ())
    peak = 0
    while request.num_computed_tokens < prompt + output - 1:  # the last sampled token is never fed back
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
    groups = kv_cache_groups(shape.layer_windows)
    hybrid = sum(hybrid_peak_blocks(groups, p, o) for p, o in lengths) * groups[0].size  # one size: every group's
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


# --- the chapter's picture and exercises: one request through the coordinator, no model ---------------------------

PICTURE_WINDOWS = (8, None, 8, None)  # the qwen2-hybrid test model: sliding 8 and full, alternating


def grow(chunks: list[int], block_size: int = 4, num_kv_blocks: int = 24) -> list[tuple[list[int], ...]]:
    """One request of sum(chunks) prompt tokens fed in `chunks` through a HybridKVCacheManager of PICTURE_WINDOWS
    (stage 2's manager per group, nothing else running): its table in each group after each chunk."""
    groups = kv_cache_groups(PICTURE_WINDOWS)
    kv = HybridKVCacheManager(PagedKVCacheManager, groups, num_kv_blocks, block_size, 64)
    request = Request("A", list(range(3, 3 + sum(chunks))), SamplingParams(max_tokens=1), 1, ())
    tables = []
    for chunk in chunks:
        if kv.allocate_slots(request, chunk) is None:
            raise AssertionError("the pool was sized for the request")
        request.num_computed_tokens += chunk
        tables.append(kv.get_block_ids(request))
    return tables


def picture_lines(chunks: tuple[int, ...] = (8, 8, 8, 6)) -> list[str]:
    """The chapter's picture: request A's two tables after each chunk (block 0 is the null block)."""
    groups = kv_cache_groups(PICTURE_WINDOWS)
    names = [f"{g.kind} (layers {', '.join(map(str, g.layers))})" for g in groups]
    width = max(map(len, names))
    lines, computed = [], 0
    for chunk, tables in zip(chunks, grow(list(chunks))):
        computed += chunk
        lines.append(f"after {computed} tokens:")
        lines += [f"  {name:<{width}}  " + " ".join(f"[{b}]" for b in t) for name, t in zip(names, tables)]
    return lines


def hit_tokens(full_cached: tuple[int, ...], window_cached: tuple[int, ...], window: int = 9, block_size: int = 4,
               prompt: int = 30) -> int:  # fmt: skip
    """The prefix-cache hit (tokens) of a `prompt`-token request on a model of one full and one sliding layer when
    the full group has the blocks `full_cached` of its prompt cached and the window's group `window_cached`."""
    from pagedlab.kv.prefix import PrefixCachingKVCacheManager

    groups = kv_cache_groups((None, window))
    kv = HybridKVCacheManager(PrefixCachingKVCacheManager, groups, 32, block_size, 64)
    request = Request("B", list(range(3, 3 + prompt)), SamplingParams(max_tokens=1), 1, ())
    kv.get_computed_blocks(request)  # the request's block hashes
    blocks = kv.pool.allocate(len(full_cached) + len(window_cached))
    for m, cached, mine in zip(kv.managers, (full_cached, window_cached), (blocks[: len(full_cached)],
                                                                              blocks[len(full_cached) :])):  # fmt: skip
        for i, block in zip(cached, mine):
            m.pool.index.insert(block, request.block_hashes[i])
    kv.pool.free(blocks)  # free, still cached
    return kv.num_hit_tokens(kv.get_computed_blocks(request))


def fig_02_hybrid_tables(out_dir: Path) -> Path:
    """Request A's two block tables after each chunk (picture_lines' run): one row per KV cache group, the null
    block where the window dropped a block, one colour per group."""
    from pagedlab import viz
    from pagedlab.lessons.common import _save

    chunks = (8, 8, 8, 6)
    groups = kv_cache_groups(PICTURE_WINDOWS)
    colours = (viz.CACHED, viz.USED)  # one per group (sliding, full)
    fig, axes = viz.plt.subplots(len(chunks), 1, figsize=(7.5, 5.2))
    computed = 0
    for ax, chunk, tables in zip(axes, chunks, grow(list(chunks))):
        computed += chunk
        for row, (group, table, colour) in enumerate(zip(groups, tables, colours)):
            y = len(groups) - 1 - row
            ax.text(-0.2, y + 0.45, f"{group.kind} (layers {', '.join(map(str, group.layers))})", ha="right",
                    va="center", fontsize=8)  # fmt: skip
            for i, block in enumerate(table):
                null = block == 0
                ax.add_patch(viz.plt.Rectangle((i, y), 0.92, 0.9, color=viz.FREE if null else colour))
                ax.text(i + 0.46, y + 0.45, "∅" if null else str(block), ha="center", va="center", fontsize=8,
                        color="black" if null else "white")  # fmt: skip
        ax.set_xlim(-4.2, 8.2)
        ax.set_ylim(-0.1, len(groups))
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"after {computed} prompt tokens", fontsize=9, loc="left")
    fig.suptitle("One request, one block table per KV cache group, one pool (∅: the null block)", fontsize=10)
    return _save(fig, Path(out_dir) / "02_hybrid_tables.png")
