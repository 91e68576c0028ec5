"""Stage 3: the figures of copy-on-write: a fork and its first write, and a beam search's block tree.

Builds on: lessons/common.py (DPI, the savers), viz/graphs.py (graphviz drawings, rendered by `dot`),
kv/cow.py (fork and block copies), llm.py (the stage-3 engine's beam search).
Read with: chapters/03-copy-on-write.md.

Both figures draw real state: the copy-on-write figure runs a CowKVCacheManager by hand, the beam tree
stops a width-4 beam search a few steps in, when three beams share a partly filled last block.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch

from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.lessons.common import DPI, _save, _save_graph
from pagedlab.llm import LLM
from pagedlab.request import Request
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.viz import graphs

COW_BLOCK_SIZE = 4
COW_PARENT_TOKENS = 10  # blocks [0, 1, 2]: two full, the last holding 2 of 4 tokens
BEAM_PROMPT = "ROMEO:\nWhat"
BEAM_PARAMS = dict(beam_width=4, max_tokens=20)
BEAM_STEPS = 12  # a few steps in: three beams share a partly filled last block


def cow_before_after() -> tuple[dict[str, list[int]], dict[str, list[int]], list[tuple[int, int]]]:
    """Block tables right after fork(parent, child), and after the child's first token; the block copies."""
    kv = CowKVCacheManager(num_kv_blocks=8, block_size=COW_BLOCK_SIZE, max_model_len=32)
    params = SamplingParams(max_tokens=4)
    parent = Request("parent", list(range(COW_PARENT_TOKENS)), params, 4)
    kv.allocate_slots(parent, COW_PARENT_TOKENS)
    parent.num_computed_tokens = COW_PARENT_TOKENS
    child = Request("child", parent.prompt_token_ids, params, 4, num_computed_tokens=COW_PARENT_TOKENS)
    kv.fork(parent, child)
    before = {r.request_id: kv.get_block_ids(r) for r in (parent, child)}
    kv.allocate_slots(child, 1)  # the child's token 10 lands in block 2, which the parent holds too
    after = {r.request_id: kv.get_block_ids(r) for r in (parent, child)}
    return before, after, [(c.src, c.dst) for c in kv.take_block_copies()]


def _graph_image(graph):
    """A graphviz drawing rendered by `dot` at DPI, as an image array for matplotlib (one pixel per pixel)."""
    graph.graph_attr["dpi"] = str(DPI)
    graph.edge_attr.update(fontname="Helvetica", fontsize="10")  # edge labels in the nodes' font
    return plt.imread(io.BytesIO(graph.pipe(format="png")), format="png")


def _blocks_in_order(graph, tables: dict[str, list[int]]) -> None:
    """Stack the block nodes in one column, lowest id on top (invisible edges inside a same-rank subgraph)."""
    ids = sorted({b for table in tables.values() for b in table})
    with graph.subgraph() as column:
        column.attr(rank="same")
        for a, b in zip(ids, ids[1:]):
            column.edge(f"b_{a}", f"b_{b}", style="invis")


def _sharing_image(tables: dict[str, list[int]], title: str, copies=()):
    graph = graphs.block_sharing_graph(tables, title=title, copies=copies)
    _blocks_in_order(graph, tables)
    return _graph_image(graph)


def _before_after(left, right, note: str, gap: int = 170, top: int = 50):
    """Two images at their own pixel size, side by side, with an arrow and a note between them."""
    height = max(left.shape[0], right.shape[0])
    width, full = left.shape[1] + gap + right.shape[1], height + top
    fig = plt.figure(figsize=(width / DPI, full / DPI))
    for x, image in ((0, left), (left.shape[1] + gap, right)):
        h, w = image.shape[:2]
        ax = fig.add_axes([x / width, (height - h) / 2 / full, w / width, h / full])
        ax.imshow(image)
        ax.axis("off")
    y = height / 2 / full
    ends = ((left.shape[1] + 20) / width, y), ((left.shape[1] + gap - 20) / width, y)
    fig.add_artist(FancyArrowPatch(*ends, transform=fig.transFigure, arrowstyle="-|>", mutation_scale=20, color="k"))
    fig.text((left.shape[1] + gap / 2) / width, y + 0.05, note, ha="center", va="bottom", fontsize=9)
    return fig


def fig_03_cow_before_after(out_dir: Path) -> Path:
    path = out_dir / "03_cow_before_after.png"
    graphs.require_dot(path)  # both halves are graphviz drawings, composed by matplotlib
    before, after, copies = cow_before_after()
    (src, dst), last = copies[0], COW_PARENT_TOKENS // COW_BLOCK_SIZE
    left = _sharing_image(before, "after fork(parent, child): nothing copied")
    right = _sharing_image(after, f"after the child's first token: copy-on-write {src} -> {dst}", copies)
    note = f"child writes\ntoken {COW_PARENT_TOKENS}\n(logical block {last})"
    fig = _before_after(left, right, note)
    fig.suptitle(f"Copy-on-write, block_size {COW_BLOCK_SIZE}: only the shared block being written is copied", y=0.98)
    return _save(fig, path)


def beam_tree_tables() -> tuple[LLM, dict[str, list[int]], dict[str, list[int]]]:
    """A real width-4 beam search on the stage-3 engine, BEAM_STEPS steps in: (llm, block tables, fed token ids)."""
    llm = LLM(stage=3, block_size=COW_BLOCK_SIZE, max_num_seqs=8, num_kv_blocks=64)
    llm.engine.add_beam_request("b", BEAM_PROMPT, BeamSearchParams(**BEAM_PARAMS))
    for _ in range(BEAM_STEPS):
        llm.engine.step()
    tables, tokens = graphs.live_tables(llm.engine)
    computed = {r.request_id: r.num_computed_tokens for r in llm.engine.scheduler.running}
    return llm, tables, {rid: ids[: computed[rid]] for rid, ids in tokens.items()}  # blocks hold fed tokens only


def fig_03_beam_tree(out_dir: Path) -> Path:
    llm, tables, tokens = beam_tree_tables()
    decode = lambda ids: llm.get_tokenizer().decode(ids).replace("\n", "↵")  # a newline drawn as ↵
    prompt = BEAM_PROMPT.replace("\n", "↵")
    used = len({b for table in tables.values() for b in table})
    title = (
        f"Beam search, width {BEAM_PARAMS['beam_width']}, after step {BEAM_STEPS} (prompt {prompt!r}, block_size "
        f"{COW_BLOCK_SIZE}): {used} physical blocks for {sum(map(len, tables.values()))} table entries"
    )
    graph = graphs.beam_block_tree(tables, tokens, COW_BLOCK_SIZE, decode, title=title)
    return _save_graph(graph, out_dir / "03_beam_tree.png")
