"""`pagedlab demo`: the teaching scenario shows what it promises, at every stage, live, by hand, and as JSON."""

import io
import json
import os
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

from pagedlab.lessons.demo import DemoOptions
from pagedlab.tools.cli import main
from pagedlab.tools.demo import run_demo, summarize
from pagedlab.tools.demo_keys import BACK, NEXT, QUIT, key_reader


def run(console_width=80, keys=None, **options):
    """The demo with `options` into an 80-column console; returns (llm, what it printed)."""
    console = Console(file=io.StringIO(), width=console_width, color_system=None)
    llm = run_demo(DemoOptions(delay=0, **options), console=console, keys=keys)
    return llm, console.file.getvalue()


def events_by_step(llm):
    from pagedlab.engine.events import step_events

    trace = list(llm.engine.trace)
    return {t.step: {e.kind for e in step_events(trace, i, llm.engine.config)} for i, t in enumerate(trace)}


def first_step_with(steps: dict, kind: str) -> int:
    return min(step for step, kinds in steps.items() if kind in kinds)


def test_the_default_scenario_shows_continuous_batching_within_40_steps():
    llm, _ = run(mode="log")
    summary = summarize(llm, 10)
    assert summary["finished"] == 10 and summary["stage_name"] == "continuous"
    assert summary["num_preemptions"] >= 1
    assert summary["prefix_cache_hits"] >= 1
    assert summary["seat_refills"] >= 1
    assert summary["mixed_steps"] >= 1  # a prefill chunk beside decodes
    steps = events_by_step(llm)
    for kind in ("mixed", "hit", "preempt", "refill"):
        assert first_step_with(steps, kind) <= 40, kind
    # The preempted request comes back: its dropped blocks are found again in the prefix cache.
    preempted = first_step_with(steps, "preempt")
    assert any("hit" in kinds and "admit" in kinds for step, kinds in steps.items() if step > preempted)


def test_with_swap_the_preempted_request_comes_back_from_the_cpu_pool():
    llm, out = run(mode="log", preemption_mode="swap")
    summary = summarize(llm, 10)
    assert summary["num_preemptions"] >= 1 and summary["swap_ins"] >= 1
    assert re.search(r"^    \d+ swapped back in: ", out, re.MULTILINE)


@pytest.mark.parametrize("stage", ["contiguous", "paged", "prefix"])
def test_an_earlier_stage_runs_the_same_requests_without_refills_in_more_steps(stage):
    continuous = summarize(run(mode="log")[0], 10)
    llm, _ = run(mode="log", stage=stage)
    summary = summarize(llm, 10)
    assert summary["finished"] == 10
    assert summary["num_generated_tokens"] == continuous["num_generated_tokens"]  # the same requests
    assert summary["num_steps"] > continuous["num_steps"]
    assert summary["seat_refills"] == 0 and summary["mixed_steps"] == 0 and summary["num_preemptions"] == 0
    assert summary["max_running"] < continuous["max_running"]


def test_with_a_sliding_window_the_pool_is_counted_without_its_null_block():
    # Block 0 is the window's null block, never free and never held: 23 of the 24 blocks can be used.
    from pagedlab.lessons.window import windowed_bundled_model

    llm, out = run(mode="log", model=str(windowed_bundled_model(16)))
    assert re.search(r"^step   1  ran 0\+7 1\+8 2\+16 3\+12 4\+16 5\+16  waiting 6 7 8 9  KV 10/23 blocks$", out, re.M)
    assert not re.search(r"KV \d+/24 blocks", out)
    assert (llm.engine.kv_manager.num_used_blocks, llm.engine.kv_manager.usage) == (0, 0.0)  # idle is empty
    assert llm.engine.stats.kv_usage == 0.0  # what /metrics serves as vllm:kv_cache_usage_perc


def test_the_log_tells_each_step_and_what_changed():
    _, out = run(mode="log")
    assert re.search(r"^step   1  ran 0\+7 1\+8 2\+16 3\+12 4\+16 5\+16  waiting 6 7 8 9  KV 10/24 blocks$", out, re.M)
    assert "    admitted 0, 1, 2, 3, 4, 5" in out
    assert re.search(r"^    5 prefix-cache hit: 2-3 \(16 tokens not recomputed\)$", out, re.M)
    assert re.search(r"^    preempted \d+$", out, re.M)
    assert re.search(r"^    admitted \d+ \(refill: \d+ finished in step \d+\)", out, re.M)
    assert re.search(r"requests finished +10/10", out)


def scripted(keys: str):
    """A key reader that replays `keys` (n = next, b = back, q = quit), then quits."""
    actions = iter({"n": NEXT, "b": BACK, "q": QUIT}[k] for k in keys)
    return lambda: next(actions, QUIT)


def frames(out: str) -> list[str]:
    return re.findall(r"^step (\d+) · stage", out, re.MULTILINE)


def test_step_mode_goes_forward_and_back_and_fits_80_columns():
    llm, out = run(mode="step", keys=scripted("nnbbnnq"))
    # shown: 1, n->2, n->3, b->2, b->1, n->2 (recorded), n->3 (recorded), q
    assert frames(out) == ["1", "2", "3", "2", "1", "2", "3"]
    assert llm.engine.stats.num_steps == 3  # going back never re-runs a step
    assert "stopped at step 3" in out
    assert "[Enter/space] next · [b] back · [q] quit · step 1 of 3 run" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_step_mode_to_the_end_shows_every_step_once():
    llm, out = run(mode="step", keys=scripted("n" * 200))
    assert frames(out) == [str(i) for i in range(1, llm.engine.stats.num_steps + 1)]
    assert re.search(r"requests finished +10/10", out)


def test_a_frame_shows_queues_marks_and_the_pool():
    _, out = run(mode="step", keys=scripted("nnnq"))
    step4 = out[out.index("step 4 · stage") :]
    assert re.search(r"^waiting 5\* 6 7 8 9 · running 0 1 2 3 4 · seats 5/6$", step4, re.M)
    assert re.search(r"^KV pool .* 17/24 blocks · fed 20 = 16 prefill \+ 4 decode$", step4, re.M)
    assert re.search(r"^ +2 +First Citi… +prefill \+16 ", step4, re.M)
    assert "why: no free block for the running requests' next tokens" in step4


def test_keys_from_a_pipe_are_one_per_line_and_the_end_is_quit():
    with key_reader(io.StringIO("\n \nb\nx\nq\n")) as read:
        assert [read() for _ in range(4)] == [NEXT, NEXT, BACK, QUIT]  # x is not a key: skipped
    with key_reader(io.StringIO("")) as read:
        assert read() == QUIT


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal")
def test_keys_on_a_terminal_are_single_keys_arrows_too():
    import pty

    master, slave = pty.openpty()
    with os.fdopen(slave, "r") as tty_in, key_reader(tty_in) as read:
        os.write(master, b" ")
        assert read() == NEXT
        os.write(master, b"\x1b[D")  # left arrow
        assert read() == BACK
        os.write(master, b"xq")  # x is not a key: skipped
        assert read() == QUIT
    os.close(master)


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal")
def test_step_mode_in_a_real_terminal(tmp_path):
    """`pagedlab demo --step` under a pseudo-terminal, as over ssh or in tmux: keys without Enter."""
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "LINES": "40", "TERM": "xterm"}
    code = "from pagedlab.tools.cli import main; main(['demo', '--step'])"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 120
    sent = 0
    try:
        while b"requests finished" not in seen and time.monotonic() < deadline:
            if seen.count(b"[q] quit") > sent:  # a frame is on screen and waits: press the next key
                os.write(master, b"  bq"[sent : sent + 1])
                sent += 1
            seen += _read_some(master)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        os.close(master)
    text = seen.decode(errors="replace")
    assert "stopped at step 3" in text
    assert "Traceback" not in text


def _read_some(fd: int) -> bytes:
    import select

    ready, _, _ = select.select([fd], [], [], 0.5)
    try:
        return os.read(fd, 65536) if ready else b""
    except OSError:  # the child closed the terminal
        return b""


def test_json_is_one_object_on_stdout_and_the_tables_on_stderr(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--json"])
    assert exit_info.value.code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert set(summary) >= {
        "stage",
        "num_steps",
        "num_preemptions",
        "prefix_cache_hits",
        "max_running",
        "seat_refills",
        "finished",
    }
    assert summary["stage"] == 5 and summary["finished"] == 10 and summary["num_preemptions"] >= 1
    assert "requests finished" in captured.err


def test_figures_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run(mode="log")
    assert list(tmp_path.iterdir()) == []  # no figures/ appears in the folder the demo ran from


def test_the_live_view_draws_the_last_frame_off_a_terminal():
    _, out = run(mode="live")
    # Not a terminal: rich draws only the last frame, after which every request has finished.
    assert re.search(r"^step \d+ · stage 5 \(continuous\) · 10/10 finished$", out, re.M)
    assert "What to watch:" in out  # the legend came first
    assert re.search(r"engine steps +\d+", out)
    assert max(len(line) for line in out.splitlines()) <= 80


def test_block_list_abbreviates_runs():
    from pagedlab.engine.events import block_list

    assert block_list(list(range(64))) == "0-63"
    assert block_list([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"
    assert block_list([]) == "-"
    assert block_list(list(range(0, 40, 2)), max_chars=10) == "0,2,4,6,8…"


def test_priority_and_caching_off_change_the_same_scenario():
    base = summarize(run(mode="log")[0], 10)
    llm, _ = run(mode="log", scheduling_policy="priority")
    first_admitted = set(llm.engine.trace[0].running)  # request i has priority i % 3; lower is served first
    assert summarize(llm, 10)["finished"] == 10
    assert {"0", "3", "6", "9"} <= first_admitted and not first_admitted & {"2", "5", "8"}
    off = summarize(run(mode="log", enable_prefix_caching=False)[0], 10)
    assert off["prefix_cache_hits"] == 0 < base["prefix_cache_hits"] and off["finished"] == 10
