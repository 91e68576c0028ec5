"""Graphviz drawings of shared blocks (stage 3): what they draw matches the block tables."""

import shutil

import pytest

from pagedlab import LLM, BeamSearchParams
from pagedlab.graphs import beam_block_tree, block_sharing_graph, live_tables
from pagedlab.viz import SHARED, USED

pytestmark = pytest.mark.stage3


def test_sharing_graph_marks_shared_blocks_and_copies():
    g = block_sharing_graph({"p": [0, 1], "c": [0, 2]}, title="after CoW", copies=[(1, 2)])
    src = g.source
    assert 'b_0 [label="block 0\\nref_cnt 2"' in src and f'fillcolor="{SHARED}"' in src
    assert 'b_1 [label="block 1\\nref_cnt 1"' in src and f'fillcolor="{USED}"' in src
    assert "r_p -> b_0" in src and "r_c -> b_2" in src
    assert "b_1 -> b_2" in src and "dashed" in src


def test_beam_tree_is_the_union_of_live_tables():
    llm = LLM(stage=3, block_size=4, max_num_seqs=8)
    engine = llm.engine
    engine.add_beam_request("b", "ROMEO:\nWhat", BeamSearchParams(beam_width=4, max_tokens=20))
    for _ in range(9):
        engine.step()
    tables, tokens = live_tables(engine)
    assert len(tables) == 4
    g = beam_block_tree(tables, tokens, 4, llm.get_tokenizer().decode)
    blocks = {b for t in tables.values() for b in t}
    for b in blocks:
        holders = sum(b in t for t in tables.values())
        assert f"ref_cnt {holders}" in g.source.split(f"b_{b} [label=")[1].split("]")[0]
    root = next(iter(tables.values()))[0]
    assert all(t[0] == root for t in tables.values()), "every beam shares the prompt's first block"
    assert g.source.count('-> "beam_') == 4


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_rendering_writes_a_png(tmp_path):
    g = block_sharing_graph({"a": [3, 4], "b": [3]})
    path = g.render(tmp_path / "g", format="png", cleanup=True)
    assert (tmp_path / "g.png").stat().st_size > 1000 and path.endswith(".png")
