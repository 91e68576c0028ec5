"""`pagedlab bench real`: every system on one chat stream, taking turns, the same tokens as Hugging Face, the JSON
rows with every field, honest words about the targets, the figure. On a tiny random Llama written here, not on
SmolLM2 (no test downloads, and no test asserts a speed)."""

import contextlib
import io
import json
import os
import shutil

import pytest
import torch

from pagedlab import bench
from pagedlab.bench.common import read_rows
from pagedlab.bench.real import (
    CONTINUOUS,
    DEFAULT_BUDGET,
    HF,
    HF_BATCH,
    PROFILE,
    STATIC,
    SYSTEMS,
    chat_prompt,
    make_stream,
    percentile,
)
from pagedlab.bench.real_report import draw_real, target_lines
from pagedlab.bench.real_systems import hf_batch_pages, hf_static_batch
from pagedlab.bench.runs import own_output
from pagedlab.model.loader import bundled_model_path
from pagedlab.model.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.stage5
KIB = 1024

CHATML = (  # SmolLM2's template, shortened: a system turn, the conversation, the assistant's header
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Four requests with 2-6 answer tokens, two budgets (the default one runs two rounds), a step profile at batch 2.
SMALL = {"num_requests": 4, "kv_budgets": (KIB * 256, DEFAULT_BUDGET), "output_cap": 6, "length_scale": 0.05,
         "repeats": 2, "profile_batches": (2,), "profile_steps": 2}  # fmt: skip
REQUIRED_FIELDS = ("system", "kv_budget_bytes", "tokens_per_s", "mean_running", "max_running", "ttft_p50_s",
                   "ttft_p99_s", "ttft_s", "num_requests", "threads")  # fmt: skip


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory):
    """A random 2-layer Llama over the bundled character tokenizer (68 ids), with a ChatML chat template."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = tmp_path_factory.mktemp("tiny-chat")
    config = transformers.LlamaConfig(
        vocab_size=68,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.25,  # logits spread out: greedy choices are not decided by float noise
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).float().eval().save_pretrained(folder)
    shutil.copy(bundled_model_path() / "tokenizer.json", folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return folder


@pytest.fixture(scope="module")
def small_run(tiny_chat_model, tmp_path_factory):
    """The bench through its registry on the tiny model, one torch thread: (result, stdout, stderr, figures dir)."""
    figures = tmp_path_factory.mktemp("figures")
    stdout, stderr, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            result = bench.run_bench("real", as_json=True, figures_dir=figures, model=str(tiny_chat_model), **SMALL)
    finally:
        torch.set_num_threads(threads)
    return result, stdout.getvalue(), stderr.getvalue(), figures


def by_system(result, budget):
    return {r["system"]: r for r in result["rows"] if r["kv_budget_bytes"] == budget}


def test_json_stdout_is_one_object_with_every_field_of_every_row(small_run):
    result, stdout, _, _ = small_run
    assert json.loads(stdout) == result and stdout.count("\n") == 1
    rows = result["rows"]
    expected = [(b, s) for b in SMALL["kv_budgets"] for s in SYSTEMS] + [(None, PROFILE)]
    assert [(r["kv_budget_bytes"], r["system"]) for r in rows] == expected
    assert len({frozenset(r) for r in rows}) == 1, "every row has the same fields"
    for row in rows:
        assert all(field in row for field in REQUIRED_FIELDS), row
        assert row["dtype"] == "float32"
        if row["system"] != PROFILE and row["error"] is None:
            assert row["tokens_per_step"] == pytest.approx(row["num_generated_tokens"] / row["steps"])
    for row in rows[:-1]:
        assert row["runs"] == (2 if row["kv_budget_bytes"] == DEFAULT_BUDGET else 1)  # the sweep's points run once
        if row["error"] is None:
            assert row["threads"] == 1 and row["tokens_per_s_worst"] <= row["tokens_per_s"]


def test_every_system_gets_the_same_bytes_and_runs_the_batch_they_hold(small_run, tiny_chat_model):
    result = small_run[0]
    small, per_token = SMALL["kv_budgets"][0], 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads of 16, float32
    stream = make_stream(Tokenizer.from_folder(tiny_chat_model), 4, 0, SMALL["length_scale"], SMALL["output_cap"])
    tight, roomy = by_system(result, small), by_system(result, DEFAULT_BUDGET)
    assert tight[CONTINUOUS]["num_kv_blocks"] == tight[STATIC]["num_kv_blocks"] == small // (16 * per_token)
    assert tight[HF]["batch"] == hf_static_batch(stream, small, per_token, 64) == 1  # one padded worst case fits
    assert roomy[HF]["batch"] == 64 and roomy[HF]["max_running"] == 4  # 64 seats fit; the stream has 4 requests
    for name in SYSTEMS:
        for row in (tight[name], roomy[name]):
            if name == HF_BATCH and row["error"] is not None:  # transformers' continuous batching may fail on a CPU
                continue
            assert row["same_tokens_as_hf"] is True and row["num_requests"] == 4, (name, row)
            assert 1 <= row["mean_running"] <= row["max_running"] <= 4
            assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"] <= row["wall_s"]
    assert tight[HF]["max_running"] == 1 and roomy[HF]["mean_running"] == 4  # its rows run to the batch's end
    assert tight[CONTINUOUS]["max_running"] > 1  # paged: the same bytes hold more than one request at a time
    assert hf_batch_pages(small, per_token) == small // (16 * per_token)


def test_the_step_profile_times_a_decode_beside_its_matmuls_and_attention(small_run):
    row = small_run[0]["rows"][-1]
    assert row["system"] == PROFILE and row["batch"] == 2 and row["tokens_per_s"] is None
    assert row["decode_step_ms"] > 0 and row["matmul_step_ms"] > 0 and row["attention_step_ms"] > 0
    assert row["step_vs_matmul"] == pytest.approx(row["decode_step_ms"] / row["matmul_step_ms"])
    assert row["kv_read_mb"] == pytest.approx(2 * row["context_mean"] * 512 / 1e6)


def test_the_bench_takes_turns_and_says_first_how_long_it_takes(small_run):
    err = small_run[2]
    lines = [" ".join(line.split()) for line in err.splitlines() if line.startswith("real: float32")]
    runs = [line for line in lines if "round" in line]
    assert len(runs) == len(SYSTEMS) * 3  # the small budget once, the default twice
    assert [line.rsplit(", ", 1)[1].rstrip(" …") for line in runs[4:]] == list(SYSTEMS) * 2  # in turns
    head = " ".join(err.split("real: float32")[0].split())  # before the first run (rich may wrap it)
    assert head.startswith("real: 4 systems at KV budgets") and "on a quiet 2-core CPU" in head
    assert "torch on 1 thread" in head


def test_the_figure_and_its_rows_are_written_together(small_run):
    result, _, _, figures = small_run
    assert (figures / "07_real.png").stat().st_size > 0
    back = read_rows(figures / "07_real.json")
    assert back["bench"] == "real" and back["rows"] == result["rows"]
    fig = draw_real(result["rows"])
    sweep, profile = fig.axes
    assert {line.get_label() for line in sweep.get_lines()} >= set(SYSTEMS)
    assert [t.get_text() for t in profile.get_xticklabels()] == ["batch 2\nfloat32"]


def test_the_stream_is_seeded_chat_prompts_with_sharegpt_like_answers(tiny_chat_model):
    tokenizer = Tokenizer.from_folder(tiny_chat_model)
    stream = make_stream(tokenizer, 12, seed=3)
    assert stream == make_stream(tokenizer, 12, seed=3) != make_stream(tokenizer, 12, seed=4)
    header = chat_prompt(tokenizer, "")[:10]  # the system turn every prompt starts with
    assert all(r.prompt_token_ids[:10] == tuple(header) and 1 <= r.max_tokens <= 160 for r in stream)
    lengths = [r.max_tokens for r in stream]
    assert len(set(lengths)) > 6 and max(lengths) > 3 * min(lengths)  # a long tail, as ShareGPT's
    text = tokenizer.decode(list(stream[0].prompt_token_ids))
    assert text.startswith("imstartsystem\nBe brief.") and text.endswith("assistant\n")  # no '<|>' in this vocab


def test_a_padded_row_is_cut_at_its_own_end():
    eos = [2]
    assert own_output([5, 6, 7, 8], 3, eos) == [5, 6, 7]  # its max_tokens
    assert own_output([5, 2, 2, 2], 3, eos) == [5, 2]  # its EOS, kept as the engine keeps it
    assert own_output([5, 6, 2, 9], 2, eos) == [5, 6]  # max_tokens came first


def test_percentiles_interpolate_between_ranks():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5 and percentile([1.0], 99) == 1.0
    assert percentile(list(range(101)), 99) == 99


def made_up_rows(cont: float, hf: float, hf_batch: float | None) -> list[dict]:
    """Rows with only what target_lines reads, at the default budget, and one step-profile row."""
    base = {"kv_budget_bytes": DEFAULT_BUDGET, "dtype": "float32", "error": None, "same_tokens_as_hf": True}
    running = [(8.0, 10, 8.0), (3.0, 3, 1.5), (7.5, 9, 7.5)]  # mean, max, own tokens per step
    rows = [
        base | {"system": name, "tokens_per_s": tps, "mean_running": mean, "max_running": top, "tokens_per_step": own}
        for name, tps, (mean, top, own) in zip((CONTINUOUS, HF, HF_BATCH), (cont, hf, hf_batch or 1.0), running)
    ]
    if hf_batch is None:
        rows[2] |= {"error": "RuntimeError: no CPU kernel", "tokens_per_s": None, "same_tokens_as_hf": None}
    profile = {"system": PROFILE, "batch": 8, "dtype": "float32", "decode_step_ms": 120.0, "matmul_step_ms": 80.0}
    profile |= {"attention_step_ms": 20.0, "step_vs_matmul": 1.5, "kv_read_mb": 66.0, "weights_mb": 538.0}
    return [*rows, profile | {"context_mean": 180.0, "kv_budget_bytes": None, "same_tokens_as_hf": None}]


def test_a_target_not_reached_is_said_plainly_with_what_bounds_it():
    lines = target_lines(made_up_rows(cont=100, hf=80, hf_batch=90))
    assert "1.25x tokens/s, which is below the 2x target on this run" in lines[0]
    assert "gave pagedlab-continuous 8.0 of a request's own tokens a step against 1.5 for hf-generate" in lines[0]
    assert "(5.33x; it ran 8.0 (max 10) requests a step, hf-generate 3.0 (max 3))" in lines[0]
    assert "its steps were 0.23x as fast" in lines[0]
    assert "1.11x tokens/s, which is below the 1.3x target" in lines[1]
    assert "made hf-generate's tokens for every request" in lines[2]
    assert "1.50x its matmuls alone (80 ms), which is above the 1.2x target" in lines[3]
    assert "reads 66 MB of K and V" in lines[3] and "already 1.25x" in lines[3] and "remaining 20 ms" in lines[3]


def test_a_target_reached_is_said_as_plainly_and_a_failed_system_has_no_ratio():
    lines = target_lines(made_up_rows(cont=100, hf=40, hf_batch=None))
    assert "2.50x tokens/s, which meets the 2x target on this run" in lines[0]
    assert "no ratio" in lines[1] and "RuntimeError: no CPU kernel" in lines[1]
