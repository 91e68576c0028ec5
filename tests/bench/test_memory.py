"""`pagedlab bench memory`: the first-fit allocator, the slot accounting, the paper's ordering, the JSON rows."""

import functools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedlab import bench
from pagedlab.bench import memory
from pagedlab.bench.kv_spaces import FirstFitAllocator, make_space
from pagedlab.bench.memory import NUM_REQUESTS, SHARES, StepCounts, memory_rows, simulate
from pagedlab.bench.workloads import WORKLOADS, RequestSpec, sample_requests
from pagedlab.tools.cli import main

REQUIRED_FIELDS = (
    "system",
    "block_size",
    "workload",
    "num_requests",
    "token_states",
    "reservation",
    "internal_fragmentation",
    "external_fragmentation",
    "mean_batched_requests",
)


# --- workloads ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_workload_is_seeded_clipped_and_has_the_papers_means(workload):
    specs = sample_requests(workload, 4000, seed=1, max_model_len=2048)
    assert specs == sample_requests(workload, 4000, seed=1, max_model_len=2048)
    assert specs != sample_requests(workload, 4000, seed=2, max_model_len=2048)
    assert all(s.prompt_len >= 1 and s.output_len >= 1 and s.final_len <= 2048 for s in specs)
    shape = WORKLOADS[workload]
    # Clipping trims the tail a little: within 10 % of the paper's means.
    assert sum(s.prompt_len for s in specs) / len(specs) == pytest.approx(shape.input_mean, rel=0.1)
    assert sum(s.output_len for s in specs) / len(specs) == pytest.approx(shape.output_mean, rel=0.1)


def test_workload_respects_a_short_context_and_rejects_unknown_names():
    assert all(s.final_len <= 64 for s in sample_requests("sharegpt", 500, max_model_len=64))
    with pytest.raises(ValueError, match="workload must be one of"):
        sample_requests("wikitext", 10)


# --- the first-fit allocator ----------------------------------------------------------------------------------------


def test_first_fit_takes_the_lowest_hole_that_fits_and_fails_when_none_does():
    alloc = FirstFitAllocator(16)
    assert [alloc.allocate(4) for _ in range(3)] == [0, 4, 8]
    assert alloc.holes == [(12, 4)]
    alloc.free(4)  # a hole of 4 in the middle
    assert alloc.holes == [(4, 4), (12, 4)]
    assert alloc.allocate(2) == 4  # first fit: the lowest hole, although (12, 4) fits as well
    assert alloc.holes == [(6, 2), (12, 4)]
    assert alloc.allocate(3) == 12  # skips the hole of 2
    assert alloc.holes == [(6, 2), (15, 1)]
    assert alloc.allocate(3) is None  # 3 slots free in all, but no hole of 3: external fragmentation
    assert alloc.holes == [(6, 2), (15, 1)] and alloc.num_free == 3
    assert alloc.allocate(2) == 6 and alloc.allocate(1) == 15
    assert alloc.holes == [] and alloc.num_free == 0 and alloc.allocate(1) is None


def test_free_coalesces_with_the_holes_on_either_side():
    alloc = FirstFitAllocator(20)
    a, b, c, d = (alloc.allocate(5) for _ in range(4))
    alloc.free(a)  # no hole next to it
    alloc.free(c)
    assert alloc.holes == [(0, 5), (10, 5)]
    alloc.free(b)  # a hole on both sides: the three become one
    assert alloc.holes == [(0, 15)]
    alloc.free(d)  # a hole before it
    assert alloc.holes == [(0, 20)]
    assert alloc.allocate(5) == 0 and alloc.allocate(5) == 5
    alloc.free(5)  # a hole after it
    assert alloc.holes == [(5, 15)]
    alloc.free(0)
    assert alloc.holes == [(0, 20)] and alloc.allocated == {}


def test_free_of_a_region_never_handed_out_is_a_bug():
    alloc = FirstFitAllocator(8)
    start = alloc.allocate(4)
    alloc.free(start)
    with pytest.raises(AssertionError, match="freed twice"):
        alloc.free(start)


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12), st.integers(0, 100)), max_size=60))
def test_allocate_and_free_keep_holes_sorted_coalesced_and_tiling_the_pool(program):
    alloc, live = FirstFitAllocator(48), []
    for is_alloc, size, pick in program:
        if is_alloc or not live:
            start = alloc.allocate(size)
            fits = [s for s, length in alloc.holes if length >= size]
            if start is None:
                assert not fits
            else:
                live.append(start)
        else:
            alloc.free(live.pop(pick % len(live)))
        ends = [s + length for s, length in alloc.holes]
        assert all(end < nxt for end, (nxt, _) in zip(ends, alloc.holes[1:])), "holes overlap or touch"
        spans = sorted([*alloc.holes, *alloc.allocated.items()])
        assert [s for s, _ in spans] == [0, *(s + n for s, n in spans[:-1])] and sum(n for _, n in spans) == 48


# --- the simulation and its accounting ------------------------------------------------------------------------------


def test_oracle_reserves_final_lengths_and_blocks_the_queue_head():
    # Pool 16: r0 (final 5) takes slots 0..4, r1 (final 5) slots 5..9; r2 (final 11) does not fit the 6 left.
    specs = [RequestSpec(2, 3), RequestSpec(3, 2), RequestSpec(10, 1)]
    steps = simulate(make_space("contiguous-oracle", 16), specs).steps
    # Prefill: 2 + 3 tokens, 3 + 2 slots reserved for what is still to come, 6 slots free.
    assert steps[0] == StepCounts(5, 5, 0, 6, 2)
    assert steps[1] == StepCounts(7, 3, 0, 6, 2)
    # r1 finishes at step 3; its region and the 6 free slots coalesce into 11, so r2 is admitted at step 4
    # and the queue is empty: step 4 is no longer measured.
    assert len(steps) == 3


def test_max_and_pow2_waste_what_lies_beyond_the_final_length():
    # Max with max_model_len 8, and Pow2: both give r0 and r1 (final 5) 8 slots each, 3 of them never used.
    specs = [RequestSpec(2, 3), RequestSpec(3, 2), RequestSpec(4, 1)]
    assert simulate(make_space("contiguous-max", 16, max_model_len=8), specs).steps[0] == StepCounts(5, 5, 6, 0, 2)
    assert simulate(make_space("contiguous-pow2", 16), specs).steps[0] == StepCounts(5, 5, 6, 0, 2)


def test_paged_allocates_blocks_on_demand_and_counts_the_tail_of_the_last_block():
    # Pool 16 slots = 4 blocks of 4. r0 (2 + 3) and r1 (3 + 2) take a block each; r2 (10 + 1) needs 3 of the 2 left.
    specs = [RequestSpec(2, 3), RequestSpec(3, 2), RequestSpec(10, 1)]
    steps = simulate(make_space("paged", 16, block_size=4), specs).steps
    assert steps[0] == StepCounts(5, 3, 0, 8, 2)  # the rest of each first block is reserved for coming tokens
    assert steps[1] == StepCounts(7, 1, 0, 8, 2)
    # r1's fifth token opens a second block: 3 of its slots lie beyond its final length of 5.
    assert steps[2] == StepCounts(9, 0, 3, 4, 2)


def test_paged_preempts_the_newest_request_when_the_pool_runs_dry():
    # Pool 8 slots = 4 blocks of 2. r0 and r1 (3 + 3 each) take 2 blocks each; r2 waits.
    specs = [RequestSpec(3, 3), RequestSpec(3, 3), RequestSpec(1, 1)]
    result = simulate(make_space("paged", 8, block_size=2), specs)
    # Step 3: r0's fifth token needs a third block; none is free, so r1 (the newest) goes back to waiting.
    assert result.num_preemptions == 1
    assert result.steps[2] == StepCounts(5, 1, 0, 2, 1)
    # Step 4: r1 must recompute 5 tokens (3 blocks) but only 1 block is free: it waits while r0 finishes.
    assert result.steps[3] == StepCounts(6, 0, 0, 2, 1)
    assert len(result.steps) == 4 and result.num_finished == 1


@pytest.mark.parametrize(
    "system, block_size",
    [("contiguous-max", None), ("contiguous-pow2", None), ("contiguous-oracle", None), ("paged", 1), ("paged", 16)],
)
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_slot_is_counted_once_every_step(system, block_size, workload):
    specs = sample_requests(workload, {"sharegpt": 30, "alpaca": 200}[workload], seed=3, max_model_len=512)
    space = make_space(system, 2048, max_model_len=512, block_size=block_size)
    steps = simulate(space, specs).steps  # simulate asserts the same, before we look
    assert steps
    for s in steps:
        assert min(s.token_states, s.reservation, s.internal_fragmentation, s.external_fragmentation) >= 0
        assert s.token_states + s.reservation + s.internal_fragmentation + s.external_fragmentation == 2048
    if system == "paged":
        space.check_invariants()


def test_unknown_system_or_bad_block_size_is_a_value_error():
    with pytest.raises(ValueError, match="system must be one of"):
        make_space("orca", 1024)
    with pytest.raises(ValueError, match="divides pool_slots"):
        make_space("paged", 1000, block_size=16)


# --- the paper's results --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload, num_requests, pool_slots", [("sharegpt", 60, 4096), ("alpaca", 400, 4096)])
def test_token_states_grow_from_max_to_pow2_to_oracle_to_paged(workload, num_requests, pool_slots):
    rows = memory_rows(workload, num_requests, pool_slots, block_sizes=(16,))
    assert [r["system"] for r in rows] == ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"]
    tokens = [r["token_states"] for r in rows]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4, tokens
    batch = [r["mean_batched_requests"] for r in rows]
    assert batch[0] < batch[3], "paging must fit more requests in the same memory"


def test_paged_block_16_on_sharegpt_keeps_the_papers_963_percent_token_states():
    # The bench's own configuration: 16384 slots, max_model_len 2048, the default ShareGPT-like stream.
    specs = sample_requests("sharegpt", NUM_REQUESTS["sharegpt"], seed=0, max_model_len=2048)
    steps = simulate(make_space("paged", 16384, 2048, block_size=16), specs).steps
    token_states = sum(s.token_states for s in steps) / (len(steps) * 16384)
    assert token_states >= 0.963, f"paged token states {token_states:.4f} < the paper's 0.963"


# --- the bench, the registry and the CLI ----------------------------------------------------------------------------

# Small, but each stream still outlasts the pool: Alpaca requests are short, so it needs many more.
SMALL = {"pool_slots": 4096, "num_requests": {"sharegpt": 40, "alpaca": 400}, "block_sizes": (8, 16)}


def test_cli_json_is_one_object_with_every_field_on_every_row(capsys, monkeypatch):
    monkeypatch.setattr(memory, "measure_memory", functools.partial(memory.measure_memory, **SMALL))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "memory", "--json", "--no-figure"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    result = json.loads(captured.out)  # stdout holds the JSON object and nothing else
    assert set(result) == {"bench", "rows"} and result["bench"] == "memory"
    assert len(result["rows"]) == 2 * (3 + 2)
    for row in result["rows"]:
        assert all(field in row for field in REQUIRED_FIELDS), row
        assert (row["block_size"] is None) == row["system"].startswith("contiguous")
        assert sum(row[s] for s in SHARES) == pytest.approx(1.0)
        assert all(0 <= row[s] <= 1 for s in SHARES)
    assert "token states" in captured.err  # the table went to stderr


def test_bench_writes_the_figure_and_the_rows_it_was_drawn_from(tmp_path):
    from rich.console import Console

    from pagedlab.bench.common import read_rows

    result = bench.run_bench("memory", figures_dir=tmp_path, console=Console(quiet=True), **SMALL)
    assert (tmp_path / "02_memory.png").stat().st_size > 10_000
    written = read_rows(tmp_path / "02_memory.json")  # the same run's rows, beside the figure
    assert written["bench"] == "memory" and written["rows"] == result["rows"]
    paper = {r["system"]: r["paper_token_states"] for r in result["rows"] if r["workload"] == "sharegpt"}
    assert paper["contiguous-max"] == 0.204 and paper["paged"] == 0.963


def test_repeats_is_refused_by_a_bench_that_does_not_repeat(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "memory", "--repeats", "3", "--no-figure"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pagedlab bench: --repeats: only prefix, throughput, real and serve repeat their runs")
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "throughput", "--repeats", "0", "--no-figure"])
    assert exit_info.value.code == 2 and "--repeats must be >= 1, got 0" in capsys.readouterr().err


def test_unknown_bench_lists_the_known_ones(capsys):
    with pytest.raises(ValueError, match="unknown bench 'speed'; known: .*memory"):
        bench.run_bench("speed")
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "speed"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("pagedlab bench: unknown bench 'speed'")


def test_layouts_add_a_hybrid_models_rows_of_their_own_kind(capsys, monkeypatch):
    """--layouts: the KV bytes of the same requests under full-only, vLLM's groups and window-only, from the same
    count as chapter 2's table; the Figure-2 rows and tables are unchanged beside them (the default has none)."""
    from pagedlab.lessons.hybrid import saving_rows

    monkeypatch.setattr(memory, "measure_memory", functools.partial(memory.measure_memory, **SMALL))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "memory", "--json", "--no-figure", "--layouts"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    rows = json.loads(captured.out)["rows"]
    layouts = [r for r in rows if r["system"] == "kv-layout"]
    assert len(rows) - len(layouts) == 2 * (3 + 2) and all(field in r for r in layouts for field in REQUIRED_FIELDS)
    assert [(r["model"], r["layout"]) for r in layouts] == [(r["model"], r["layout"]) for r in saving_rows()]
    assert [r["share_of_full"] for r in layouts] == pytest.approx([r["share_of_full"] for r in saving_rows()])
    assert "hybrid (2 groups)" in captured.err and "token states" in captured.err
