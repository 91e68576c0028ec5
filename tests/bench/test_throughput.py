"""`pagedlab bench throughput`: the stream, rounds taken in turns, the JSON rows with their spread, equal tokens
across systems, honest words about the target, the figure (tiny streams; no test asserts a speed)."""

import contextlib
import functools
import io
import json

import pytest
import torch

from pagedlab import bench
from pagedlab.bench import get_bench, save_bench_figure
from pagedlab.bench.rounds import round_robin, spread
from pagedlab.bench.runs import BenchRequest, Run, best_run, hf_available, load_hf_model, serve_hf_generate
from pagedlab.bench.throughput import (
    ENGINE_SYSTEMS,
    HF_SYSTEM,
    EngineSystem,
    make_stream,
    needed_context,
    pool_blocks,
    serve_fresh,
    throughput_row,
)
from pagedlab.bench.throughput_report import draw_throughput, start_line, target_line
from pagedlab.errors import InvariantError
from pagedlab.model.loader import bundled_model_path, load_model
from pagedlab.model.tokenizer import Tokenizer
from pagedlab.oracle import greedy
from tests.equivalence import assert_matches_oracle

pytestmark = pytest.mark.stage5

REQUIRED_FIELDS = (
    "system",
    "workload",
    "num_requests",
    "num_kv_blocks",
    "tokens_per_s",
    "requests_per_s",
    "normalized_latency_s",
    "ttft_s",
    "preemptions",
)
# Six requests of a few tokens each, two seats: three static batches, and continuous refilling its seats; two rounds.
SMALL = {"num_requests": 6, "length_scale": 0.05, "max_num_seqs": 2, "repeats": 2}
SPREAD_FIELDS = ("tokens_per_s_median", "tokens_per_s_worst", "tokens_per_cpu_s", "tokens_per_cpu_s_median")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """As the bench runs: the machine's cores are shared, and oversubscribed threads make timings (and tests) crawl."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(bundled_model_path() / "tokenizer.json")


@functools.cache
def small_result() -> tuple[dict, str, str]:
    """The bench through its registry on the small stream: (the result, what it printed on stdout, on stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        result = bench.run_bench("throughput", as_json=True, figure=False, priority_table=False, **SMALL)
    return result, stdout.getvalue(), stderr.getvalue()


def test_stream_is_seeded_scaled_and_starts_with_bos():
    stream = make_stream(tokenizer(), 50, length_scale=0.25, seed=3)
    assert stream == make_stream(tokenizer(), 50, length_scale=0.25, seed=3)
    assert stream != make_stream(tokenizer(), 50, length_scale=0.25, seed=4)
    bos = tokenizer().encode("")[0]
    assert all(r.prompt_token_ids[0] == bos and r.max_tokens >= 1 for r in stream)
    assert all(len(r.prompt_token_ids) + r.max_tokens <= 2048 * 0.25 + 1 for r in stream)  # the paper's 2048, x 1/4
    full = make_stream(tokenizer(), 50, length_scale=1.0, seed=3)
    assert sum(r.max_tokens for r in stream) == pytest.approx(0.25 * sum(r.max_tokens for r in full), rel=0.05)


def test_the_pool_binds_the_batch_but_holds_the_longest_request():
    stream = make_stream(tokenizer(), 20, length_scale=0.5)
    blocks = [-(-(len(r.prompt_token_ids) + r.max_tokens) // 16) for r in stream]
    assert pool_blocks(stream, 32, 16) == max(max(blocks), int(32 * sum(blocks) / len(blocks) * 0.5))
    assert pool_blocks(stream, 32, 16) < sum(sorted(blocks)[-32:]), "static worst-case admission cannot fit 32"
    assert pool_blocks(stream, 1, 16) == max(blocks)


def test_json_stdout_is_one_object_with_every_field_of_every_system():
    result, stdout, _ = small_result()
    assert json.loads(stdout) == result and stdout.count("\n") == 1
    rows = result["rows"]
    expected = [s.name for s in ENGINE_SYSTEMS] + ([HF_SYSTEM] if hf_available() else [])
    assert [r["system"] for r in rows] == expected
    for row in rows:
        assert all(field in row for field in REQUIRED_FIELDS), row
        assert row["workload"] == "sharegpt" and row["num_requests"] == SMALL["num_requests"]
        for key in ("tokens_per_s", "requests_per_s", "normalized_latency_s", "ttft_s", "total_s", "steps", "cpu_s"):
            assert row[key] > 0, (row["system"], key)
        assert row["ttft_s"] <= row["latency_s"] and 0 <= row["same_tokens_as_static"] <= 1
        assert row["context_padding"] >= 1  # padding only adds to what the decodes need
        assert row["runs"] == row["repeats"] == 2 and all(row[key] > 0 for key in SPREAD_FIELDS)
        assert row["tokens_per_s_worst"] <= row["tokens_per_s_median"] <= row["tokens_per_s"]


# --- rounds: the systems take turns, and each reports its best run and the spread --------------------------------


def test_the_bench_runs_its_systems_in_turns_and_says_first_how_long_it_takes():
    err = small_result()[2]
    names = [s.name for s in ENGINE_SYSTEMS] + ([HF_SYSTEM] if hf_available() else [])
    lines = [line for line in err.splitlines() if line.startswith("throughput: round")]
    assert [line.split(", ", 1)[1].rstrip(" …") for line in lines] == names + names  # round 1, then round 2
    head = " ".join(err.split("throughput: round")[0].split())  # before the first run (rich may wrap it)
    assert head.startswith(f"throughput: {len(names)} systems x 2 rounds") and "on a quiet 2-core CPU" in head


def test_round_robin_calls_every_job_once_per_round_in_order():
    calls = []
    jobs = {name: functools.partial(calls.append, name) for name in ("static", "continuous", "hf-generate")}
    announced = []
    runs = round_robin(jobs, 3, lambda name, i: announced.append((i, name)))
    assert calls == ["static", "continuous", "hf-generate"] * 3
    assert announced == [(i, name) for i in (1, 2, 3) for name in jobs]
    assert {name: len(results) for name, results in runs.items()} == dict.fromkeys(jobs, 3)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        round_robin(jobs, 0)


def test_spread_is_the_best_the_median_and_the_worst():
    assert spread([3.0, 1.0, 2.0], "tokens_per_s") == {
        "tokens_per_s": 3.0,
        "tokens_per_s_median": 2.0,
        "tokens_per_s_worst": 1.0,
    }


def served(total_s: float, cpu_s: float, tokens=((1, 2), (3,))) -> Run:
    """A made-up run of a two-request stream (2 and 1 output tokens): only its times differ from run to run."""
    return Run([list(t) for t in tokens], [0.1, 0.2], [0.5, total_s], total_s, cpu_s, 3, 1, 0, 0.9, 8, 6)


def test_a_row_reports_the_fastest_run_and_the_spread_of_all_runs():
    stream = [BenchRequest((0, 5), 2), BenchRequest((0, 6, 7), 1)]
    runs = [served(3.0, 1.5), served(1.0, 2.0), served(2.0, 1.0)]  # 3 output tokens each
    row = throughput_row("static", stream, runs)
    assert row["total_s"] == 1.0 and row["tokens_per_s"] == 3.0  # the fastest run
    assert (row["tokens_per_s_median"], row["tokens_per_s_worst"]) == (1.5, 1.0)
    assert row["cpu_s"] == 1.0 and row["tokens_per_cpu_s"] == 3.0  # the least CPU time, whichever run it was
    assert row["tokens_per_cpu_s_worst"] == 1.5 and row["runs"] == 3


def test_identical_runs_that_produced_different_tokens_are_a_bug():
    with pytest.raises(InvariantError, match="changed between identical runs"):
        best_run("static", [served(1.0, 1.0), served(1.0, 1.0, tokens=((1, 2), (4,)))])


def ratio_rows(speedup: float, steps_ratio: float = 3.0) -> list[dict]:
    """Two made-up rows: continuous `speedup` x static's tokens/s, in 1 / steps_ratio of its steps."""
    base = {"tokens_per_s": 100.0, "tokens_per_s_median": 90.0, "tokens_per_cpu_s": 110.0, "requests_per_s": 1.0}
    base |= {"normalized_latency_s": 0.3, "ttft_s": 10.0, "steps": 3000}
    fast = {k: v * speedup for k, v in base.items()} | {"steps": 3000 / steps_ratio}
    return [base | {"system": "static"}, fast | {"system": "continuous"}]


def test_a_target_not_reached_is_said_plainly_with_what_bounds_it():
    line = target_line(ratio_rows(1.65))
    assert "1.65x tokens/s" in line and "is below the 2x target on this run" in line
    assert "static takes 3.00x the steps" in line and "on a CPU a step's cost grows" in line
    assert "on a GPU" in line and "the step ratio (3.00x) is the bound" in line
    assert "not met" not in line and "fail" not in line


def test_a_target_reached_is_said_as_plainly():
    assert "which meets the 2x target on this run" in target_line(ratio_rows(2.2))


def test_the_start_line_scales_its_estimate_with_the_rounds():
    one, four = (start_line({"repeats": n, "systems": ("static", "continuous")}) for n in (1, 4))
    assert one.startswith("throughput: 2 systems x 1 round,") and four.startswith("throughput: 2 systems x 4 rounds")
    assert "about" in one and "on a quiet 2-core CPU" in one


def test_rows_say_what_does_not_apply_and_share_one_pool():
    by = {r["system"]: r for r in small_result()[0]["rows"]}
    assert by["static"]["preemptions"] == 0  # worst-case admission never preempts
    assert by["static"]["num_kv_blocks"] == by["continuous"]["num_kv_blocks"]
    assert by["continuous-recompute"]["num_kv_blocks"] <= by["continuous"]["num_kv_blocks"]
    assert by["continuous-swap"]["num_kv_blocks"] == by["continuous-recompute"]["num_kv_blocks"]
    assert by["static"]["speedup_vs_static"] == 1.0
    if hf_available():
        assert by[HF_SYSTEM]["num_kv_blocks"] is None and by[HF_SYSTEM]["preemptions"] is None
        assert by[HF_SYSTEM]["speedup_vs_hf"] == 1.0


def test_every_system_generates_the_static_tokens_even_when_preempting():
    # Short prompts, 20 output tokens each; block_size 4.
    stream = [BenchRequest(r.prompt_token_ids, 20) for r in make_stream(tokenizer(), 5, length_scale=0.05)]
    blocks, args = pool_blocks(stream, 2, 4), {"max_num_seqs": 2, "block_size": 4}
    static = serve_fresh(ENGINE_SYSTEMS[0], stream, blocks, **args)
    # A pool that holds one whole request: two running requests outgrow it and preempt each other.
    tight = EngineSystem("continuous-recompute", "continuous", engine_args={"preemption_mode": "recompute"})
    swap = EngineSystem("continuous-swap", "continuous", engine_args={"preemption_mode": "swap"})
    served = {
        "continuous": serve_fresh(ENGINE_SYSTEMS[1], stream, blocks, **args),
        "continuous-recompute": serve_fresh(tight, stream, pool_blocks(stream, 1, 4), **args),
        "continuous-swap": serve_fresh(swap, stream, pool_blocks(stream, 1, 4), **args),
    }
    if hf_available():
        served[HF_SYSTEM] = serve_hf_generate(load_hf_model(bundled_model_path()), stream, 2, ignore_eos=True)
    assert served["continuous-recompute"].preemptions > 0 and served["continuous-swap"].preemptions > 0
    model = load_model().model
    for name, got in served.items():
        for i, (a, b) in enumerate(zip(got.token_ids, static.token_ids)):
            if a != b:  # only a near tie in the oracle's logits may tell them apart (97-architecture.md, Invariants)
                expected = greedy(model, list(stream[i].prompt_token_ids), stream[i].max_tokens)
                assert_matches_oracle(a, expected, f"{name} request {i}")
                assert_matches_oracle(b, expected, f"static request {i}")


def test_one_request_at_a_time_reads_exactly_the_context_its_decodes_need():
    # Prompts of 2+ tokens (a 1-token prompt's prefill would look like a decode), 3 and 6 output tokens.
    stream = [BenchRequest((0, 5, 6), 3), BenchRequest((0, 7, 8, 9, 10), 6)]
    assert needed_context(stream) == (4 + 5) + (6 + 7 + 8 + 9 + 10)
    served = serve_fresh(ENGINE_SYSTEMS[0], stream, pool_blocks(stream, 1, 4), max_num_seqs=1, block_size=4)
    assert served.decode_context == needed_context(stream)
    both = serve_fresh(ENGINE_SYSTEMS[0], stream, 2 * pool_blocks(stream, 1, 4), max_num_seqs=2, block_size=4)
    assert both.decode_context == 2 * (6 + 7) + (8 + 9 + 10)  # the short one is padded to the long one's context


def test_latencies_are_per_request_and_within_the_run():
    stream = make_stream(tokenizer(), 6, length_scale=0.05)
    served = serve_fresh(ENGINE_SYSTEMS[1], stream, pool_blocks(stream, 2, 16), max_num_seqs=2)
    assert len(served.latency_s) == len(served.first_token_s) == len(stream)
    assert all(0 < f <= lat <= served.wall_s for f, lat in zip(served.first_token_s, served.latency_s))


def test_figure_has_a_throughput_and_a_latency_panel(tmp_path):
    rows = small_result()[0]["rows"]
    fig = draw_throughput(rows)
    assert len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [r["system"] for r in rows]
    path = save_bench_figure(get_bench("throughput"), rows, tmp_path)
    assert path.name == "05_throughput.png" and path.stat().st_size > 0


def test_priority_serves_the_urgent_class_sooner():
    from pagedlab.bench.priority import priority_latencies

    stream = make_stream(tokenizer(), 12, length_scale=0.05)
    rows = priority_latencies(stream, pool_blocks(stream, 4, 4), 4, 4)
    by = {(r["policy"], r["priority"]): r for r in rows}
    assert {r["num_requests"] for r in rows} == {4}
    # Within one run, steps happen in order: the class admitted first gets its first tokens first.
    assert by[("priority", 0)]["ttft_s"] <= by[("priority", 2)]["ttft_s"]
