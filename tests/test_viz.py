"""viz.py and figures.py: every drawing shows exactly the trace's numbers; `make_figures` writes the PNGs."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba

from pagedlab import LLM, SamplingParams, viz
from pagedlab.figures import FIGURES, make_figures

pytestmark = pytest.mark.stage1

MAX_TOKENS = [2, 4, 3]  # with max_num_seqs=2: batch 1 = requests 0 and 1 (4 steps), batch 2 = request 2 (3 steps)


@pytest.fixture(scope="module")
def run():
    """A tiny traced stage-1 run: regions of 4 blocks x 16 slots, two of them in the pool."""
    llm = LLM(stage=1, max_num_seqs=2, block_size=16, max_model_len=64, num_kv_blocks=8, record_trace=True)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in MAX_TOKENS]
    outs = llm.generate(["ROMEO:", "JULIET:", "HAMLET:"], params, use_tqdm=False)
    yield llm.engine.trace, outs
    plt.close("all")


def test_the_tiny_run_has_the_expected_shape(run):
    trace, _ = run
    assert len(trace) == 4 + 3
    assert viz.request_order(trace) == ["0", "1", "2"]
    assert trace[0].waiting == ["2"] and trace[4].running == ["2"]


def test_reserved_vs_used_bars_are_each_requests_peak(run):
    trace, outs = run
    ax = viz.plot_reserved_vs_used(trace).axes[0]
    used_bars, unused_bars = ax.containers
    # at its last step a request has fed every token but the last one sampled
    used = [len(o.prompt_token_ids) + len(o.outputs[0].token_ids) - 1 for o in outs]
    assert [b.get_height() for b in used_bars] == used
    assert [b.get_height() for b in unused_bars] == [64 - u for u in used]  # a region is 64 slots
    assert all(to_rgba(b.get_facecolor()) == to_rgba(viz.RESERVED) for b in unused_bars)
    assert f"{viz.used_share(trace):.1%} of held slots" in ax.get_title()


def test_used_share_is_used_over_held_summed_over_steps(run):
    trace, _ = run
    used = sum(sum(s.kv_used.values()) for s in trace)
    # a request holds its 64-slot region in each step it runs: one step per output token
    assert viz.used_share(trace) == used / (64 * sum(MAX_TOKENS))
    assert viz.used_share([]) == 0.0


def test_kv_over_steps_stacks_used_reserved_free_under_the_capacity(run):
    trace, _ = run
    ax = viz.plot_kv_over_steps(trace, num_kv_blocks=8, block_size=16).axes[0]
    assert len(ax.collections) == 3  # used, reserved but unused, free
    assert [line.get_ydata()[0] for line in ax.lines] == [8 * 16]  # the capacity line
    used_top = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert set(sum(s.kv_used.values()) for s in trace) <= set(used_top)
    assert used_top.max() == max(sum(s.kv_used.values()) for s in trace)
    free_top = ax.collections[2].get_paths()[0].vertices[:, 1]
    assert free_top.max() == 8 * 16


def _widths(collection) -> float:
    return sum(np.ptp(path.vertices[:, 0]) for path in collection.get_paths())


def test_batch_timeline_has_one_bar_set_per_request_and_state(run):
    trace, _ = run
    ax = viz.plot_batch_timeline(trace).axes[0]
    # request 0: prefill, decode, finished; 1: the same; 2: waiting, prefill, decode
    assert len(ax.collections) == 9
    by_colour = {}
    for c in ax.collections:
        key = tuple(c.get_facecolor()[0])
        by_colour[key] = by_colour.get(key, 0) + _widths(c)
    assert by_colour[to_rgba(viz.PREFILL)] == 3  # one prefill step each
    assert by_colour[to_rgba(viz.DECODE)] == sum(MAX_TOKENS) - 3
    assert by_colour[to_rgba(viz.WAITING)] == 4  # request 2 waits for the whole first batch
    assert by_colour[to_rgba(viz.FINISHED)] == (7 - 2) + (7 - 4)


def test_pool_colours_each_slot_by_the_trace(run):
    trace, _ = run
    step = trace[0]
    grid = np.asarray(
        viz.plot_pool(step, num_kv_blocks=8, block_size=16, blocks_per_row=4).axes[0].images[0].get_array()
    )
    assert grid.shape == (2, 64)  # one row per region here
    assert (grid == 2).sum() == sum(step.kv_used.values())
    assert (grid == 1).sum() == 2 * 64 - sum(step.kv_used.values())
    assert (grid[0, : step.kv_used["0"]] == 2).all() and grid[0, step.kv_used["0"]] == 1


def test_make_figures_writes_every_registered_png(tmp_path):
    open_before = len(plt.get_fignums())
    paths = make_figures(tmp_path / "figures")
    assert [p.name for p in paths] == ["01_reserved_vs_used.png", "01_kv_over_steps.png", "01_batch_timeline.png"]
    assert len(paths) == len(FIGURES)
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert len(plt.get_fignums()) == open_before  # every figure closed after saving
