"""The viz/ and figures/ packages: every drawing shows exactly the trace's numbers; `make_figures` writes the PNGs."""

import importlib.util

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba

from pagedlab import LLM, SamplingParams, viz
from pagedlab.engine.stats import StepTrace
from pagedlab.lessons import FIGURES, make_figures
from pagedlab.model.registry import SMOLLM2, is_fetched
from tests.conftest import need_dot

MAX_TOKENS = [2, 4, 3]  # with max_num_seqs=2: batch 1 = requests 0 and 1 (4 steps), batch 2 = request 2 (3 steps)


@pytest.fixture(scope="module")
def run():
    """A tiny traced stage-1 run: regions of 4 blocks x 16 slots, two of them in the pool."""
    llm = LLM(stage=1, max_num_seqs=2, block_size=16, max_model_len=64, num_kv_blocks=8, record_trace=True)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in MAX_TOKENS]
    outs = llm.generate(["ROMEO:", "JULIET:", "HAMLET:"], params, use_tqdm=False)
    yield llm.engine.trace, outs
    plt.close("all")


@pytest.mark.stage1
def test_the_tiny_run_has_the_expected_shape(run):
    trace, _ = run
    assert len(trace) == 4 + 3
    assert viz.request_order(trace) == ["0", "1", "2"]
    assert trace[0].waiting == ["2"] and trace[4].running == ["2"]


@pytest.mark.stage1
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


@pytest.mark.stage1
def test_used_share_is_used_over_held_summed_over_steps(run):
    trace, _ = run
    used = sum(sum(s.kv_used.values()) for s in trace)
    # a request holds its 64-slot region in each step it runs: one step per output token
    assert viz.used_share(trace) == used / (64 * sum(MAX_TOKENS))
    assert viz.used_share([]) == 0.0


@pytest.mark.stage1
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


@pytest.mark.stage1
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


@pytest.mark.stage1
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


CHAPTER6 = ["06_decode_programs.png", "06_parity.png", "06_parity.json"]  # need Triton; the parity rows beside
TRITON = importlib.util.find_spec("triton") is not None
CHAPTER7 = ["07_kv_per_token.png", "07_shared_prefix.png", "07_second_turn.png", "07_preemption.png"]


@pytest.mark.stage1
def test_make_figures_writes_every_registered_png(tmp_path):
    need_dot()  # without dot: tests/viz/test_no_graphviz.py
    open_before = len(plt.get_fignums())
    paths = make_figures(tmp_path / "figures")
    assert [p.name for p in paths] == [
        "01_reserved_vs_used.png",
        "01_kv_over_steps.png",
        "01_batch_timeline.png",
        "02_block_tables.png",
        "02_pool_occupancy.png",
        "02_sliding_window.png",
        "02_sliding_window.json",
        "02_hybrid_tables.png",
        "03_cow_before_after.png",
        "03_beam_tree.png",
        "04_hash_chain.png",
        "04_block_tables_hits.png",
        "05_gantt.png",
        "05_tokens_per_step.png",
        "05_swap_block_tables.png",
        "05_static_vs_continuous.png",
    ] + (CHAPTER6 if TRITON else []) + (CHAPTER7 if is_fetched(SMOLLM2) else [])  # chapter 7's need SmolLM2
    pngs = [p for p in paths if p.suffix == ".png"]  # one a figure
    assert len(pngs) == len(FIGURES) - (0 if TRITON else 2) - (0 if is_fetched(SMOLLM2) else len(CHAPTER7))
    for path in pngs:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert len(plt.get_fignums()) == open_before  # every figure closed after saving


# --- stage 2: block tables and pool occupancy ---------------------------------------------------------


@pytest.fixture(scope="module")
def paged_run():
    """A tiny traced stage-2 run: blocks of 4 slots, 16 of them; two requests at a time, then the third."""
    llm = LLM(stage=2, max_num_seqs=2, block_size=4, max_model_len=64, num_kv_blocks=16, record_trace=True)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 9, 5)]
    llm.generate(["ROMEO:", "JULIET:", "HAMLET:"], params, use_tqdm=False)
    yield llm.engine.trace
    plt.close("all")


def _patches(fig, prefix: str) -> dict[str, object]:
    """gid -> patch for the block cells whose gid starts with `prefix` ("logical:" or "physical:")."""
    return {p.get_gid(): p for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith(prefix)}


@pytest.mark.stage2
def test_paged_run_grows_block_tables_one_block_at_a_time(paged_run):
    for step in paged_run:
        for rid, blocks in step.block_tables.items():
            assert len(blocks) == -(-step.kv_used[rid] // 4)  # just enough blocks for the tokens with K/V


@pytest.mark.stage2
def test_block_tables_draw_one_cell_per_logical_block_labelled_with_its_physical_block(paged_run):
    step = paged_run[4]
    fig = viz.plot_block_tables(step, num_kv_blocks=16, block_size=4)
    cells = _patches(fig, "logical:")
    assert len(cells) == sum(len(blocks) for blocks in step.block_tables.values())
    for row, (rid, blocks) in enumerate(step.block_tables.items()):
        colour = to_rgba(viz.request_colour(row))
        assert all(to_rgba(cells[f"logical:{rid}:{i}"].get_facecolor()) == colour for i in range(len(blocks)))
        texts = sorted(
            (t.get_position()[0], t.get_text()) for t in fig.axes[0].texts if t.get_position()[1] == row + 0.5
        )
        last = step.kv_used[rid] - 4 * (len(blocks) - 1)  # tokens in the last block
        assert [text for _, text in texts] == [str(b) for b in blocks] + [f"{last}/4"]
        assert cells[f"logical:{rid}:{len(blocks) - 1}"].get_width() == last / 4  # its solid part


@pytest.mark.stage2
def test_block_pool_colours_each_physical_block_by_its_owner(paged_run):
    step = paged_run[4]
    fig = viz.plot_block_tables(step, num_kv_blocks=16, block_size=4)
    cells = _patches(fig, "physical:")
    assert len(cells) == 16
    owner = {b: rid for rid, blocks in step.block_tables.items() for b in blocks}
    colour = {rid: to_rgba(viz.request_colour(i)) for i, rid in enumerate(step.block_tables)}
    for block_id in range(16):
        expected = colour[owner[block_id]] if block_id in owner else to_rgba(viz.FREE)
        assert to_rgba(cells[f"physical:{block_id}"].get_facecolor()) == expected, block_id
    free = [p for p in cells.values() if to_rgba(p.get_facecolor()) == to_rgba(viz.FREE)]
    assert len(free) == 16 - step.num_used_blocks
    first = next(iter(step.block_tables))
    arrows = [a.get_gid() for a in fig.artists]
    assert arrows == [f"arrow:{first}:{i}" for i in range(len(step.block_tables[first]))]


@pytest.mark.stage2
def test_block_held_by_two_tables_is_drawn_shared():
    step = StepTrace(1, 0.0, {}, [], ["a", "b"], kv_used={"a": 8, "b": 5}, block_tables={"a": [3, 0], "b": [3, 1]})
    fig = viz.plot_block_tables(step, num_kv_blocks=4, block_size=4, order=["b", "a"], arrows_for=[])
    cells = _patches(fig, "physical:")
    assert to_rgba(cells["physical:3"].get_facecolor()) == to_rgba(viz.SHARED)
    assert to_rgba(cells["physical:0"].get_facecolor()) == to_rgba(viz.request_colour(1))  # `order` sets colours
    assert to_rgba(cells["physical:2"].get_facecolor()) == to_rgba(viz.FREE)
    assert cells["physical:1"].get_width() == 1 / 4  # b's second block holds its fifth token only
    assert not fig.artists


@pytest.mark.stage2
def test_pool_occupancy_stacks_each_requests_blocks_and_counts_running_requests(paged_run):
    blocks_ax, running_ax = viz.plot_pool_occupancy(paged_run, num_kv_blocks=16).axes[:2]
    assert len(blocks_ax.collections) == 3  # one band per request
    top = blocks_ax.collections[-1].get_paths()[0].vertices[:, 1]
    assert set(top) >= {s.num_used_blocks for s in paged_run}
    assert top.max() == max(s.num_used_blocks for s in paged_run)
    assert [line.get_ydata()[0] for line in blocks_ax.lines] == [16]  # the capacity line
    running = running_ax.collections[0].get_paths()[0].vertices[:, 1]
    assert running.max() == 2
    mean = sum(len(s.running) for s in paged_run) / len(paged_run)
    assert f"{mean:.1f} requests running on average (at most 2)" in blocks_ax.get_title(loc="left")


# --- stage 4: prefix-cache hits and cached-but-free blocks ---------------------------------------------------------


@pytest.mark.stage4
def test_block_tables_outline_hits_and_draw_free_cached_blocks_cached():
    step = StepTrace(1, 0.0, {}, [], ["a", "b"], kv_used={"a": 8, "b": 6}, block_tables={"a": [0, 1], "b": [0, 2]})
    fig = viz.plot_block_tables(step, num_kv_blocks=6, block_size=4, arrows_for=[], hits={"b": 1}, cached=[0, 1, 4])
    outlines = sorted(p.get_gid() for ax in fig.axes for p in ax.patches if (p.get_gid() or "").startswith("hit:"))
    assert outlines == ["hit:b:0", "hit:physical:0"]  # b's first block was a hit; a computed its own
    cells = _patches(fig, "physical:")
    assert to_rgba(cells["physical:4"].get_facecolor()) == to_rgba(viz.CACHED)  # free, still carries a hash
    assert to_rgba(cells["physical:5"].get_facecolor()) == to_rgba(viz.FREE)
    assert to_rgba(cells["physical:1"].get_facecolor()) == to_rgba(viz.request_colour(0))  # held: its owner's colour
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[-2:] == ["cached, free (keeps its hash)", "prefix-cache hit"]


@pytest.mark.stage4
def test_prefix_hits_and_cached_blocks_come_from_a_stage4_run():
    llm = LLM(stage=4, block_size=4, num_kv_blocks=12, max_num_seqs=1, record_trace=True)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate(["ROMEO:\nBut soft", "ROMEO:\nBut hark"], params, use_tqdm=False)  # 16 tokens each
    trace, pool = llm.engine.trace, llm.engine.kv_manager.pool
    assert viz.prefix_hit_blocks(trace, 4) == {"0": 0, "1": 3}  # "<bos>ROM" "EO:\n" "But " are shared
    assert trace[2].scheduled == {"1": 16 - 12}
    assert viz.cached_block_ids(pool) == {b.block_id for b in pool.blocks if b.block_hash is not None}
    assert len(viz.cached_block_ids(pool)) == 4 + 1  # request 0's four full blocks, request 1's own last one


# --- stage 5: schedules, tokens per step, preemption, the CPU swap pool ---------------------------------------------


def _trace(*steps) -> list[StepTrace]:
    """StepTraces from (scheduled, waiting, running, kv_used) tuples, numbered from 1."""
    return [StepTrace(i, 0.0, sch, w, r, kv_used=used) for i, (sch, w, r, used) in enumerate(steps, 1)]


@pytest.mark.stage5
def test_schedule_states_tell_chunks_decodes_idle_and_preemption_apart():
    # a: 5-token prompt in chunks of 3 and 2 (samples in step 2), decodes, is preempted in step 4, comes back
    # in step 5. b: waits, then runs a 1-token chunk that does not reach its 3-token prompt's end, then is idle.
    trace = _trace(
        ({"a": 3}, ["b"], ["a"], {"a": 3}),
        ({"a": 2}, ["b"], ["a"], {"a": 5}),
        ({"a": 1, "b": 1}, [], ["a", "b"], {"a": 6, "b": 1}),
        ({"b": 2}, ["a"], ["b"], {"b": 3}),
        ({"a": 1}, [], ["b", "a"], {"b": 3, "a": 7}),
    )
    trace[-1].finished = ["a"]
    assert viz.preemption_events(trace) == [(4, "a")]
    assert viz.samples_in(trace, {"a": 5, "b": 3}) == {
        "a": [False, True, True, False, True],
        "b": [False, False, False, True, False],
    }
    states = viz.schedule_states(trace, {"a": 5, "b": 3})
    assert states["a"] == ["prefill", "prefill", "decode", "preempted", "decode"]
    assert states["b"] == ["waiting", "waiting", "prefill", "prefill", "idle"]  # a 1-token chunk is still prefill
    assert viz.schedule_states(trace)["b"][2] == "decode"  # without prompt lengths, one token looks like a decode
    # a came back with all 6 computed tokens it left with: swapped; with fewer, it fell back to recompute
    assert viz.schedule_states(trace, preemption_mode="swap")["a"][3] == "swapped"
    trace[4].kv_used["a"] = 1
    assert viz.schedule_states(trace, preemption_mode="swap")["a"][3] == "preempted"


@pytest.fixture(scope="module")
def continuous_runs():
    """Tiny traced stage-5 runs, recompute and swap: 8 blocks of 4, budget 8, chunks of 3; request 2 is preempted."""
    runs = {}
    for mode in ("recompute", "swap"):
        llm = LLM(
            stage=5,
            block_size=4,
            num_kv_blocks=8,
            max_num_seqs=3,
            max_num_batched_tokens=8,
            long_prefill_token_threshold=3,
            preemption_mode=mode,
            num_swap_blocks=8 if mode == "swap" else 0,
            record_trace=True,
        )
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (8, 10, 6)]
        outs = llm.generate(["ROMEO:", "JULIET:", "HAMLET:"], params, use_tqdm=False)
        runs[mode] = (llm, viz.prompt_lens_of(outs))
    yield runs
    plt.close("all")


def _width_by_colour(ax) -> dict[tuple, float]:
    widths: dict[tuple, float] = {}
    for c in ax.collections:
        if len(c.get_facecolor()):
            key = tuple(c.get_facecolor()[0])
            widths[key] = widths.get(key, 0) + _widths(c)
    return widths


@pytest.mark.stage5
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_gantt_draws_every_request_step_in_its_states_colour(continuous_runs, mode):
    llm, lens = continuous_runs[mode]
    trace = llm.engine.trace
    events = viz.preemption_events(trace)
    assert len(events) == llm.engine.stats.num_preemptions == 1 and events[0][1] == "2"
    states = viz.schedule_states(trace, lens, mode)
    counts = {}
    for per_step in states.values():
        for state in per_step:
            counts[state] = counts.get(state, 0) + 1
    gone = "swapped" if mode == "swap" else "preempted"
    assert counts[gone] == sum(1 for step in trace if "2" in step.waiting)  # every step it waited after running
    ax = viz.plot_schedule_gantt(trace, lens, mode).axes[0]
    widths = _width_by_colour(ax)
    colours = {
        "prefill": viz.PREFILL,
        "decode": viz.DECODE,
        gone: viz.PREEMPTED if gone == "preempted" else viz.SWAPPED,
    }
    for state, colour in colours.items():
        assert widths[to_rgba(colour)] == counts[state], state
    assert f"{len(trace)} steps, 1 preemptions" in ax.get_title(loc="left")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2"]


@pytest.mark.stage5
def test_swap_resumes_where_recompute_prefills_again(continuous_runs):
    recompute = viz.schedule_states(*_args(continuous_runs, "recompute"))["2"]
    swap = viz.schedule_states(*_args(continuous_runs, "swap"))["2"]
    back = recompute.index("preempted") + recompute.count("preempted")
    assert recompute[back] == "prefill"  # its K/V were dropped: it feeds its tokens again, in chunks
    back = swap.index("swapped") + swap.count("swapped")
    assert swap[back] == "decode"  # its K/V came back from the CPU: it decodes at once
    assert len(swap) < len(recompute)


def _args(runs, mode):
    llm, lens = runs[mode]
    return llm.engine.trace, lens, mode


@pytest.mark.stage5
def test_tokens_per_step_stack_prefill_on_decode_under_the_budget(continuous_runs):
    llm, lens = continuous_runs["recompute"]
    trace = llm.engine.trace
    prefill, decode = viz.tokens_per_step(trace, lens)
    assert [p + d for p, d in zip(prefill, decode)] == [sum(s.scheduled.values()) for s in trace]
    assert max(p + d for p, d in zip(prefill, decode)) <= 8
    assert prefill[0] == 8 and decode[0] == 0  # step 1: three prompts, chunks of 3 + 3 + 2
    ax = viz.plot_tokens_per_step(trace, 8, lens).axes[0]
    decode_bars, prefill_bars = ax.containers
    assert [b.get_height() for b in decode_bars] == decode
    assert [b.get_height() for b in prefill_bars] == prefill
    assert [b.get_y() for b in prefill_bars] == decode  # stacked on the decodes
    assert [line.get_ydata()[0] for line in ax.lines] == [8]  # the budget line
    assert f"{sum(prefill)} prefill + {sum(decode)} decode in {len(trace)} steps" in ax.get_title(loc="left")


@pytest.mark.stage5
def test_kv_over_steps_marks_the_steps_that_preempted(continuous_runs):
    llm, _ = continuous_runs["recompute"]
    ax = viz.plot_kv_over_steps(llm.engine.trace, 8, 4, mark_preemptions=True).axes[0]
    marks = [c for c in ax.collections if c.get_label() == "a preemption"]
    assert len(marks) == 1
    assert [seg[0][0] for seg in marks[0].get_segments()] == [5]  # request 2 was preempted in step 5


@pytest.mark.stage5
def test_block_tables_draw_the_cpu_swap_pool_as_a_second_lane():
    step = StepTrace(1, 0.0, {"a": 1}, ["b"], ["a"], kv_used={"a": 5}, block_tables={"a": [2, 0]})
    fig = viz.plot_block_tables(step, num_kv_blocks=4, block_size=4, swapped={"b": [0, 1, 2]}, num_swap_blocks=6)
    cpu = _patches(fig, "cpu:")
    assert len(cpu) == 6
    assert [to_rgba(cpu[f"cpu:{i}"].get_facecolor()) for i in range(6)] == [to_rgba(viz.SWAPPED)] * 3 + [
        to_rgba(viz.FREE)
    ] * 3
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert "CPU swap pool: 3 of 6 blocks (req b: 0-2)" in texts and "1\n(b)" in texts
    assert fig.legends[0].get_texts()[-1].get_text() == "CPU block holding a swapped-out request's K/V"
    assert not _patches(viz.plot_block_tables(step, num_kv_blocks=4, block_size=4), "cpu:")  # off by default


@pytest.mark.stage5
def test_swapped_block_ids_read_the_swap_pool():
    llm = LLM(stage=5, block_size=4, num_kv_blocks=5, max_num_batched_tokens=64, preemption_mode="swap")
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    llm.engine.add_request("a", [0] + [5] * 6, params)
    llm.engine.add_request("b", [0] + [6] * 6, params)
    seen = {}
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
        seen |= viz.swapped_block_ids(llm.engine.kv_manager)
    assert seen == {"b": [0, 1]}  # b (the newest) went out with its two blocks, into CPU blocks 0 and 1
    assert viz.swapped_block_ids(llm.engine.kv_manager) == {}


@pytest.mark.stage5
@pytest.mark.parametrize("mode, mark", [("recompute", "*"), ("swap", "~")])
def test_demo_marks_preempted_requests_in_the_waiting_queue(mode, mark):
    from pagedlab.viz.terminal import waiting_labels

    llm = LLM(
        stage=5, block_size=4, num_kv_blocks=5, max_num_batched_tokens=64, preemption_mode=mode, record_trace=True
    )
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    llm.engine.add_request("a", [0] + [5] * 6, params)
    llm.engine.add_request("b", [0] + [6] * 6, params)
    labels = []
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
        labels.append(waiting_labels(llm.engine.trace[-1]))
    assert f"b{mark}" in labels and set(labels) == {"", f"b{mark}"}  # b, the newest, waits again after preemption
