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


def test_url_loads_any_openai_server_here_pagedlab_serve_on_127_0_0_1():
    # What `pagedlab bench serve --url http://HOST:8000/v1` does to a real vLLM: only the OpenAI API is spoken, the
    # model is the first /v1/models lists. Tested against `pagedlab serve` on 127.0.0.1 (no vLLM server runs here).
    from rich.console import Console

    from pagedlab.bench.serve import _server

    server = _server(5)
    try:
        rows = serve_rows(Console(quiet=True), rates=(40.0,), num_requests=4, repeats=1, url=f"{server.url}/v1")
    finally:
        server.close()
    assert [(r["system"], r["request_rate"], r["num_requests"]) for r in rows] == [("url", 40.0, 4)]
    assert rows[0]["tokens_per_s"] > 0 and rows[0]["ttft_p50_s"] > 0
    with pytest.raises(ValueError, match="url: expected http://HOST:PORT/v1"):
        serve_rows(Console(quiet=True), url="localhost:8000")


def test_cli_url_belongs_to_the_serve_bench_only(capsys):
    from pagedlab.tools.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "memory", "--url", "http://127.0.0.1:1/v1"])
    assert done.value.code == 2 and "--url: only the serve bench" in capsys.readouterr().err
