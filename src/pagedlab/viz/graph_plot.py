"""Stage 3: a graph drawing without Graphviz: the same nodes and edges, laid out in columns and drawn by matplotlib.

Builds on: viz/palette.py (save_figure, the text colour on a fill).
Read with: chapters/03-copy-on-write.md, chapters/04-prefix-caching.md.

viz/graphs.py builds its drawings (who holds which block, the beam tree, the hash chain) as Graphviz graphs,
and Graphviz's `dot` lays them out best. A learner's machine may have no `dot`, though, and a notebook that
teaches copy-on-write must still show the blocks. So every Drawing also records its nodes and edges (a
GraphModel), and this module draws that model with matplotlib: left to right, as `rankdir=LR` asks,

    column 0          column 1            column 2
    [request a] ──0──▶ [block 0 ref 2] ──▶ ...       a node's column: the longest path of edges to it
    [request b] ──0──▶                               (an edge with constraint=false, a copy, does not count)

and within a column in the order that keeps edges short (each node near the mean row of what points at it).
It draws boxes (ellipses where Graphviz would), each edge's label at its middle, and dashed or dotted lines
where the graph says so. It is a fallback, not a layout engine: a drawing of a few dozen nodes reads well.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COLUMN_WIDTH = 2.6  # inches between column centres
ROW_HEIGHT = 0.85  # inches between row centres


@dataclass
class GraphModel:
    """What a Drawing holds, in plain data: nodes by id (in the order they were added) and edges."""

    nodes: dict[str, dict] = field(default_factory=dict)  # id -> {"label": str, and Graphviz attributes}
    edges: list[tuple[str, str, dict]] = field(default_factory=list)  # (tail, head, {"label", "style", ...})
    title: str = ""
    node_defaults: dict = field(default_factory=dict)  # the graph's node_attr: what a node has unless it says

    def add_node(self, name: str, label: str | None, attrs: dict) -> None:
        old = self.nodes.get(name, self.node_defaults)
        self.nodes[name] = {**old, **attrs, "label": label if label is not None else name}

    def add_edge(self, tail: str, head: str, label: str | None, attrs: dict) -> None:
        for name in (tail, head):
            self.nodes.setdefault(name, {**self.node_defaults, "label": name})  # Graphviz makes a node an edge names
        self.edges.append((tail, head, {**attrs, "label": label or ""}))


def columns(model: GraphModel) -> dict[str, int]:
    """Each node's column: the longest chain of (constraining) edges that reaches it, 0 for a source."""
    column = dict.fromkeys(model.nodes, 0)
    ranked = [(t, h) for t, h, a in model.edges if a.get("constraint") != "false" and t != h]
    for _ in range(len(model.nodes)):  # longest paths settle within |nodes| passes on a DAG; a cycle just stops
        changed = False
        for tail, head in ranked:
            if column[head] < column[tail] + 1:
                column[head], changed = column[tail] + 1, True
        if not changed:
            break
    return column


def rows(model: GraphModel, column: dict[str, int]) -> dict[str, float]:
    """Each node's row within its column: near the mean row of the nodes that point at it, else in order."""
    row: dict[str, float] = {}
    preds: dict[str, list[str]] = {name: [] for name in model.nodes}
    for tail, head, _ in model.edges:
        preds[head].append(tail)
    for c in range(max(column.values(), default=-1) + 1):
        here = [n for n in model.nodes if column[n] == c]
        wish = {n: _mean([row[p] for p in preds[n] if p in row], i) for i, n in enumerate(here)}
        for i, name in enumerate(sorted(here, key=lambda n: wish[n])):
            row[name] = float(i)
        offset = (len(here) - 1) / 2  # centre each column on row 0
        for name in here:
            row[name] -= offset
    return row


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def plot_graph(model: GraphModel):
    """The model as a matplotlib Figure (boxes, arrows, labels), laid out by `columns` and `rows`."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Ellipse, FancyArrowPatch, FancyBboxPatch

    from pagedlab.viz.palette import _text_colour

    column = columns(model)
    row = rows(model, column)
    width = (max(column.values(), default=0) + 1) * COLUMN_WIDTH
    height = max(1, max((list(column.values()).count(c) for c in set(column.values())), default=1)) * ROW_HEIGHT
    fig, ax = plt.subplots(figsize=(max(4.0, width), max(2.0, height + 0.6)))
    centre = {n: (column[n] * COLUMN_WIDTH, -row[n] * ROW_HEIGHT) for n in model.nodes}
    half = (COLUMN_WIDTH * 0.34, ROW_HEIGHT * 0.38)  # a box's half width and half height, in inches
    for name, attrs in model.nodes.items():
        x, y = centre[name]
        fill = attrs.get("fillcolor", "white") if "filled" in attrs.get("style", "") else "white"
        dashed = "dashed" in attrs.get("style", "")
        box = (
            Ellipse((x, y), 2 * half[0], 2 * half[1], facecolor=fill, edgecolor="black", linewidth=0.8)
            if attrs.get("shape") == "ellipse"
            else FancyBboxPatch((x - half[0], y - half[1]), 2 * half[0], 2 * half[1], boxstyle="round,pad=0.02",
                                facecolor=fill, edgecolor="black", linewidth=0.8, linestyle="--" if dashed else "-")
        )  # fmt: skip
        ax.add_patch(box)
        text = attrs["label"].replace("\\n", "\n")
        ax.text(x, y, text, ha="center", va="center", fontsize=7, color=_text_colour(fill) if fill else "black")
    for tail, head, attrs in model.edges:
        _arrow(ax, centre[tail], centre[head], half, attrs, FancyArrowPatch)
    xs, ys = [p[0] for p in centre.values()], [p[1] for p in centre.values()]
    ax.set_xlim(min(xs) - half[0] - 0.2, max(xs) + half[0] + 0.2)
    ax.set_ylim(min(ys) - half[1] - 0.2, max(ys) + half[1] + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    if model.title:
        ax.set_title(model.title, fontsize=9)
    fig.tight_layout()
    return fig


def _arrow(ax, start, end, half, attrs: dict, patch) -> None:
    """An arrow from the right side of one box to the left side of the next (or round, between one column)."""
    (x0, y0), (x1, y1) = start, end
    same_column = abs(x1 - x0) < 1e-9
    a = (x0, y0 - half[1]) if same_column else (x0 + half[0], y0)
    b = (x1, y1 + half[1]) if same_column else (x1 - half[0], y1)
    style = {"dashed": "--", "dotted": ":"}.get(attrs.get("style", ""), "-")
    colour = attrs.get("color", "black")
    bend = "arc3,rad=0.4" if same_column else "arc3,rad=0.0"
    ax.add_patch(patch(a, b, arrowstyle="-|>", mutation_scale=8, color=colour, linestyle=style, linewidth=0.9,
                       connectionstyle=bend, shrinkA=0, shrinkB=0))  # fmt: skip
    if attrs.get("label"):
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2, attrs["label"], fontsize=6, ha="center", va="bottom",
                color=colour, bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})  # fmt: skip
