"""lessons/lab.py: the live lab's knobs, its seeded workload, and its promise: every scheduling and block decision
is the real engine's. The same workload through the bundled model gives the same trace, step for step, but for
the clock and the tokens' values; and all of it imports without torch."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pagedlab.lessons import lab_browser
from pagedlab.lessons.lab import KNOBS, LabOptions, LabRun, lab_config, run_lab
from pagedlab.lessons.lab_workload import VOCAB_SIZE, make_workload
from pagedlab.lessons.window import windowed_bundled_model
from pagedlab.model.loader import load_model
from pagedlab.viz.trace import validate

ROOT = Path(__file__).resolve().parents[2]

# --- knobs ------------------------------------------------------------------------------------------------


def test_a_fragment_names_the_knobs_that_differ_and_reads_back():
    options = LabOptions(stage=4, block_size=16, enable_prefix_caching=False, eviction_policy="fifo")
    assert options.fragment() == "stage=4&block_size=16&enable_prefix_caching=false&eviction_policy=fifo"
    assert LabOptions.from_fragment("#" + options.fragment() + "&step=7") == options  # step: the page's cursor
    assert LabOptions.from_fragment("") == LabOptions()
    assert KNOBS[0] == "stage" and "seed" in KNOBS


@pytest.mark.parametrize(
    "fragment, field",
    [
        ("stage=1", "stage"),
        ("stage=6", "stage"),
        ("block_size=x", "block_size"),
        ("enable_prefix_caching=yes", "enable_prefix_caching"),
        ("eviction_policy=min", "eviction_policy"),  # Belady's needs the future: not online
        ("num_requests=0", "num_requests"),
        ("num_requests=501", "num_requests"),
        ("sliding_window=-1", "sliding_window"),
        ("seed=-2", "seed"),
        ("num_kv_blocks=4097", "num_kv_blocks"),
        ("block_size=257", "block_size"),
        ("colour=red", "colour"),
        ("stage", "stage"),
    ],
)
def test_a_bad_knob_is_a_value_error_naming_it(fragment, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        LabOptions.from_fragment(fragment)


def test_a_run_whose_trace_would_not_fit_a_page_stops_naming_what_to_change():
    with pytest.raises(ValueError, match="^num_requests: past step .* pool cells"):
        run_lab(LabOptions(num_requests=500, num_kv_blocks=4096, max_num_seqs=3))


def test_a_knob_the_engine_refuses_is_named_by_the_engine():
    with pytest.raises(ValueError, match="^preemption_mode:"):
        run_lab(LabOptions(preemption_mode="never"))


# --- a hybrid model: one block table per KV cache group ---------------------------------------------------------

HYBRID = "num_kv_blocks=64&sliding_window=16&layer_pattern=WF"  # each group needs its blocks: 48 hold no worst case


def test_the_layer_pattern_reads_back_and_makes_the_lab_model_hybrid():
    options = LabOptions(num_kv_blocks=64, sliding_window=16, layer_pattern="WF")
    assert options.fragment() == HYBRID and LabOptions.from_fragment(HYBRID) == options
    config = lab_config(options)
    assert (config.sliding_window, config.layer_windows) == (0, (16, None))  # W: the window's layer, F: full
    assert lab_config(LabOptions(sliding_window=16)).layer_windows == ()  # "": every layer alike, as before
    assert lab_config(LabOptions(sliding_window=16, layer_pattern="WWWWWF")).layer_windows == (16,) * 5 + (None,)


@pytest.mark.parametrize(
    "fragment, why",
    [
        ("layer_pattern=WX&sliding_window=16", "expected up to 12 letters W"),
        ("layer_pattern=wf&sliding_window=16", "expected up to 12 letters W"),
        ("layer_pattern=W,F&sliding_window=16", "expected up to 12 letters W"),
        ("layer_pattern=" + "WF" * 7 + "&sliding_window=16", "expected up to 12 letters W"),
        ("layer_pattern=WWW&sliding_window=16", "a hybrid model mixes W and F"),
        ("layer_pattern=FF", "a hybrid model mixes W and F"),
        ("layer_pattern=WF", "its W layers see sliding_window tokens"),
    ],
)
def test_a_bad_layer_pattern_is_a_value_error_naming_it(fragment, why):
    with pytest.raises(ValueError, match=f"^layer_pattern: {why}"):
        LabOptions.from_fragment(fragment)


@pytest.mark.parametrize("stage", [2, 3, 4, 5])
def test_a_hybrid_lab_run_keeps_a_table_per_group(stage):
    trace = run_lab(LabOptions.from_fragment(f"{HYBRID}&stage={stage}&num_requests=12"))
    validate(trace)
    config = trace["config"]
    assert (config["layer_windows"], config["sliding_window"]) == ([16, None], 0)
    assert config["kv_cache_groups"] == [{"kind": "sliding-16", "layers": [0]}, {"kind": "full", "layers": [1]}]
    tables = [t for step in trace["steps"] for t in step["tables"].values()]
    assert tables and all(len(t) == 2 and len(t[0]) == len(t[1]) for t in tables)  # one per group, as long
    # The window's group frees what falls behind the window (the null block, 0, stands there); full keeps all.
    assert any(0 in window for window, _ in tables) and not any(0 in full for _, full in tables)
    for step in trace["steps"]:  # one pool: a block serves one group's layers
        window = {b for w, _ in step["tables"].values() for b in w} - {0}
        assert not window & {b for _, f in step["tables"].values() for b in f}
    # a cached block's hash is named with its group's number (the same tokens, a block in each group)
    assert all(re.fullmatch(r"[01]:[0-9a-f]{12}", name) for name in trace["hashes"])
    assert bool(trace["hashes"]) == (stage >= 4)


def test_the_lab_asks_no_question_of_a_hybrid_run():
    # predict.py's questions read one block table per request: a hybrid run is shown, not quizzed.
    asked = json.loads(lab_browser.question(HYBRID, 3))
    assert list(asked) == ["none"] and "layer_pattern" in asked["none"]


# --- the workload -------------------------------------------------------------------------------------------


def test_the_workload_of_a_seed_is_pinned():
    """The page draws it in Pyodide's CPython, the desktop in its own: a change of Python must not move it."""
    workload = make_workload(24, 0)
    text = json.dumps([[r.request_id, r.prompt_token_ids, r.max_tokens, r.arrival_step, r.priority, r.n, r.prefix]
                       for r in workload])  # fmt: skip
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "5dfe2601b8ebef11"
    assert all(0 <= t < VOCAB_SIZE for r in workload for t in r.prompt_token_ids)


def test_the_workload_has_what_the_lab_shows():
    workload = make_workload(200, 3)
    assert [r.arrival_step for r in workload] == sorted(r.arrival_step for r in workload)
    assert {r.prefix for r in workload} == {None, 0, 1, 2}  # shared prefixes, and prompts with none
    assert {r.n for r in workload} == {1, 2, 3} and {r.priority for r in workload} == {0, 1, 2}
    assert workload[0].label.endswith("tokens of its own")


def test_every_lab_link_of_the_chapters_runs():
    """A chapter's link presets the lab's knobs (`lab.html#stage=4&...`): each must be a run, not an error."""
    links = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "chapters").glob("*.md"))]:
        links |= set(re.findall(r"viz/lab\.html#([^)`\s]+)", doc.read_text(encoding="utf-8")))
    assert len(links) >= 4  # chapters 2 to 5 each link their stage
    for fragment in sorted(links):
        assert run_lab(LabOptions.from_fragment(fragment))["steps"], fragment


# --- the promise: real decisions -------------------------------------------------------------------------

RUNS = [
    "stage=2&num_requests=10",
    "stage=3&num_requests=12&seed=1",
    "stage=4&num_requests=12&num_kv_blocks=30",
    "stage=4&num_requests=12&eviction_policy=slru&num_kv_blocks=36&seed=2",
    "stage=5&num_requests=14",
    "stage=5&num_requests=14&preemption_mode=swap&num_kv_blocks=36&seed=1",
    "stage=5&num_requests=14&scheduling_policy=priority&seed=2",
    "stage=5&num_requests=12&sliding_window=16&seed=3",
]


def _untimed(trace: dict) -> dict:
    return {**trace, "steps": [{k: v for k, v in s.items() if k != "time"} for s in trace["steps"]]}


def _model_run(options: LabOptions) -> tuple[dict, dict[str, list[int]]]:
    """The workload through the bundled model (windowed, for a window): its trace, and each request's tokens."""
    folder = windowed_bundled_model(options.sliding_window) if options.sliding_window else None
    run = LabRun(options, model=load_model(folder) if folder else load_model())
    sampled: dict[str, list[int]] = {}
    execute = run.engine.runner.execute

    def recording(so):
        out = execute(so)
        for rid, token in zip(out.req_ids, out.token_ids):
            sampled.setdefault(rid, []).append(token)
        return out

    run.engine.runner.execute = recording
    for _ in run.steps():
        pass
    return run.trace(), sampled


@pytest.mark.parametrize("fragment", RUNS)
def test_the_lab_given_a_real_runs_tokens_is_that_run_step_for_step(fragment):
    """Everything but the clock is equal: the scheduler, the KV manager and the engine are the real ones; only the
    forward pass is replaced."""
    options = LabOptions.from_fragment(fragment)
    real, tokens = _model_run(options)
    replayed = LabRun(options, tokens=tokens)
    for _ in replayed.steps():
        pass
    lab = replayed.trace()
    validate(lab)
    assert any(s["scheduled"] for s in lab["steps"])
    assert _untimed(lab) == _untimed(real)


def test_seeded_tokens_change_no_schedule_where_no_output_block_is_cached():
    """Before stage 4 nothing is hashed, so the tokens' values reach no decision at all: the seeded run is the real
    model's run without its tokens."""
    options = LabOptions(stage=3, num_requests=12, seed=1)
    real, _ = _model_run(options)
    assert _untimed(run_lab(options))["steps"] == _untimed(real)["steps"]


def test_a_run_is_the_same_run_twice_and_its_times_are_its_steps():
    first, second = run_lab(LabOptions(num_requests=30)), run_lab(LabOptions(num_requests=30))
    assert first == second
    assert [s["time"] for s in first["steps"]] == [float(s["step"]) for s in first["steps"]]
    assert any(s["preempted"] for s in first["steps"]) and any(s["copies"] for s in first["steps"])


# --- no torch -------------------------------------------------------------------------------------------------

NO_TORCH = textwrap.dedent(
    """
    import sys

    class Refuse:  # as in a browser tab: none of these can be imported
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in {"torch", "numpy", "triton", "tokenizers", "safetensors", "matplotlib",
                                          "jinja2", "tqdm", "rich", "transformers"}:
                raise ImportError(f"{name} is not here")

    sys.meta_path.insert(0, Refuse())
    import pagedlab.kv, pagedlab.sched, pagedlab.stages, pagedlab.engine.engine
    from pagedlab.lessons import lab, predict
    from pagedlab.viz import trace

    run = lab.run_lab(lab.LabOptions(num_requests=8))
    trace.validate(run)
    print(len(run["steps"]), sorted(m for m in sys.modules if m.partition(".")[0] == "pagedlab")[:1])
    """
)


def test_the_core_and_the_lab_import_and_run_without_torch():
    result = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[0]) > 0


def test_a_hybrid_lab_run_needs_no_torch_either():
    # kv/hybrid.py and kv/cache_groups.py are pure Python: the lab's page runs them in the browser.
    script = NO_TORCH.replace("lab.LabOptions(num_requests=8)", f"lab.LabOptions.from_fragment({HYBRID!r})")
    assert script != NO_TORCH
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[0]) > 0
