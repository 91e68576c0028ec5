"""Stage 1: `pagedlab figures`, every figure of figures/ regenerated from a seeded run of the bundled model.

Builds on: llm.py (a traced engine), viz.py (the drawings), graphs.py (graphviz drawings, stage 3).
Read with: chapters/01-contiguous-static.md, chapters/02-paged-blocks.md, chapters/03-copy-on-write.md,
chapters/04-prefix-caching.md, chapters/05-continuous-batching.md.

Figures are never drawn by hand (DESIGN §1). Each figure is one function
`(out_dir) -> Path` listed in FIGURES; a later stage appends its own. The
workload is greedy, so the same code gives the same pictures on every machine.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch

from pagedlab import graphs, viz
from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.llm import LLM
from pagedlab.request import Request
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.stats import StepTrace

DPI = 120

# Eight speakers with different output lengths: with max_num_seqs=4, two static batches of four.
STAGE1_PROMPTS = (
    "ROMEO:",
    "JULIET:",
    "HAMLET:",
    "First Citizen:",
    "KING RICHARD III:",
    "MENENIUS:",
    "LADY MACBETH:",
    "PROSPERO:",
)
STAGE1_MAX_TOKENS = (24, 64, 40, 96, 32, 80, 48, 16)


@dataclass(frozen=True)
class TracedRun:
    """What a figure needs from one engine run."""

    trace: list[StepTrace]  # llm.engine.trace
    num_kv_blocks: int  # pool capacity in blocks
    block_size: int  # tokens per block


def stage1_workload() -> tuple[list[str], list[SamplingParams]]:
    """The prompts and per-prompt greedy params that every stage-1 figure (and notebook 01) runs."""
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=False) for m in STAGE1_MAX_TOKENS]
    return list(STAGE1_PROMPTS), params


@functools.cache
def stage1_run() -> TracedRun:
    """Stage 1 (contiguous KV + static batching) on the stage-1 workload; run once per process."""
    llm = LLM(stage=1, max_num_seqs=4, block_size=16, record_trace=True)
    llm.generate(*stage1_workload(), use_tqdm=False)
    return TracedRun(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def fig_01_reserved_vs_used(out_dir: Path) -> Path:
    title = "Reserved vs used KV slots per request under static batching (stage 1)"
    return _save(viz.plot_reserved_vs_used(stage1_run().trace, title), out_dir / "01_reserved_vs_used.png")


def fig_01_kv_over_steps(out_dir: Path) -> Path:
    run = stage1_run()
    fig = viz.plot_kv_over_steps(run.trace, run.num_kv_blocks, run.block_size)
    return _save(fig, out_dir / "01_kv_over_steps.png")


def fig_01_batch_timeline(out_dir: Path) -> Path:
    return _save(viz.plot_batch_timeline(stage1_run().trace), out_dir / "01_batch_timeline.png")


# Stage 2's comparison: 16 speakers in the same small pool at stages 1 and 2 (regions of 16 blocks, 4 of them).
STAGE2_PROMPTS = STAGE1_PROMPTS + (
    "GLOUCESTER:",
    "DUKE VINCENTIO:",
    "PETRUCHIO:",
    "ISABELLA:",
    "BRUTUS:",
    "KATHARINA:",
    "LEONTES:",
    "MIRANDA:",
)
STAGE2_MAX_TOKENS = STAGE1_MAX_TOKENS + (56, 40, 72, 24, 88, 32, 48, 64)
STAGE2_POOL = dict(block_size=16, num_kv_blocks=64, max_model_len=256, max_num_seqs=16)


def stage2_workload() -> tuple[list[str], list[SamplingParams]]:
    """The 16 prompts and greedy params of the stage-1 vs stage-2 comparison (figure 02 and notebook 02)."""
    return list(STAGE2_PROMPTS), [SamplingParams(max_tokens=m, temperature=0.0) for m in STAGE2_MAX_TOKENS]


@functools.cache
def stage2_block_table_run() -> TracedRun:
    """The stage-1 workload at stage 2 in a pool of 40 blocks of 8: the second batch reuses freed blocks."""
    llm = LLM(stage=2, max_num_seqs=4, block_size=8, num_kv_blocks=40, record_trace=True)
    llm.generate(*stage1_workload(), use_tqdm=False)
    return TracedRun(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


@functools.cache
def pool_comparison_run(stage: int) -> TracedRun:
    """The 16-speaker workload at `stage` with STAGE2_POOL: the same prompts and the same KV memory."""
    llm = LLM(stage=stage, record_trace=True, **STAGE2_POOL)
    llm.generate(*stage2_workload(), use_tqdm=False)
    return TracedRun(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


def fig_02_block_tables(out_dir: Path) -> Path:
    run = stage2_block_table_run()
    step = [s for s in run.trace if len(s.running) == 4][-1]  # second batch, blocks from finished requests reused
    fig = viz.plot_block_tables(step, run.num_kv_blocks, run.block_size, order=viz.request_order(run.trace))
    return _save(fig, out_dir / "02_block_tables.png")


def fig_02_pool_occupancy(out_dir: Path) -> Path:
    fig, axes = plt.subplots(4, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1, 3, 1]})
    runs = {stage: pool_comparison_run(stage) for stage in (1, 2)}
    for (stage, run), pair in zip(runs.items(), (axes[:2], axes[2:])):
        title = f"stage {stage} ({'contiguous' if stage == 1 else 'paged'})"
        viz.plot_pool_occupancy(run.trace, run.num_kv_blocks, axes=pair, title=title)
    axes[1].set_xlabel("")
    top = max(axes[1].get_ylim()[1], axes[3].get_ylim()[1])
    axes[1].set_ylim(0, top)  # one scale for "running" in both panels
    axes[3].set_ylim(0, top)
    axes[-1].set_xlim(0.5, max(len(run.trace) for run in runs.values()) + 0.5)  # both runs on one step axis
    fig.tight_layout()
    return _save(fig, out_dir / "02_pool_occupancy.png")


# Stage 3: a fork and its copy-on-write, and a beam search's block tree (graphviz, rendered by `dot`).
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
    return before, after, kv.take_block_copies()


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
    before, after, copies = cow_before_after()
    (src, dst), last = copies[0], COW_PARENT_TOKENS // COW_BLOCK_SIZE
    left = _sharing_image(before, "after fork(parent, child): nothing copied")
    right = _sharing_image(after, f"after the child's first token: copy-on-write {src} -> {dst}", copies)
    note = f"child writes\ntoken {COW_PARENT_TOKENS}\n(logical block {last})"
    fig = _before_after(left, right, note)
    fig.suptitle(f"Copy-on-write, block_size {COW_BLOCK_SIZE}: only the shared block being written is copied", y=0.98)
    return _save(fig, out_dir / "03_cow_before_after.png")


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
    graph.graph_attr["dpi"] = str(DPI)
    path = out_dir / "03_beam_tree.png"
    path.write_bytes(graph.pipe(format="png"))
    return path


# Stage 4: prefix caching. Two static batches of two in a pool of 11 blocks of 4: A and B, then C (A's whole prompt
# and more), D (the shared prefix, then its own word). B shares nothing; its blocks stay cached after it finishes
# until D's next block evicts the tail of B's chain.
STAGE4_PREFIX = "ROMEO:\nBut "  # with <bos>: 12 tokens, 3 full blocks of 4
STAGE4_PROMPTS = {
    "A": STAGE4_PREFIX + "soft",
    "B": "JULIET:\nAy me",
    "C": STAGE4_PREFIX + "soft, what",
    "D": STAGE4_PREFIX + "hark",
}
STAGE4_POOL = dict(block_size=4, num_kv_blocks=11, max_num_seqs=2)
STAGE4_STEPS = 5  # batch 1 ends in step 3; C and D prefill in step 4; in step 5 D's next block evicts B's tail


@dataclass
class CacheRun:
    """A stage-4 engine stopped after STAGE4_STEPS steps, with what the stage-4 figures draw."""

    llm: LLM  # its engine is left as it was after the last step
    requests: dict[str, Request]  # every request, kept at add_request (the engine forgets finished ones)
    cached: set[int]  # blocks carrying a block hash after the last step (viz.cached_block_ids)


@functools.cache
def stage4_cache_run() -> CacheRun:
    """STAGE4_PROMPTS on a traced stage-4 engine, greedy, 3 tokens each, stepped by hand STAGE4_STEPS times."""
    llm = LLM(stage=4, record_trace=True, **STAGE4_POOL)
    engine, requests = llm.engine, {}
    for rid, prompt in STAGE4_PROMPTS.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        requests[rid] = engine.scheduler.waiting[-1]
    for _ in range(STAGE4_STEPS):
        engine.step()
    return CacheRun(llm, requests, viz.cached_block_ids(engine.kv_manager.pool))


def fig_04_hash_chain(out_dir: Path) -> Path:
    run = stage4_cache_run()
    title = (
        f"Prefix cache after step {STAGE4_STEPS}: one node per chained block hash (block_size "
        f"{STAGE4_POOL['block_size']}); A and B finished, C and D running"
    )
    graph = graphs.hash_chain_tree(run.requests, run.llm.engine.kv_manager, _decode_showing_bos(run.llm), title)
    graph.graph_attr["dpi"] = str(DPI)
    path = out_dir / "04_hash_chain.png"
    path.write_bytes(graph.pipe(format="png"))
    return path


def _decode_showing_bos(llm: LLM):
    """The tokenizer's decode, but a leading <bos> is written out: the first block's 4 tokens are <bos> and 3 chars."""
    tokenizer = llm.get_tokenizer()
    bos = tokenizer.token_to_id("<bos>")
    return lambda ids: ("<bos>" if ids[:1] == [bos] else "") + tokenizer.decode(ids)


def fig_04_block_tables_hits(out_dir: Path) -> Path:
    run = stage4_cache_run()
    trace, pool = run.llm.engine.trace, STAGE4_POOL
    hits = viz.prefix_hit_blocks(trace, pool["block_size"])
    fig = viz.plot_block_tables(
        trace[-1],
        pool["num_kv_blocks"],
        pool["block_size"],
        arrows_for=["D"],
        pool_columns=6,
        hits=hits,
        cached=run.cached,
    )
    width, height = fig.get_size_inches()
    fig.set_size_inches(width + 1, height + 0.5)  # room for the four-entry legend below the tables' key
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, out_dir / "04_block_tables_hits.png")


# Stage 5: continuous batching. Six speakers in a pool of 24 blocks of 4 (96 slots), at most 4 running, a budget of
# 16 tokens per step and prefill chunks of at most 6: prompts are chunked beside decodes, and the pool runs dry.
STAGE5_PROMPTS = (
    "ROMEO:\nBut soft, what light",
    "JULIET:",
    "HAMLET:\nTo be, or not",
    "First Citizen:",
    "KING RICHARD III:\nNow is",
    "MENENIUS:",
)
STAGE5_MAX_TOKENS = (20, 28, 16, 24, 12, 20)
STAGE5_POOL = dict(
    block_size=4, num_kv_blocks=24, max_num_seqs=4, max_num_batched_tokens=16, long_prefill_token_threshold=6
)
STAGE5_SWAP_BLOCKS = 16  # the CPU swap pool of the swap run: room for two victims at once
STAGE5_SWAP_STEP = 20  # in the swap run, two requests are swapped out after this step


def stage5_workload() -> tuple[list[str], list[SamplingParams]]:
    """The six prompts and greedy params of the stage-5 figures (and notebook 05); ignore_eos fixes the lengths."""
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in STAGE5_MAX_TOKENS]
    return list(STAGE5_PROMPTS), params


@dataclass(frozen=True)
class ScheduleRun:
    """A stage-5 run with what its schedule figures need."""

    trace: list[StepTrace]  # llm.engine.trace
    prompt_lens: dict[str, int]  # request_id -> prompt tokens (tells a one-token chunk from a decode)
    preemption_mode: str  # "recompute" | "swap"


@functools.cache
def stage5_run(preemption_mode: str = "recompute") -> ScheduleRun:
    """The stage-5 workload on a traced stage-5 engine with STAGE5_POOL, preempting by `preemption_mode`."""
    swap = STAGE5_SWAP_BLOCKS if preemption_mode == "swap" else 0
    llm = LLM(stage=5, record_trace=True, preemption_mode=preemption_mode, num_swap_blocks=swap, **STAGE5_POOL)
    outputs = llm.generate(*stage5_workload(), use_tqdm=False)
    return ScheduleRun(llm.engine.trace, viz.prompt_lens_of(outputs), preemption_mode)


def fig_05_gantt(out_dir: Path) -> Path:
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.4), sharex=True)
    for ax, mode in zip(axes, ("recompute", "swap")):
        run = stage5_run(mode)
        title = f"preemption_mode={mode!r}"
        viz.plot_schedule_gantt(run.trace, run.prompt_lens, run.preemption_mode, ax=ax, title=title)
    axes[0].set_xlabel("")
    fig.tight_layout()
    return _save(fig, out_dir / "05_gantt.png")


def fig_05_tokens_per_step(out_dir: Path) -> Path:
    run = stage5_run()
    fig = viz.plot_tokens_per_step(run.trace, STAGE5_POOL["max_num_batched_tokens"], run.prompt_lens)
    return _save(fig, out_dir / "05_tokens_per_step.png")


@functools.cache
def swap_tables_run() -> tuple[StepTrace, dict[str, list[int]], set[int]]:
    """The swap run stopped after STAGE5_SWAP_STEP steps: (its last step, the swap pool's blocks, cached blocks)."""
    llm = LLM(stage=5, record_trace=True, preemption_mode="swap", num_swap_blocks=STAGE5_SWAP_BLOCKS, **STAGE5_POOL)
    for i, (prompt, params) in enumerate(zip(*stage5_workload())):
        llm.engine.add_request(str(i), prompt, params)
    for _ in range(STAGE5_SWAP_STEP):
        llm.engine.step()
    kv = llm.engine.kv_manager
    return llm.engine.trace[-1], viz.swapped_block_ids(kv), viz.cached_block_ids(kv.pool)


def fig_05_swap_block_tables(out_dir: Path) -> Path:
    step, swapped, cached = swap_tables_run()
    order = [str(i) for i in range(len(STAGE5_PROMPTS))]
    pool = STAGE5_POOL
    fig = viz.plot_block_tables(
        step,
        pool["num_kv_blocks"],
        pool["block_size"],
        order=order,
        arrows_for=[],
        cached=cached,
        swapped=swapped,
        num_swap_blocks=STAGE5_SWAP_BLOCKS,
    )
    return _save(fig, out_dir / "05_swap_block_tables.png")


# Static (stage 4) vs continuous (stage 5) batching: the stage-1 workload, the same pool, max_num_seqs=4.
STATIC_VS_CONTINUOUS_POOL = dict(block_size=16, num_kv_blocks=16, max_num_seqs=4)


@functools.cache
def batching_run(stage: int) -> TracedRun:
    """The stage-1 workload at `stage` (4: static, 5: continuous) with STATIC_VS_CONTINUOUS_POOL."""
    llm = LLM(stage=stage, record_trace=True, **STATIC_VS_CONTINUOUS_POOL)
    llm.generate(*stage1_workload(), use_tqdm=False)
    return TracedRun(llm.engine.trace, llm.engine.config.num_kv_blocks, llm.engine.config.block_size)


def fig_05_static_vs_continuous(out_dir: Path) -> Path:
    fig, axes = plt.subplots(4, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1, 3, 1]})
    runs = {stage: batching_run(stage) for stage in (4, 5)}
    for (stage, run), pair in zip(runs.items(), (axes[:2], axes[2:])):
        title = f"stage {stage} ({'static' if stage == 4 else 'continuous'}), {len(run.trace)} steps"
        viz.plot_pool_occupancy(run.trace, run.num_kv_blocks, axes=pair, title=title)
    axes[1].set_xlabel("")
    for ax in (axes[1], axes[3]):
        ax.set_ylim(0, 1.2 * STATIC_VS_CONTINUOUS_POOL["max_num_seqs"])  # one scale for "running" in both
    axes[-1].set_xlim(0.5, max(len(run.trace) for run in runs.values()) + 0.5)  # both runs on one step axis
    fig.tight_layout()
    return _save(fig, out_dir / "05_static_vs_continuous.png")


FIGURES = [
    fig_01_reserved_vs_used,
    fig_01_kv_over_steps,
    fig_01_batch_timeline,
    fig_02_block_tables,
    fig_02_pool_occupancy,
    fig_03_cow_before_after,
    fig_03_beam_tree,
    fig_04_hash_chain,
    fig_04_block_tables_hits,
    fig_05_gantt,
    fig_05_tokens_per_step,
    fig_05_swap_block_tables,
    fig_05_static_vs_continuous,
]


def make_figures(out_dir: str | Path = "figures") -> list[Path]:
    """Write every figure in FIGURES to out_dir; returns their paths in order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [make(out) for make in FIGURES]
