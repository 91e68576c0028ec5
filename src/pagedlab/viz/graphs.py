"""Stage 3: graphviz drawings of shared blocks: requests -> blocks with ref counts, and beam trees.

Builds on: viz/palette.py (the fixed colours), kv/cow.py (ref counts), sched/beam.py.
Read with: chapters/03-copy-on-write.md.

Two pictures, both built from plain block tables so notebooks can draw any moment:

    block_sharing_graph:  request ──logical i──▶ [block 7 | ref_cnt 2]   (shared blocks in SHARED colour)
    beam_block_tree:      the union of the live beams' block tables is a tree: the prompt's blocks
                          at the root, one branch per fork, one leaf per beam

Stage 4 adds a third, built from requests' block hashes and the prefix cache (chapters/04-prefix-caching.md):

    hash_chain_tree:      NONE_HASH ──▶ [block 0 | #768d6fe2] ──▶ ...  one node per chained hash, shared
                          prefixes merged; cached-but-free blocks in CACHED colour, evicted hashes dashed

Rendering a Digraph to a file needs Graphviz's `dot` program; building one does not. `dot_available` is
the one place that asks whether it is on PATH. Without it nothing fails: `save_graph` skips the file, a
drawing shown in a notebook is one line saying how to install `dot`, and `pagedlab figures` names every
figure it skipped in one line (`DotNotFound`, which `require_dot` raises).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import graphviz

from pagedlab.kv.hybrid import one_table
from pagedlab.viz import CACHED, FREE, SHARED, USED, request_colour
from pagedlab.viz.graph_plot import GraphModel, plot_graph

INSTALL_DOT = (
    "install it with `apt-get install graphviz`, `brew install graphviz` or `conda install -c conda-forge graphviz`"
    " (pip's `graphviz` is only the Python side)"
)


def dot_available() -> bool:
    """Whether Graphviz's `dot` is on PATH. Looked up on every call: it is cheap, and tests hide `dot` by PATH."""
    return shutil.which("dot") is not None


def dot_missing_line(skipped: Iterable[str | Path]) -> str:
    """The one line that says which drawings were skipped without `dot`, and how to install it."""
    return f"graphviz's `dot` not found: skipped {', '.join(map(str, skipped))}; {INSTALL_DOT}"


class DotNotFound(RuntimeError):
    """`path` needs Graphviz's `dot` to be drawn, and `dot` is not on PATH; nothing was written."""

    def __init__(self, path: str | Path):
        super().__init__(dot_missing_line([path]))
        self.path = Path(path)


def require_dot(path: str | Path) -> None:
    """Raise DotNotFound(path) unless `dot` is on PATH: for a caller that collects skipped drawings itself."""
    if not dot_available():
        raise DotNotFound(path)


class Drawing(graphviz.Digraph):
    """A graphviz.Digraph that also keeps its nodes and edges as plain data (`model`), so that without `dot` a
    notebook still shows it: drawn by matplotlib instead (viz/graph_plot.py), with one line saying so."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model = GraphModel(title=self.graph_attr.get("label", ""), node_defaults=dict(self.node_attr))

    def node(self, name, label=None, _attributes=None, **attrs):
        self.model.add_node(name, label, attrs)
        super().node(name, label, _attributes=_attributes, **attrs)

    def edge(self, tail_name, head_name, label=None, _attributes=None, **attrs):
        self.model.add_edge(tail_name, head_name, label, attrs)
        super().edge(tail_name, head_name, label, _attributes=_attributes, **attrs)

    def plot(self):
        """This drawing as a matplotlib Figure, laid out without Graphviz."""
        return plot_graph(self.model)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        if dot_available():
            return super()._repr_mimebundle_(include, exclude, **kwargs)
        return {"image/png": _png(self.plot()), "text/plain": dot_missing_line(["Graphviz's layout"]) + FALLBACK}


FALLBACK = "; drawn with matplotlib instead"


def _png(fig) -> bytes:
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _block_label(block_id: int, refs: int, text: str | None = None) -> str:
    lines = [f"block {block_id}", f"ref_cnt {refs}"]
    if text is not None:
        lines.append(repr(text)[1:-1][:12])
    return "\\n".join(lines)


def block_sharing_graph(block_tables: dict[str, list[int]], title: str = "", copies=()) -> Drawing:
    """Requests on the left, physical blocks on the right; an edge per block-table entry.

    A block's ref_cnt is the number of tables holding it; ref_cnt > 1 is drawn in the shared colour.
    `copies` (a step's `block_copies`, or (src, dst) pairs) are drawn as dashed copy-on-write arrows.
    """
    refs: dict[int, int] = {}
    for table in block_tables.values():
        for block_id in table:
            refs[block_id] = refs.get(block_id, 0) + 1
    g = Drawing(
        graph_attr={"rankdir": "LR", "label": title, "labelloc": "t", "fontname": "Helvetica"},
        node_attr={"fontname": "Helvetica", "fontsize": "11"},
    )
    for i, (req_id, table) in enumerate(block_tables.items()):
        g.node(
            f"r_{req_id}",
            f"request {req_id}",
            shape="box",
            style="rounded,filled",
            fillcolor=request_colour(i),
            fontcolor="white",
        )
        for logical, block_id in enumerate(table):
            g.edge(f"r_{req_id}", f"b_{block_id}", label=str(logical), color=request_colour(i))
    for block_id, n in sorted(refs.items()):
        g.node(
            f"b_{block_id}",
            _block_label(block_id, n),
            shape="box",
            style="filled",
            fillcolor=SHARED if n > 1 else USED,
            fontcolor="white",
        )
    for src, dst in ((c.src, c.dst) if hasattr(c, "src") else c for c in copies):
        g.edge(f"b_{src}", f"b_{dst}", label="copy", style="dashed", color="black", constraint="false")
    return g


def beam_block_tree(
    block_tables: dict[str, list[int]],
    token_ids: dict[str, list[int]],
    block_size: int,
    decode: Callable[[list[int]], str] | None = None,
    title: str = "",
) -> Drawing:
    """The live beams' block tables as one tree: shared blocks are shared ancestors.

    Each node is a physical block (its id, how many beams hold it, and its text when `decode`
    is given); each beam is a leaf hanging off its last block.
    """
    g = Drawing(
        graph_attr={"rankdir": "LR", "label": title, "labelloc": "t", "fontname": "Helvetica"},
        node_attr={"fontname": "Helvetica", "fontsize": "10", "shape": "box", "style": "filled"},
    )
    holders, text, edges = _beam_blocks(block_tables, token_ids, block_size, decode)
    for block_id, n in holders.items():
        g.node(
            f"b_{block_id}",
            _block_label(block_id, n, text[block_id]),
            fillcolor=SHARED if n > 1 else USED,
            fontcolor="white",
        )
    for a, b in sorted(edges):
        g.edge(f"b_{a}", f"b_{b}")
    for i, (beam, table) in enumerate(block_tables.items()):
        g.node(f"beam_{beam}", beam, shape="ellipse", fillcolor=FREE)
        if table:
            g.edge(f"b_{table[-1]}", f"beam_{beam}", color=request_colour(i), style="dotted")
    return g


def _beam_blocks(block_tables, token_ids, block_size, decode):
    """Per physical block: how many beams hold it and its text; and the (block, next block) edges."""
    holders: dict[int, int] = {}
    text: dict[int, str | None] = {}
    edges: set[tuple[int, int]] = set()
    for beam, table in block_tables.items():
        tokens = token_ids[beam]
        for i, block_id in enumerate(table):
            holders[block_id] = holders.get(block_id, 0) + 1
            chunk = tokens[i * block_size : (i + 1) * block_size]
            text[block_id] = decode(chunk) if decode else None
            if i:
                edges.add((table[i - 1], block_id))
    return holders, text, edges


def live_tables(engine) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """(block tables, token ids) of the engine's running requests, for the two drawings above (a hybrid model's:
    the table its full-attention layers keep, kv/hybrid.py's one_table)."""
    kv = engine.kv_manager
    running = engine.scheduler.running
    tables = {r.request_id: one_table(kv, kv.get_block_ids(r)) for r in running}
    return tables, {r.request_id: r.all_token_ids for r in running}


# --- stage 4: the prefix cache as a tree of chained hashes ----------------------------------------------------------


def short_hash(block_hash) -> str:
    """The first 8 hex digits of a block hash (SHA-256 bytes, or the int of hash_algo="builtin"); a hybrid model's
    (group, hash) key (kv/hybrid.py) as "group:digits"."""
    if isinstance(block_hash, tuple):
        group, tokens_hash = block_hash
        return f"{group}:{short_hash(tokens_hash)}"
    if isinstance(block_hash, bytes):
        return block_hash.hex()[:8]
    return f"{block_hash & 0xFFFF_FFFF_FFFF_FFFF:016x}"[:8]


def hash_chain_tree(requests, kv_manager, decode: Callable[[list[int]], str] | None = None, title: str = "") -> Drawing:
    """The prefix cache as a tree: one node per chained block hash, one path per request, root to leaf.

    `requests`: Request objects (or a dict of them) whose `block_hashes` name their full blocks in order;
    keep them from `engine.scheduler.requests.live[request_id]` right after `add_request`: the engine forgets finished
    requests, but a Request keeps its hashes. `kv_manager`: the engine's PrefixCachingKVCacheManager; its
    pool's `cached_block_hash_to_block` says which hashes are cached and in which block.
    Equal hashes mean equal prefixes, so requests that share a prefix share a path until they differ.
    A cached node shows its block id, short hash, ref_cnt (and text, with `decode`), coloured USED, SHARED
    (ref_cnt > 1) or CACHED (ref_cnt 0: free, kept for a later hit); a dashed node is a hash no block holds
    (evicted, or a duplicate that was never registered). Cached blocks of requests not given hang unattached.
    """
    requests = list(requests.values() if isinstance(requests, dict) else requests)
    cache = kv_manager.pool.cached_block_hash_to_block
    g = Drawing(
        graph_attr={"rankdir": "LR", "label": title, "labelloc": "t", "fontname": "Helvetica"},
        node_attr={"fontname": "Helvetica", "fontsize": "10", "shape": "box", "style": "filled"},
    )
    g.node("root", "NONE_HASH", shape="ellipse", fillcolor=FREE)
    text, edges = _hash_paths(requests, kv_manager.block_size, decode)
    for block_hash in {**text, **dict.fromkeys(cache)}:
        _hash_node(g, block_hash, cache.get(block_hash), text.get(block_hash))
    for parent, child in dict.fromkeys(edges):
        g.edge("root" if parent is None else _node_id(parent), _node_id(child))
    for r in requests:
        salt = f"\\nsalt {r.cache_salt!r}" if r.cache_salt is not None else ""
        leaf = f"req_{r.request_id}"
        g.node(leaf, f"request {r.request_id}{salt}", shape="ellipse", fillcolor="white")
        if r.block_hashes:
            g.edge(_node_id(r.block_hashes[-1]), leaf, style="dotted")
    return g


def _hash_paths(requests, block_size: int, decode) -> tuple[dict, list[tuple]]:
    """(block hash -> its text or None, parent -> child edges) from the requests' hash lists."""
    text: dict = {}
    edges: list[tuple] = []
    for r in requests:
        for i, block_hash in enumerate(r.block_hashes):
            chunk = r.all_token_ids[i * block_size : (i + 1) * block_size]
            text.setdefault(block_hash, decode(chunk) if decode else None)
            edges.append((r.block_hashes[i - 1] if i else None, block_hash))
    return text, edges


def _hash_node(g: graphviz.Digraph, block_hash, block, text: str | None) -> None:
    lines = [f"#{short_hash(block_hash)}"]
    if block is None:
        lines.insert(0, "not cached")
    else:
        lines = [f"block {block.block_id}", *lines, f"ref_cnt {block.ref_cnt}"]
    if text is not None:
        lines.append(_quoted(text))
    label = "\\n".join(lines)
    if block is None:
        g.node(_node_id(block_hash), label, style="dashed,filled", fillcolor=FREE, fontcolor="dimgray")
        return
    fill = SHARED if block.ref_cnt > 1 else USED if block.ref_cnt == 1 else CACHED
    g.node(_node_id(block_hash), label, fillcolor=fill, fontcolor="white")


def _node_id(block_hash) -> str:
    return f"h_{block_hash.hex() if isinstance(block_hash, bytes) else block_hash}"


def _quoted(text: str) -> str:
    """A block's text for a graphviz label: in quotes, a newline shown as ↵ (graphviz would break the line there)."""
    return "“" + text.replace("\\", "\\\\").replace("\n", "↵") + "”"


def save_graph(graph, path: str | Path, dpi: int = 120) -> Path | None:
    """A graphviz drawing rendered by `dot` at `dpi`, written to `path` as a PNG (its folder made if needed).

    Without `dot` on PATH: writes nothing, prints the install line on stderr and returns None.
    """
    path = Path(path)
    if not dot_available():
        print(dot_missing_line([path]), file=sys.stderr)
        return None
    graph.graph_attr["dpi"] = str(dpi)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(graph.pipe(format="png"))
    return path
