"""Stage 2: sliding windows: the blocks behind the window freed into the null block's place, on the demo scenario.

Builds on: lessons/demo.py (the teaching scenario and its pool), kv/window.py (what a window frees), viz/palette.py.
Read with: chapters/02-paged-blocks.md (Sliding windows).

The bundled model's weights, read as a Mistral with a window of WINDOW tokens (its config.json says so; the
weights are the same tensors), serve the demo's ten requests twice at stage 5 on the demo's pool: without the
window and with it. The tokens differ (a window changes the model); what the figure shows is the memory.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from pagedlab.lessons.common import TracedRun, _save

WINDOW = 16  # tokens: two of the demo's blocks of 8


@functools.cache
def windowed_bundled_model(window: int = WINDOW) -> Path:
    """A copy of the bundled model folder whose config.json reads as a Mistral with a sliding window."""
    from pagedlab.model.loader import bundled_model_path

    folder = Path(tempfile.mkdtemp(prefix="pagedlab-window-")) / "tiny-shakespeare-window"
    shutil.copytree(bundled_model_path(), folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=window)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


@functools.cache
def demo_runs(window: int = WINDOW) -> dict[str, TracedRun]:
    """The demo scenario at stage 5, without a window ("full") and with one ("window")."""
    from pagedlab.lessons.demo import DemoOptions, add_requests, make_llm

    runs = {}
    for name, model in (("full", None), ("window", str(windowed_bundled_model(window)))):
        opts = DemoOptions(stage=5, mode="log", **({"model": model} if model else {}))
        llm = make_llm(opts)
        add_requests(llm, opts)
        while llm.engine.has_unfinished_requests():
            llm.engine.step()
        runs[name] = TracedRun.of(llm)
        runs[name + "_preemptions"] = llm.engine.stats.num_preemptions
    return runs


def window_rows(window: int = WINDOW) -> list[dict]:
    """What the figure and chapter 2 quote: per run, steps, preemptions, peak pool use, the longest request's peak."""
    runs = demo_runs(window)
    rows = []
    for name in ("full", "window"):
        run = runs[name]
        held = {}
        for t in run.trace:
            for rid, slots in t.kv_held.items():
                held[rid] = max(held.get(rid, 0), slots // run.block_size)
        rows.append({
            "run": name, "window": window if name == "window" else None, "block_size": run.block_size,
            "num_kv_blocks": run.num_kv_blocks, "steps": len(run.trace), "preemptions": runs[name + "_preemptions"],
            "peak_blocks_used": max(t.num_used_blocks for t in run.trace),
            "mean_blocks_used": round(sum(t.num_used_blocks for t in run.trace) / len(run.trace), 2),
            "longest_request_peak_blocks": max(held.values()),
        })  # fmt: skip
    return rows


def fig_02_sliding_window(out_dir: Path):
    """Blocks in use per step, without and with the window, and one request's block table with its null entries."""
    runs, rows = demo_runs(), window_rows()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    longest = _longest_request(runs["full"])  # the request that holds the most blocks without a window
    for name, colour in (("full", "#e69f00"), ("window", "#0072b2")):
        run = runs[name]
        label = "no window" if name == "full" else f"window of {WINDOW} tokens"
        left.plot([t.step for t in run.trace], [t.num_used_blocks for t in run.trace], label=label, color=colour)
        held = [(t.step, t.kv_held[longest] // run.block_size) for t in run.trace if longest in t.kv_held]
        left.plot(*zip(*held), color=colour, linestyle="--", label=f"request {longest}'s blocks")
    left.axhline(runs["full"].num_kv_blocks, color="#999999", linestyle=":", label="the pool")
    left.set_xlabel("step")
    left.set_ylabel("KV blocks in use")
    left.set_title("the demo scenario at stage 5: blocks in use (solid), one request's (dashed)")
    left.set_ylim(0, runs["full"].num_kv_blocks * 1.25)
    left.legend(loc="upper center", ncol=3, fontsize=7)
    left.grid(alpha=0.3)
    _draw_table(right, runs["window"])
    fig.tight_layout()
    png = _save(fig, out_dir / "02_sliding_window.png")
    rows_path = out_dir / "02_sliding_window.json"
    rows_path.write_text(json.dumps({"figure": png.name, "rows": rows}, indent=1) + "\n")
    return png, rows_path


def _longest_request(run: TracedRun) -> str:
    peaks: dict[str, int] = {}
    for t in run.trace:
        for rid, slots in t.kv_held.items():
            peaks[rid] = max(peaks.get(rid, 0), slots)
    return max(peaks, key=lambda rid: (peaks[rid], rid))


def _draw_table(ax, run: TracedRun) -> None:
    """The block table of the request holding the most table entries, at the step it holds them."""
    best = max(((t, rid) for t in run.trace for rid in t.block_tables), key=lambda x: len(x[0].block_tables[x[1]]))
    step, rid = best
    table = step.block_tables[rid]
    null = [i for i, b in enumerate(table) if b == 0 and i < len(table) - 1]
    for i, block in enumerate(table):
        dropped = i in null
        ax.add_patch(plt.Rectangle((i, 0), 0.95, 0.95, color="#dddddd" if dropped else "#0072b2"))
        ax.text(i + 0.47, 0.47, "∅" if dropped else str(block), ha="center", va="center",
                color="black" if dropped else "white", fontsize=10)  # fmt: skip
    ax.set_xlim(-0.1, len(table))
    ax.set_ylim(-0.6, 1.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"request {rid} at step {step.step}: {len(null)} of {len(table)} entries are the null block (∅)",
                 fontsize=9)  # fmt: skip
    ax.text(0, -0.4, "logical block 0 →", fontsize=8)
