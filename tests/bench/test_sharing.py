"""`pagedlab bench sharing`: real prompts, blocks saved by sharing (n > 1 samples, beams), the JSON rows, the figure."""

import functools
import json

import pytest

from pagedlab.bench import get_bench, save_bench_figure, sharing
from pagedlab.bench.sharing import (
    PAPER_SAVED,
    STREAMS,
    Stream,
    add_requests,
    corpus_token_ids,
    sharing_row,
    sharing_rows,
)
from pagedlab.bench.sharing_report import draw_sharing
from pagedlab.bench.workloads import RequestSpec, corpus_prompts, sample_requests
from pagedlab.tools.cli import main

pytestmark = pytest.mark.stage3

REQUIRED_FIELDS = ("mode", "width", "workload", "block_size", "saved")
# Two short requests: prompts of 2+ full blocks of 16 (shared by samples and beams), a few output tokens.
TINY = [RequestSpec(prompt_len=40, output_len=8), RequestSpec(prompt_len=23, output_len=6)]


@pytest.fixture(scope="module")
def corpus():
    return corpus_token_ids()


@pytest.fixture(scope="module")
def tiny_prompts(corpus):
    return corpus_prompts(TINY, corpus, seed=0)


def tiny_row(mode: str, width: int, prompts, specs=TINY) -> dict:
    return sharing_row(mode, width, "alpaca", specs, prompts, max_model_len=64)


# --- real prompts ---------------------------------------------------------------------------------------------------


def test_corpus_prompts_are_bos_then_a_seeded_run_of_the_corpus(corpus):
    specs = sample_requests("alpaca", 20, seed=0)
    prompts = corpus_prompts(specs, corpus, seed=0)
    assert [len(p) for p in prompts] == [s.prompt_len for s in specs]
    assert corpus[0] == 0 and all(p[0] == 0 for p in prompts)  # <bos>, as a text prompt of the bundled model
    text = bytes(corpus[1:])  # one byte per token (68 ids): a run of the corpus is a substring
    assert all(bytes(p[1:]) in text for p in prompts)
    assert prompts == corpus_prompts(specs, corpus, seed=0)
    assert prompts != corpus_prompts(specs, corpus, seed=1)


def test_corpus_prompts_need_a_corpus_long_enough():
    assert corpus_prompts([RequestSpec(1, 1)], [0]) == [[0]]  # a one-token prompt is <bos> alone
    with pytest.raises(ValueError, match="corpus_ids: 3 tokens after <bos>"):
        corpus_prompts([RequestSpec(5, 1)], [0, 7, 8, 9])


# --- what sharing saves ---------------------------------------------------------------------------------------------


def test_parallel_sampling_shares_the_prompts_full_blocks_exactly(corpus):
    # One request, prompt 33 = 2 full blocks of 16 + 1 token, n = 2, 3 output tokens:
    #   step 1  the leader prefills 32 tokens: blocks A B               used 2, needed 2 (the other child: no table)
    #   step 2  fork; each child feeds token 32 into a block of its own  [A B C] [A B D]: used 4, needed 6
    #   step 3  each writes its first output token into C / D            used 4, needed 6
    #   step 4  the third output token ends both; every block is freed  used 0, needed 0
    specs = [RequestSpec(prompt_len=33, output_len=3)]
    row = tiny_row("parallel", 2, corpus_prompts(specs, corpus), specs)
    assert (row["steps"], row["used_blocks"], row["needed_blocks"]) == (4, 10, 14)
    assert row["saved"] == pytest.approx(1 - 10 / 14)


@pytest.mark.parametrize("mode", ["parallel", "beam"])
def test_one_sample_or_one_beam_shares_nothing(mode, tiny_prompts):
    row = tiny_row(mode, 1, tiny_prompts)
    assert row["saved"] == 0 and row["used_blocks"] == row["needed_blocks"] > 0


@pytest.mark.parametrize("width", [2, 4])
def test_beams_share_more_than_parallel_samples(width, tiny_prompts):
    parallel, beam = (tiny_row(mode, width, tiny_prompts)["saved"] for mode in ("parallel", "beam"))
    assert 0 < parallel < beam < 1


def test_more_samples_save_more(tiny_prompts):
    saved = [tiny_row("parallel", n, tiny_prompts)["saved"] for n in (2, 4, 6)]
    assert saved == sorted(saved) and len(set(saved)) == 3, saved


def test_a_run_is_deterministic(tiny_prompts):
    assert tiny_row("parallel", 2, tiny_prompts)["used_blocks"] == tiny_row("parallel", 2, tiny_prompts)["used_blocks"]
    assert tiny_row("beam", 2, tiny_prompts)["used_blocks"] == tiny_row("beam", 2, tiny_prompts)["used_blocks"]


def test_unknown_mode_is_a_value_error(tiny_prompts):
    with pytest.raises(ValueError, match="mode must be one of"):
        add_requests(None, "greedy", 2, TINY, tiny_prompts)


@pytest.mark.slow
def test_beam_width_4_on_the_alpaca_stream_saves_at_least_the_papers_width_2(corpus):
    # The Done criterion: the bench's own Alpaca-like stream and engine, beam width 4 (paper: 53.1 %; >= 37.6 %).
    (row,) = sharing_rows("alpaca", STREAMS["alpaca"], corpus, widths=(4,), modes=("beam",))
    assert row["saved"] >= 0.376, f"beam width 4 saved {row['saved']:.4f} < 0.376"


# --- the bench, the registry, the CLI and the figure ----------------------------------------------------------------

SMALL = {"streams": {"alpaca": Stream(2, 64), "sharegpt": Stream(1, 96)}, "widths": (2,)}


def test_cli_json_is_one_object_with_every_field_on_every_row(capsys, monkeypatch):
    monkeypatch.setattr(sharing, "measure_sharing", functools.partial(sharing.measure_sharing, **SMALL))
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "sharing", "--json", "--no-figure"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    result = json.loads(captured.out)  # stdout holds the JSON object and nothing else
    assert set(result) == {"bench", "rows"} and result["bench"] == "sharing"
    rows = result["rows"]
    assert {(r["workload"], r["mode"], r["width"]) for r in rows} == {
        (w, m, 2) for w in ("alpaca", "sharegpt") for m in ("parallel", "beam")
    }
    for row in rows:
        assert all(field in row for field in REQUIRED_FIELDS), row
        assert row["block_size"] == 16 and 0 <= row["saved"] < 1
        assert row["paper_saved"] == PAPER_SAVED[(row["workload"], row["mode"], 2)]
    assert "Σ used / Σ needed" in captured.err  # the table, with the definition, went to stderr


def test_the_figure_has_both_panels_and_is_written(tmp_path):
    rows = [
        {"mode": m, "width": w, "workload": wl, "block_size": 16, "saved": 0.1 * w, "paper_saved": p}
        for (wl, m, w), p in PAPER_SAVED.items()
    ]
    fig = draw_sharing(rows)
    assert [ax.get_title() for ax in fig.axes] == ["parallel sampling", "beam search"]
    assert len(fig.axes[1].patches) == 6 + 4  # beam: Alpaca ours + paper at 3 widths, ShareGPT ours + paper at 2
    path = save_bench_figure(get_bench("sharing"), rows, tmp_path)
    assert path == tmp_path / "03_sharing.png" and path.stat().st_size > 10_000
