"""The `pagedlab` command line."""

import argparse

import pytest

from pagedlab.stages import STAGE_NAMES, default_stage
from pagedlab.tools.cli import build_parser, main

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
    assert "neither 'tiny-shakespeare', 'smollm2-135m-instruct' nor a folder" in err


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
        (["demo", "--no-live", "--num-requests", "0"], "pagedlab demo: num_requests:"),
        (["demo", "--no-live", "--stage", "1", "--preemption-mode", "swap"], "pagedlab demo: preemption_mode:"),
        (["bench", "speed"], "pagedlab bench: unknown bench 'speed'"),
        (["assignment", "grade", "/no/such/workspace", "--stage", "2"], "pagedlab assignment: workspace:"),
    ],
    ids=[
        "max-tokens",
        "temperature",
        "stage",
        "empty-prompt",
        "pool",
        "block-size",
        "requests",
        "stage-1-swap",
        "bench",
        "grade",
    ],
)
def test_a_users_mistake_is_one_line_and_exit_status_2(capsys, argv, start):
    assert cli_error(capsys, *argv).startswith(start)


def test_describe_stage_6_says_which_attention_runs_here(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    here = [line for line in run_cli(capsys, "describe", "--stage", "6").splitlines() if line.startswith("  here ")]
    assert here == ["  here       : TritonAttention, in Triton's interpreter (TRITON_INTERPRET=1), slowly"]
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    here = [line for line in run_cli(capsys, "describe", "--stage", "6").splitlines() if line.startswith("  here ")]
    assert here[0].startswith("  here       : TiledPagedAttention (the torch fallback): ")
    assert "  here " not in run_cli(capsys, "describe", "--stage", "5")


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command the parser knows, nested ones too (`assignment make`), as argv prefixes; () is `pagedlab`."""
    paths = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += command_paths(sub, (*path, name))
    return paths


def test_every_commands_help_prints_and_exits_0(capsys):
    # A help text argparse cannot format (a bare "%") is a traceback for `--help` alone: ask every command.
    paths = command_paths(build_parser())
    assert {("demo",), ("trace",), ("assignment", "make"), ("assignment", "grade"), ("bench",)} <= set(paths)
    for path in paths:
        out = run_cli(capsys, *path, "--help")
        assert out.startswith(f"usage: {' '.join(('pagedlab', *path))} "), (path, out[:200])


def test_a_percent_in_a_settings_help_is_shown_as_one(capsys):
    out = " ".join(run_cli(capsys, "demo", "--help").split())  # argparse wraps the help text
    assert "(request i gets priority i % 3)" in out
