"""Stage 3: a Graphviz drawing drawn by matplotlib when `dot` is missing (viz/graph_plot.py): the same nodes and
edges as the Graphviz graph, in columns by the longest path to each node, each column in an order that keeps
edges short, with the colours, labels and line styles the graph asked for."""

import pytest
from matplotlib.patches import FancyArrowPatch

from pagedlab.viz import CACHED, SHARED, USED, graphs
from pagedlab.viz.graph_plot import GraphModel, columns, plot_graph, rows

pytestmark = pytest.mark.stage3


def test_a_drawing_keeps_its_nodes_and_edges_as_plain_data():
    g = graphs.block_sharing_graph({"a": [0, 1, 2], "b": [0, 1, 3]}, title="fork", copies=[(2, 3)])
    m = g.model
    assert list(m.nodes) == ["r_a", "b_0", "b_1", "b_2", "r_b", "b_3"] and m.title == "fork"
    assert m.nodes["b_0"]["fillcolor"] == SHARED and m.nodes["b_2"]["fillcolor"] == USED  # ref_cnt 2 and 1
    assert m.nodes["b_0"]["label"] == "block 0\\nref_cnt 2"
    assert ("r_b", "b_3", {"label": "2", "color": m.edges[-2][2]["color"]}) == m.edges[-2]
    assert m.edges[-1] == ("b_2", "b_3", {"label": "copy", "style": "dashed", "color": "black", "constraint": "false"})


def test_columns_follow_the_longest_path_and_a_copy_edge_does_not_count():
    g = graphs.block_sharing_graph({"a": [0, 1, 2], "b": [0, 1, 3]}, copies=[(2, 3)])
    assert columns(g.model) == {"r_a": 0, "r_b": 0, "b_0": 1, "b_1": 1, "b_2": 1, "b_3": 1}
    m = GraphModel()
    for tail, head in [("root", "x"), ("x", "y"), ("root", "y"), ("y", "leaf")]:
        m.add_edge(tail, head, None, {})
    assert columns(m) == {"root": 0, "x": 1, "y": 2, "leaf": 3}


def test_rows_put_a_node_near_what_points_at_it_and_centre_each_column():
    m = GraphModel()
    for tail, head in [("top", "t1"), ("bottom", "b1"), ("top", "t2")]:
        m.add_edge(tail, head, None, {})
    r = rows(m, columns(m))
    assert r["top"] == -0.5 and r["bottom"] == 0.5
    assert r["t1"] < r["b1"] and r["t2"] < r["b1"] and sum(r[n] for n in ("t1", "t2", "b1")) == 0


def test_the_hash_chain_is_drawn_with_its_colours_and_dashes():
    m = GraphModel(node_defaults={"style": "filled", "shape": "box"})
    m.add_node("root", "NONE_HASH", {"shape": "ellipse"})
    m.add_node("h1", "block 3\\n#ab", {"fillcolor": CACHED})
    m.add_node("h2", "not cached", {"style": "dashed,filled", "fillcolor": "#dddddd"})
    m.add_edge("root", "h1", None, {})
    m.add_edge("h1", "h2", "next", {"style": "dotted"})
    fig = plot_graph(m)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "block 3\n#ab" in texts and "NONE_HASH" in texts and "next" in texts
    boxes = [p for p in ax.patches if not isinstance(p, FancyArrowPatch)]
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(boxes) == 3 and len(arrows) == 2
    assert type(boxes[0]).__name__ == "Ellipse" and boxes[2].get_linestyle() == "--"
    assert arrows[1].get_linestyle() == ":"
