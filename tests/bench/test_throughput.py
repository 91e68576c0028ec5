"""`pagedlab bench throughput`: the stream, the JSON rows, equal tokens across systems, the figure (tiny streams)."""

import contextlib
import functools
import io
import json

import pytest
import torch

from pagedlab import bench
from pagedlab.bench.hf_generate import hf_available, load_hf_model, serve_hf
from pagedlab.bench.throughput import (
    ENGINE_SYSTEMS,
    HF_SYSTEM,
    EngineSystem,
    StreamRequest,
    make_stream,
    needed_context,
    pool_blocks,
    serve_engine,
)
from pagedlab.bench.throughput_report import plot_throughput, save_throughput_figure
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
# Six requests of a few tokens each, two seats: three static batches, and continuous refilling its seats.
SMALL = {"num_requests": 6, "length_scale": 0.05, "max_num_seqs": 2}


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
def small_result() -> tuple[dict, str]:
    """The bench through its registry on the small stream: (the result, what it printed on stdout)."""
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        result = bench.run_bench("throughput", as_json=True, figure=False, priority_table=False, **SMALL)
    return result, stdout.getvalue()


def test_stream_is_seeded_scaled_and_starts_with_bos():
    stream = make_stream(tokenizer(), 50, length_scale=0.25, seed=3)
    assert stream == make_stream(tokenizer(), 50, length_scale=0.25, seed=3)
    assert stream != make_stream(tokenizer(), 50, length_scale=0.25, seed=4)
    bos = tokenizer().encode("")[0]
    assert all(r.prompt_token_ids[0] == bos and r.output_len >= 1 for r in stream)
    assert all(len(r.prompt_token_ids) + r.output_len <= 2048 * 0.25 + 1 for r in stream)  # the paper's 2048, x 1/4
    full = make_stream(tokenizer(), 50, length_scale=1.0, seed=3)
    assert sum(r.output_len for r in stream) == pytest.approx(0.25 * sum(r.output_len for r in full), rel=0.05)


def test_the_pool_binds_the_batch_but_holds_the_longest_request():
    stream = make_stream(tokenizer(), 20, length_scale=0.5)
    blocks = [-(-(len(r.prompt_token_ids) + r.output_len) // 16) for r in stream]
    assert pool_blocks(stream, 32, 16) == max(max(blocks), int(32 * sum(blocks) / len(blocks) * 0.5))
    assert pool_blocks(stream, 32, 16) < sum(sorted(blocks)[-32:]), "static worst-case admission cannot fit 32"
    assert pool_blocks(stream, 1, 16) == max(blocks)


def test_json_stdout_is_one_object_with_every_field_of_every_system():
    result, stdout = small_result()
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
    stream = [StreamRequest(r.prompt_token_ids, 20) for r in make_stream(tokenizer(), 5, length_scale=0.05)]
    blocks, args = pool_blocks(stream, 2, 4), {"max_num_seqs": 2, "block_size": 4}
    static = serve_engine(ENGINE_SYSTEMS[0], stream, blocks, **args)
    # A pool that holds one whole request: two running requests outgrow it and preempt each other.
    tight = EngineSystem("continuous-recompute", "continuous", engine_args={"preemption_mode": "recompute"})
    swap = EngineSystem("continuous-swap", "continuous", engine_args={"preemption_mode": "swap"})
    served = {
        "continuous": serve_engine(ENGINE_SYSTEMS[1], stream, blocks, **args),
        "continuous-recompute": serve_engine(tight, stream, pool_blocks(stream, 1, 4), **args),
        "continuous-swap": serve_engine(swap, stream, pool_blocks(stream, 1, 4), **args),
    }
    if hf_available():
        served[HF_SYSTEM] = serve_hf(load_hf_model(), stream, 2)
    assert served["continuous-recompute"].preemptions > 0 and served["continuous-swap"].preemptions > 0
    model = load_model().model
    for name, got in served.items():
        for i, (a, b) in enumerate(zip(got.token_ids, static.token_ids)):
            if a != b:  # only a near tie in the oracle's logits may tell them apart (97-architecture.md, Invariants)
                expected = greedy(model, list(stream[i].prompt_token_ids), stream[i].output_len)
                assert_matches_oracle(a, expected, f"{name} request {i}")
                assert_matches_oracle(b, expected, f"static request {i}")


def test_one_request_at_a_time_reads_exactly_the_context_its_decodes_need():
    # Prompts of 2+ tokens (a 1-token prompt's prefill would look like a decode), 3 and 6 output tokens.
    stream = [StreamRequest((0, 5, 6), 3), StreamRequest((0, 7, 8, 9, 10), 6)]
    assert needed_context(stream) == (4 + 5) + (6 + 7 + 8 + 9 + 10)
    served = serve_engine(ENGINE_SYSTEMS[0], stream, pool_blocks(stream, 1, 4), max_num_seqs=1, block_size=4)
    assert served.decode_context == needed_context(stream)
    both = serve_engine(ENGINE_SYSTEMS[0], stream, 2 * pool_blocks(stream, 1, 4), max_num_seqs=2, block_size=4)
    assert both.decode_context == 2 * (6 + 7) + (8 + 9 + 10)  # the short one is padded to the long one's context


def test_latencies_are_per_request_and_within_the_run():
    stream = make_stream(tokenizer(), 6, length_scale=0.05)
    served = serve_engine(ENGINE_SYSTEMS[1], stream, pool_blocks(stream, 2, 16), max_num_seqs=2)
    assert len(served.latency_s) == len(served.first_token_s) == len(stream)
    assert all(0 < f <= lat <= served.total_s for f, lat in zip(served.first_token_s, served.latency_s))


def test_figure_has_a_throughput_and_a_latency_panel(tmp_path):
    rows = small_result()[0]["rows"]
    fig = plot_throughput(rows)
    assert len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [r["system"] for r in rows]
    path = save_throughput_figure(rows, tmp_path)
    assert path.name == "05_throughput.png" and path.stat().st_size > 0


def test_priority_serves_the_urgent_class_sooner():
    from pagedlab.bench.priority import priority_latencies

    stream = make_stream(tokenizer(), 12, length_scale=0.05)
    rows = priority_latencies(stream, pool_blocks(stream, 4, 4), 4, 4)
    by = {(r["policy"], r["priority"]): r for r in rows}
    assert {r["num_requests"] for r in rows} == {4}
    # Within one run, steps happen in order: the class admitted first gets its first tokens first.
    assert by[("priority", 0)]["ttft_s"] <= by[("priority", 2)]["ttft_s"]
