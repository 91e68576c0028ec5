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
from pagedlab.bench.real import CONTINUOUS, HF, HF_BATCH, ROOFLINE, SYSTEMS, chat_prompt, make_stream
from pagedlab.bench.real_report import draw_real, target_lines
from pagedlab.bench.runs import own_output
from pagedlab.model.loader import bundled_model_path
from pagedlab.model.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.stage5

CHATML = (  # SmolLM2's template, shortened: a system turn, the conversation, the assistant's header
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Four requests, two seats, outputs of 2-6 tokens (EOS may end one sooner), two rounds.
SMALL = {"num_requests": 4, "max_num_seqs": 2, "output_lens": (2, 6), "repeats": 2, "roofline_steps": 2}
REQUIRED_FIELDS = ("system", "tokens_per_s", "ttft_s", "num_requests", "threads")
GENERATING = (CONTINUOUS, "pagedlab-static", HF, HF_BATCH)


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


def test_json_stdout_is_one_object_with_every_field_of_every_system(small_run):
    result, stdout, _, _ = small_run
    assert json.loads(stdout) == result and stdout.count("\n") == 1
    rows = result["rows"]
    assert [r["system"] for r in rows] == list(SYSTEMS)
    assert len({frozenset(r) for r in rows}) == 1, "every row has the same fields"
    for row in rows:
        assert all(field in row for field in REQUIRED_FIELDS), row
        assert row["threads"] == 1 and row["batch"] == 2 and row["runs"] == 2
        if row["error"] is None:
            assert row["tokens_per_s_worst"] <= row["tokens_per_s_median"] <= row["tokens_per_s"]


def test_every_system_makes_hf_generates_tokens_and_reports_its_run(small_run):
    by = {r["system"]: r for r in small_run[0]["rows"]}
    for name in GENERATING:
        row = by[name]
        if name == HF_BATCH and row["error"] is not None:  # transformers' continuous batching may fail on a CPU
            assert row["tokens_per_s"] is None
            continue
        assert row["same_tokens_as_hf"] is True and row["requests_differing_from_hf"] == 0, name
        assert row["num_requests"] == 4 and 4 <= row["num_generated_tokens"] <= 4 * 6
        assert 0 < row["ttft_s"] <= row["latency_s"] <= row["wall_s"] and row["cpu_s"] > 0
    assert by[HF]["ratio_vs_hf_generate"] == 1.0 and by[CONTINUOUS]["continuous_vs_this"] == 1.0
    for name in (CONTINUOUS, "pagedlab-static", HF):  # the systems that time their prefills
        assert (
            by[name]["steps"] > 0 and 0 < by[name]["seat_use"] <= 1 and 0 < by[name]["prefill_s"] < by[name]["wall_s"]
        )
    if by[HF_BATCH]["error"] is None:  # its steps are its forward passes, counted by a hook
        assert by[HF_BATCH]["steps"] > 0 and 0 < by[HF_BATCH]["seat_use"] <= 1
    assert 0 < by[CONTINUOUS]["forward_share"] < 1 and by[HF]["forward_share"] is None


def test_the_roofline_is_matmuls_at_the_batch_size_and_serves_no_requests(small_run):
    roof = small_run[0]["rows"][-1]
    assert roof["system"] == ROOFLINE and roof["tokens_per_s"] > 0
    assert roof["tokens_per_s"] == pytest.approx(2 / (roof["step_ms"] / 1000))  # batch ÷ the fastest step
    assert roof["num_requests"] is None and roof["ttft_s"] is None and roof["same_tokens_as_hf"] is None


def test_the_bench_runs_its_systems_in_turns_and_says_first_how_long_it_takes(small_run):
    err = small_run[2]
    lines = [line for line in err.splitlines() if line.startswith("real: round")]
    assert [line.split(", ", 1)[1].rstrip(" …") for line in lines] == list(SYSTEMS) * 2  # round 1, then round 2
    assert [line.split(",")[0] for line in lines] == ["real: round 1 of 2"] * 5 + ["real: round 2 of 2"] * 5
    head = " ".join(err.split("real: round")[0].split())  # before the first run (rich may wrap it)
    assert head.startswith("real: 5 systems x 2 rounds") and "on a quiet 2-core CPU" in head


def test_the_figure_and_its_rows_are_written_together(small_run):
    result, _, _, figures = small_run
    assert (figures / "07_real.png").stat().st_size > 0
    back = read_rows(figures / "07_real.json")
    assert back["bench"] == "real" and back["rows"] == result["rows"]
    fig = draw_real(result["rows"])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list(GENERATING)


def test_the_stream_is_seeded_chat_prompts_of_varied_lengths(tiny_chat_model):
    tokenizer = Tokenizer.from_folder(tiny_chat_model)
    stream = make_stream(tokenizer, 12, (16, 64), seed=3)
    assert stream == make_stream(tokenizer, 12, (16, 64), seed=3) != make_stream(tokenizer, 12, (16, 64), seed=4)
    header = chat_prompt(tokenizer, "")[:10]  # the system turn every prompt starts with
    assert all(r.prompt_token_ids[:10] == tuple(header) and 16 <= r.max_tokens <= 64 for r in stream)
    assert len({len(r.prompt_token_ids) for r in stream}) > 6 and len({r.max_tokens for r in stream}) > 6
    text = tokenizer.decode(list(stream[0].prompt_token_ids))
    assert text.startswith("imstartsystem\nBe brief.") and text.endswith("assistant\n")  # no '<|>' in this vocab


def test_a_padded_row_is_cut_at_its_own_end():
    eos = [2]
    assert own_output([5, 6, 7, 8], 3, eos) == [5, 6, 7]  # its max_tokens
    assert own_output([5, 2, 2, 2], 3, eos) == [5, 2]  # its EOS, kept as the engine keeps it
    assert own_output([5, 6, 2, 9], 2, eos) == [5, 6]  # max_tokens came first


def made_up_rows(cont: float, hf: float, hf_batch: float | None, roof: float) -> list[dict]:
    """Rows with only what target_lines reads: tokens/s (100 output tokens in `100 / tok/s` seconds), busy seats,
    steps, and the step figures the bounds quote."""
    base = {"batch": 8, "error": None, "same_tokens_as_hf": True, "num_generated_tokens": 100, "prompt_tokens": 250}
    base |= {"forward_share": 0.9, "prefill_s": 0.3, "decode_step_ms": 60.0, "cpu_s": 1.0}

    def row(system: str, tps: float, seat_use: float) -> dict:
        steps = 100 / (seat_use * 8)  # tokens = busy seats x batch x steps
        wall = 100 / tps
        speed = {"tokens_per_s": tps, "tokens_per_s_median": tps, "wall_s": wall, "step_ms": 1000 * wall / steps}
        return base | speed | {"system": system, "seat_use": seat_use}

    rows = [row(CONTINUOUS, cont, 0.8), row(HF, hf, 0.5), row(HF_BATCH, hf_batch or 1.0, 0.8)]
    rows.append(base | {"system": ROOFLINE, "tokens_per_s": roof, "step_ms": 8000 / roof, "same_tokens_as_hf": None})
    if hf_batch is None:
        rows[2] |= {"error": "RuntimeError: no CPU kernel", "tokens_per_s": None, "same_tokens_as_hf": None}
    return rows


def test_a_target_not_reached_is_said_plainly_with_what_bounds_it():
    lines = target_lines(made_up_rows(cont=100, hf=80, hf_batch=50, roof=400))
    assert "1.25x tokens/s" in lines[0] and "is below the 2x target on this run" in lines[0]
    # 1.25x = 1.60x more busy seats (80% vs 50%) x 0.78x the step cost: the split is exact
    assert "1.60x from seats" in lines[0] and "0.78x from step cost" in lines[0]
    assert "is below the 3x target on this run" in lines[1] and "1.00x from seats" in lines[1]
    assert "out of any system's reach" not in lines[1]  # 3 x 50 tok/s is below the roofline's 400
    assert "reaches 25% of the matmul roofline" in lines[2] and "is below the 50% target on this run" in lines[2]
    assert "33% of the roofline while it decodes" in lines[2] and "250 prompt tokens (2.5x its output" in lines[2]
    assert "made hf-generate's tokens for every request" in lines[3]
    assert not any("fail" in line or "not met" in line for line in lines)


def test_a_target_reached_is_said_as_plainly_and_a_failed_system_has_no_ratio():
    lines = target_lines(made_up_rows(cont=100, hf=40, hf_batch=None, roof=150))
    assert "2.50x tokens/s" in lines[0] and "which meets the 2x target on this run" in lines[0]
    assert "no ratio" in lines[1] and "RuntimeError: no CPU kernel" in lines[1]
    assert "reaches 67% of the matmul roofline" in lines[2] and "which meets the 50% target" in lines[2]
    lines = target_lines(made_up_rows(cont=70, hf=60, hf_batch=60, roof=150))  # 3 x 60 = 180 > 150
    assert "3x hf-generate-batch would be 180 tok/s, above the matmul roofline (150)" in lines[1]
