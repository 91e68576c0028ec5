"""`pagedlab bench serve` on a tiny stream: both systems, every field, a figure (real run: figures/08_serve.json)."""

import pytest

from pagedlab.bench import get_bench, save_bench_figure
from pagedlab.bench.serve import percentile, serve_rows

pytestmark = pytest.mark.stage5

FIELDS = ("system", "request_rate", "num_requests", "tokens_per_s", "requests_per_s", "normalized_latency_s",
          "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s")  # fmt: skip


def test_a_tiny_load_test_measures_both_systems_and_draws_them(tmp_path):
    from rich.console import Console

    rows = serve_rows(Console(quiet=True), rates=(40.0,), num_requests=6, repeats=1)
    assert sorted(r["system"] for r in rows) == ["continuous", "static"]
    for r in rows:
        assert all(r[f] is not None for f in FIELDS), r
        assert r["tokens_per_s"] > 0 and 0 < r["ttft_p50_s"] <= r["ttft_p99_s"] and r["num_requests"] == 6
    png = save_bench_figure(get_bench("serve"), rows + [dict(r, request_rate=80.0) for r in rows], tmp_path)
    assert png.exists() and png.stat().st_size > 10_000


def test_percentiles_are_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0
