"""The options every bench shares (`--threads`) and those only some take (`--kv-budget`, `--dtype`), through the real
command line: a bench prints how many torch threads it measures on, and an option a bench does not take is a
one-line mistake (exit 2), never ignored."""

import json

import pytest
import torch

from pagedlab.tools.cli import main

pytestmark = pytest.mark.stage5


def run(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", *argv])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_a_bench_measures_on_the_threads_it_is_given_and_says_so(capsys):
    before = torch.get_num_threads()
    code, out, err = run(capsys, "scheduler", "--json", "--threads", "2")
    assert code == 0 and json.loads(out)["bench"] == "scheduler"
    assert "scheduler: torch on 2 threads (--threads N)" in " ".join(err.split())
    assert torch.get_num_threads() == before  # given back afterwards
    code, _, err = run(capsys, "scheduler", "--json")
    assert code == 0 and "scheduler: torch on 1 thread (--threads N)" in " ".join(err.split())


@pytest.mark.parametrize(
    "argv, words",
    [
        (["scheduler", "--kv-budget", "64MiB"], "pagedlab bench: --kv-budget: only real takes it, not scheduler"),
        (["memory", "--dtype", "bfloat16"], "pagedlab bench: --dtype: only kernel and real take it, not memory"),
        (["real", "--kv-budget", "lots"], "pagedlab bench: --kv-budget: 'lots' is not a size"),
        (["real", "--dtype", "float64"], "pagedlab bench: --dtype: 'float64': each of a comma list must be one of"),
        (["scheduler", "--threads", "0"], "pagedlab bench: --threads must be a positive integer, got 0"),
    ],
)
def test_an_option_a_bench_cannot_take_is_one_line_and_exit_2(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith(words) and err.count("\n") == 1
