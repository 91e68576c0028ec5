"""The `pagedlab` command line."""

import re

import pytest

from pagedlab.config import STAGE_NAMES
from pagedlab.stages import default_stage
from pagedlab.tools.cli import main

TOP = f"{default_stage()} ({STAGE_NAMES[default_stage()]})"  # the default stage


def run_cli(capsys, *argv: str) -> str:
    """Run `pagedlab argv...`; it must exit 0. Returns what it printed."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    assert exit_info.value.code == 0, capsys.readouterr()
    return capsys.readouterr().out


def test_generate_prints_the_prompt_and_its_continuation(capsys):
    out = run_cli(capsys, "generate", "ROMEO:", "--max-tokens", "8")
    assert "--- 'ROMEO:' (8 tokens, length)" in out
    assert "\nROMEO:\nWhat sh\n" in out  # greedy, the same as the oracle
    assert f"=== stage {TOP}: 8 tokens" in out


def test_generate_n_prints_every_completion(capsys):
    out = run_cli(capsys, "generate", "ROMEO:", "-n", "2", "--temperature", "0.8", "--seed", "3", "--max-tokens", "8")
    assert "--- 'ROMEO:' [1/2] (8 tokens, length)" in out
    assert "--- 'ROMEO:' [2/2] (8 tokens, length)" in out
    assert f"=== stage {TOP}: 16 tokens" in out


def cli_error(capsys, *argv: str) -> str:
    """Run `pagedlab argv...`, a user's mistake: exit status 2 and one line on stderr, no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    return captured.err


def test_bad_model_folder_is_a_clear_error(tmp_path, capsys):
    err = cli_error(capsys, "generate", "--model", str(tmp_path / "missing"))
    assert "neither 'tiny-shakespeare' nor a folder" in err


def test_demo_without_live_view_logs_each_step_then_the_summary(capsys):
    out = run_cli(capsys, "demo", "--no-live", "--no-figures", "--num-requests", "3", "--max-tokens", "8")
    # Static batching, max_num_seqs=4: the three requests run as one batch, a prefill step then 7 decodes.
    assert re.search(r"^step +1  ran 0\+7 1\+8 2\+12  waiting -", out, re.MULTILINE)
    assert re.search(r"^step +8 .* finished 0 1 2$", out, re.MULTILINE)
    assert re.search(r"requests +3\b", out)
    assert re.search(r"engine steps +8\b", out)
    assert re.search(r"generated tokens +24\b", out)
    assert "--- 2: 'GLOUCESTER:' (length)" in out


def test_demo_live_view_draws_queues_and_kv(capsys):
    args = ["demo", "--no-figures", "--num-requests", "5", "--max-tokens", "2", "--delay", "0", "--max-num-seqs", "2"]
    out = run_cli(capsys, *args)
    # Not a terminal: rich draws only the last frame. Batches {0 1} {2 3} {4}, two steps each: 6 steps,
    # and request 4 has just finished and freed its region.
    assert f"step 6 · stage {TOP} · 5/5 finished" in out
    assert re.search(r"^ +4 +MENENIUS: +finished \(length\), KV freed", out, re.MULTILINE)
    assert re.search(r"^KV pool .* 0/128 blocks \(0%\)$", out, re.MULTILINE)
    assert re.search(r"requests +5\b", out)


def test_block_ranges_abbreviates_runs():
    from pagedlab.tools.demo import block_ranges

    assert block_ranges(list(range(64))) == "0-63"
    assert block_ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"
    assert block_ranges([]) == "-"
    assert block_ranges(list(range(0, 40, 2)), max_chars=10) == "0,2,4,6,8…"


def test_describe_prints_the_wiring_of_a_stage(capsys):
    out = run_cli(capsys, "describe", "--stage", "1")
    for name in ("ContiguousKVCacheManager", "StaticScheduler", "ContiguousAttention"):
        assert name in out
    assert run_cli(capsys, "describe", "--stage", "contiguous") == out


def test_describe_an_unknown_stage_names_it(capsys):
    assert cli_error(capsys, "describe", "--stage", "9").startswith("pagedlab describe: stage: unknown stage 9")


@pytest.mark.parametrize(
    "argv, start",
    [
        (["generate", "ROMEO:", "--max-tokens", "0"], "pagedlab generate: SamplingParams.max_tokens"),
        (["generate", "ROMEO:", "--temperature", "nan"], "pagedlab generate: SamplingParams.temperature"),
        (["generate", "ROMEO:", "--stage", "9"], "pagedlab generate: stage: unknown stage 9"),
        (["generate", "", "--max-tokens", "4"], "pagedlab generate: prompt: empty prompt"),
        (["demo", "--no-live", "--num-kv-blocks", "10000000"], "pagedlab demo: num_kv_blocks:"),
        (["demo", "--no-live", "--block-size", "0"], "pagedlab demo: block_size:"),
        (["bench", "speed"], "pagedlab bench: unknown bench 'speed'"),
        (["assignment", "grade", "/no/such/workspace"], "pagedlab assignment:"),
    ],
    ids=["max-tokens", "temperature", "stage", "empty-prompt", "pool", "block-size", "bench", "grade"],
)
def test_a_users_mistake_is_one_line_and_exit_status_2(capsys, argv, start):
    assert cli_error(capsys, *argv).startswith(start)
