"""`pagedlab bench prefix`: the shared-prefix stream, prefill saved by caching, the JSON rows, the figure."""

import functools
import json
import os

import pytest

from pagedlab.bench import get_bench, prefix, save_bench_figure
from pagedlab.bench.prefix import CORPUS_CHARS, corpus_token_ids, make_llm, prefix_rows
from pagedlab.bench.workloads import SHARED_PREFIX_LENS, shared_prefix_requests
from pagedlab.tools.cli import main

pytestmark = pytest.mark.stage4

REQUIRED_FIELDS = (
    "workload",
    "caching",
    "stage",
    "num_requests",
    "prompt_tokens",
    "computed_prefill_tokens",
    "hit_rate",
    "ttft_s",
    "total_s",
)
# A small stream: 8 static batches of 2, one output token or two (decode steps add nothing to what is measured here).
SMALL = {"num_requests": 16, "max_num_seqs": 2, "output_lens": (1, 2), "repeats": 1}


@pytest.fixture(scope="module")
def tokenizer():
    return make_llm(caching=False).get_tokenizer()


@pytest.fixture(scope="module")
def corpus(tokenizer):
    return corpus_token_ids(tokenizer, CORPUS_CHARS)


@pytest.fixture(scope="module")
def small_rows(corpus):
    return {w: prefix_rows(w, corpus, **SMALL) for w in SHARED_PREFIX_LENS}


# --- the stream -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", sorted(SHARED_PREFIX_LENS))
def test_prompts_share_exactly_the_prefix_tokens(workload, corpus, tokenizer):
    prefix_len = SHARED_PREFIX_LENS[workload]
    specs = shared_prefix_requests(workload, corpus, 32, seed=1)
    prompts = [list(s.prompt_token_ids) for s in specs]
    assert corpus[0] == tokenizer.token_to_id("<bos>")  # the prefix begins as a text prompt does
    assert all(p[:prefix_len] == corpus[:prefix_len] for p in prompts)
    assert len(os.path.commonprefix(prompts)) == prefix_len  # the suffixes part ways at once
    assert all(s.num_prefix_tokens == prefix_len and 8 <= s.prompt_len - prefix_len <= 20 for s in specs)
    assert all(4 <= s.output_len <= 16 for s in specs)
    assert specs == shared_prefix_requests(workload, corpus, 32, seed=1)
    assert specs != shared_prefix_requests(workload, corpus, 32, seed=2)


def test_bad_stream_arguments_are_value_errors(corpus):
    with pytest.raises(ValueError, match="workload must be one of"):
        shared_prefix_requests("ten-shot", corpus, 4)
    with pytest.raises(ValueError, match="corpus_ids: 300 tokens, but five-shot needs at least 361"):
        shared_prefix_requests("five-shot", corpus[:300], 4)
    with pytest.raises(ValueError, match="suffix_lens, output_lens"):
        shared_prefix_requests("one-shot", corpus, 4, suffix_lens=(0, 4))


# --- what caching saves ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", sorted(SHARED_PREFIX_LENS))
def test_caching_computes_only_what_the_cache_did_not_hold(workload, small_rows):
    off, on = small_rows[workload]
    assert (off["caching"], on["caching"]) == (False, True)
    assert off["prompt_tokens"] == on["prompt_tokens"]
    assert off["computed_prefill_tokens"] == off["prompt_tokens"] and off["hit_rate"] == 0.0
    assert on["computed_prefill_tokens"] == on["prompt_tokens"] - on["prefix_cache_hits"]
    # The first batch (2 requests) misses; every later request hits the prefix's full blocks of 16 tokens.
    assert on["prefix_cache_hits"] == (16 - 2) * (SHARED_PREFIX_LENS[workload] // 16 * 16)
    assert on["hit_rate"] == pytest.approx(on["prefix_cache_hits"] / on["prompt_tokens"])
    assert on["computed_prefill_tokens"] < off["computed_prefill_tokens"]
    assert on["same_tokens"], "caching changed a greedy token"


def test_five_shot_caching_computes_at_most_a_quarter_of_the_uncached_prefill(small_rows):
    off, on = small_rows["five-shot"]
    assert on["computed_prefill_tokens"] <= off["computed_prefill_tokens"] / 4
    assert on["computed_ratio"] == pytest.approx(on["computed_prefill_tokens"] / off["computed_prefill_tokens"])


@pytest.mark.slow
def test_the_bench_five_shot_stream_computes_at_most_a_quarter_with_caching(corpus):
    # The bench's own stream and batch size (64 requests, batches of 4), cut to one output token: prefill is unchanged.
    off, on = prefix_rows("five-shot", corpus, output_lens=(1, 1), repeats=1)
    assert on["computed_prefill_tokens"] <= off["computed_prefill_tokens"] / 4, on["computed_ratio"]


# --- the bench, the registry and the CLI ----------------------------------------------------------------------------


def test_cli_json_is_one_object_with_every_field_on_every_row(capsys, monkeypatch):
    small = SMALL | {"num_requests": 6, "output_lens": (1, 1)}
    monkeypatch.setattr(prefix, "measure_prefix", functools.partial(prefix.measure_prefix, **small))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "prefix", "--json", "--no-figure"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    result = json.loads(captured.out)  # stdout holds the JSON object and nothing else
    assert set(result) == {"bench", "rows"} and result["bench"] == "prefix"
    rows = result["rows"]
    assert [(r["workload"], r["caching"]) for r in rows] == [(w, c) for w in SHARED_PREFIX_LENS for c in (False, True)]
    for row in rows:
        assert all(field in row for field in REQUIRED_FIELDS), row
        assert row["stage"] == 4 and row["num_requests"] == 6 and 0 <= row["hit_rate"] <= 1
        assert row["ttft_s"] > 0 and row["total_s"] >= row["ttft_s"]
        assert set(row) == set(rows[0]), "every row has the same fields (null where they do not apply)"
    assert "computed" in captured.err and "paper" in captured.err  # the tables went to stderr


def test_bench_writes_the_figure(small_rows, tmp_path):
    rows = [r for pair in small_rows.values() for r in pair]
    assert save_bench_figure(get_bench("prefix"), rows, tmp_path).stat().st_size > 10_000
    assert (tmp_path / "04_prefix.png").exists()
