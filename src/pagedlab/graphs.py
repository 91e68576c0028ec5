"""Stage 3: graphviz drawings of shared blocks: requests -> blocks with ref counts, and beam trees.

Builds on: viz.py (the fixed colours), kv/cow.py (ref counts), sched/beam.py.
Read with: chapters/03-copy-on-write.md.

Two pictures, both built from plain block tables so notebooks can draw any moment:

    block_sharing_graph:  request ──logical i──▶ [block 7 | ref_cnt 2]   (shared blocks in SHARED colour)
    beam_block_tree:      the union of the live beams' block tables is a tree: the prompt's blocks
                          at the root, one branch per fork, one leaf per beam

Rendering a Digraph to a file needs Graphviz's `dot` program (apt-get install graphviz);
building one does not.
"""

from __future__ import annotations

from collections.abc import Callable

import graphviz

from pagedlab.viz import FREE, SHARED, USED, request_colour


def _block_label(block_id: int, refs: int, text: str | None = None) -> str:
    lines = [f"block {block_id}", f"ref_cnt {refs}"]
    if text is not None:
        lines.append(repr(text)[1:-1][:12])
    return "\\n".join(lines)


def block_sharing_graph(
    block_tables: dict[str, list[int]], title: str = "", copies: list[tuple[int, int]] = ()
) -> graphviz.Digraph:
    """Requests on the left, physical blocks on the right; an edge per block-table entry.

    A block's ref_cnt is the number of tables holding it; ref_cnt > 1 is drawn in the shared colour.
    `copies` (src, dst) pairs are drawn as dashed copy-on-write arrows.
    """
    refs: dict[int, int] = {}
    for table in block_tables.values():
        for block_id in table:
            refs[block_id] = refs.get(block_id, 0) + 1
    g = graphviz.Digraph(
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
    for src, dst in copies:
        g.edge(f"b_{src}", f"b_{dst}", label="copy", style="dashed", color="black", constraint="false")
    return g


def beam_block_tree(
    block_tables: dict[str, list[int]],
    token_ids: dict[str, list[int]],
    block_size: int,
    decode: Callable[[list[int]], str] | None = None,
    title: str = "",
) -> graphviz.Digraph:
    """The live beams' block tables as one tree: shared blocks are shared ancestors.

    Each node is a physical block (its id, how many beams hold it, and its text when `decode`
    is given); each beam is a leaf hanging off its last block.
    """
    g = graphviz.Digraph(
        graph_attr={"rankdir": "LR", "label": title, "labelloc": "t", "fontname": "Helvetica"},
        node_attr={"fontname": "Helvetica", "fontsize": "10", "shape": "box", "style": "filled"},
    )
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


def live_tables(engine) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """(block tables, token ids) of the engine's running requests, for the two drawings above."""
    kv = engine.kv_manager
    running = engine.scheduler.running
    return {r.request_id: kv.get_block_ids(r) for r in running}, {r.request_id: r.all_token_ids for r in running}
