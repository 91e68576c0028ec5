"""`pagedlab lab`: the live lab's page in headless Chromium, served on 127.0.0.1 with every other address unreachable.

It starts Pyodide from its own folder, runs pagedlab's core on the knobs, and for the same knobs makes the trace
`pagedlab trace --lab KNOBS --json` makes on the desktop, step for step, at every stage. Knobs are turned through
the DOM (a change event, as a person's edit fires), and the block tables the page draws are the trace's.
"""

from __future__ import annotations

import json
import time

import pytest

from pagedlab.lessons import lab_browser
from pagedlab.lessons.lab import KNOBS, LabOptions, run_lab
from pagedlab.tools.cli import main
from pagedlab.tools.lab import build_lab
from pagedlab.viz.page import page_template
from pagedlab.viz.trace import load
from tests.browser import Browser, need_chromium, only_local, serve_folder
from tests.conftest import need_pyodide

READY = "window.labTimes && window.labTimes.runs.length >= {n}"
TRIED = "window.labTimes.attempts >= {n} && !window.lab.busy"
FRAME = "document.getElementById('view').contentWindow"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    need_chromium()
    need_pyodide()
    folder = tmp_path_factory.mktemp("lab")
    build_lab(folder)
    with serve_folder(folder) as served:
        yield served


@pytest.fixture(scope="module")
def browser(site):
    with Browser() as b:
        b.open(site.url + "lab.html")
        b.wait_for(READY.format(n=1), timeout=120)
        yield b
        assert only_local(b.requests, site.url) == [], "the page asked for an address outside 127.0.0.1"
        assert not b.errors, b.report()


def turn(browser, knobs: dict) -> dict:
    """Set knobs through the DOM, one change event each (each reruns), and return the page's trace afterwards; the
    last knob's run must not be refused."""
    for name, value in knobs.items():
        tried = browser.eval("window.labTimes.attempts")
        if isinstance(value, bool):
            tick = f"const i = document.getElementById('knob-{name}'); i.checked = {str(value).lower()};"
            browser.eval(f"(() => {{ {tick} i.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")
        else:
            browser.set_value(f"#knob-{name}", str(value))
        browser.wait_for(TRIED.format(n=tried + 1), timeout=60)
    assert browser.eval("document.getElementById('error').textContent") == ""
    return json.loads(browser.eval("window.lab.trace()"))


def desktop(fragment: str, tmp_path) -> dict:
    """`pagedlab trace --lab FRAGMENT --json` on this machine."""
    path = tmp_path / "run.json"
    with pytest.raises(SystemExit) as done:
        main(["trace", "--lab", fragment, "--json", str(path)])
    assert done.value.code == 0
    return load(path)


def reset(browser) -> None:
    browser.eval("(() => { history.replaceState(null, '', '#'); })()")
    turn(browser, {name: _show(getattr(LabOptions(), name)) for name in KNOBS if name != "stage"} | {"stage": 5})


def _show(value):
    return value if isinstance(value, bool) else str(value)


# --- the promise: the page's run is the desktop's ------------------------------------------------------------


@pytest.mark.parametrize("stage", [2, 3, 4, 5])
def test_the_page_makes_the_desktop_trace_at_every_stage_on_several_seeds(browser, stage, tmp_path):
    for seed in (0, 1, 2):
        got = turn(browser, {"stage": stage, "seed": seed, "num_requests": 16})
        fragment = browser.eval("window.lab.fragment()")
        assert LabOptions.from_fragment(fragment) == LabOptions(stage=stage, seed=seed, num_requests=16)
        expected = desktop(fragment, tmp_path) if seed == 0 else run_lab(LabOptions.from_fragment(fragment))
        assert got == expected, f"stage {stage}, seed {seed}: the page's trace differs from the desktop's"


def test_every_knob_turns_and_the_run_follows_it(browser):
    values = {"stage": 4, "block_size": 16, "num_kv_blocks": 40, "max_num_seqs": 5, "max_num_batched_tokens": 300,
              "enable_prefix_caching": False, "sliding_window": 32, "num_requests": 12, "seed": 4}  # fmt: skip
    trace = turn(browser, values)
    options = LabOptions.from_fragment(browser.eval("window.lab.fragment()"))
    assert options == LabOptions(**values)
    for name in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
                 "sliding_window"):  # fmt: skip
        assert trace["config"][name] == values[name], name
    assert trace == run_lab(options)
    stage5 = {"stage": 5, "enable_prefix_caching": True, "long_prefill_token_threshold": 8, "preemption_mode": "swap",
              "scheduling_policy": "priority", "eviction_policy": "fifo", "num_kv_blocks": 30}  # fmt: skip
    trace = turn(browser, stage5)
    options = LabOptions.from_fragment(browser.eval("window.lab.fragment()"))
    assert options == LabOptions(**(values | stage5))
    assert [trace["config"][k] for k in ("long_prefill_token_threshold", "preemption_mode", "scheduling_policy")] == [
        8, "swap", "priority"]  # fmt: skip
    assert trace == run_lab(options)  # the eviction policy is no config field: the whole run says it was used
    assert browser.eval("document.querySelector('label[data-knob=eviction_policy]').className") == ""
    turn(browser, {"stage": 2})
    assert "unused" in browser.eval("document.querySelector('label[data-knob=eviction_policy]').className")
    reset(browser)


def test_the_drawn_block_tables_are_the_traces(browser):
    trace = turn(browser, {"stage": 4, "seed": 1})
    for step in (1, 7, len(trace["steps"]) // 2):
        browser.eval(f"{FRAME}.pagedlab.goToStep({step})")
        drawn = browser.eval(
            f"Object.fromEntries([...{FRAME}.document.querySelectorAll('#tables .row')].map(r => "
            "[r.dataset.request, [...r.querySelectorAll('.cell')].map(c => Number(c.dataset.block))]))"
        )
        assert drawn == trace["steps"][step - 1]["tables"], f"step {step}"
    click = ("(() => { const svg = {frame}.document.querySelector('#gantt svg'), box = svg.getBoundingClientRect();"
             " const w = Number(svg.querySelector('#gantt-cursor').getAttribute('width'));"
             " svg.dispatchEvent(new MouseEvent('click', {bubbles: true, clientX: box.left + 40 + w * 9 + 1,"
             " clientY: box.top + 30})); })()")  # fmt: skip
    browser.eval(click.replace("{frame}", FRAME))
    assert browser.eval("window.lab.currentStep()") == 10  # a click on the Gantt's 10th column
    reset(browser)


def test_a_hybrid_layer_pattern_draws_a_table_per_group(browser):
    # The text knob layer_pattern makes the model hybrid: each request's rows are its tables, one per group, each
    # labelled with its group's kind, the window's group showing the null block (0) behind its window.
    trace = turn(browser, {"num_kv_blocks": 64, "sliding_window": 16, "layer_pattern": "WF"})
    fragment = browser.eval("window.lab.fragment()")
    assert fragment == "num_kv_blocks=64&sliding_window=16&layer_pattern=WF"
    assert trace == run_lab(LabOptions.from_fragment(fragment))
    kinds = [g["kind"] for g in trace["config"]["kv_cache_groups"]]
    step = next(s for s in trace["steps"] if any(0 in t[0] and t[1] for t in s["tables"].values()))
    browser.eval(f"{FRAME}.pagedlab.goToStep({step['step']})")
    drawn = browser.eval(
        f"[...{FRAME}.document.querySelectorAll('#tables .row')].map(r => [r.dataset.request, Number(r.dataset.group), "
        "r.querySelector('.group').textContent, [...r.querySelectorAll('.cell')].map(c => Number(c.dataset.block))])"
    )
    assert drawn == [[rid, g, kinds[g], blocks] for rid, t in step["tables"].items() for g, blocks in enumerate(t)]
    reset(browser)


def test_a_knob_change_keeps_the_cursor_where_the_step_still_exists(browser):
    trace = turn(browser, {"num_requests": 20})
    browser.eval(f"{FRAME}.pagedlab.goToStep(12)")
    turn(browser, {"num_kv_blocks": 36})
    assert browser.eval("window.lab.currentStep()") == 12
    assert browser.eval("location.hash").endswith("&step=12")
    browser.eval(f"{FRAME}.pagedlab.goToStep({len(trace['steps'])})")
    shorter = turn(browser, {"num_requests": 3})
    assert browser.eval("window.lab.currentStep()") == shorter["steps"][-1]["step"]  # gone: the last step
    reset(browser)


def test_a_bad_knob_is_shown_naming_its_field_and_nothing_runs(browser):
    before = browser.eval("window.lab.trace()")
    browser.set_value("#knob-num_kv_blocks", "2")
    browser.wait_for("document.getElementById('error').textContent.length > 0", timeout=30)
    assert browser.eval("document.getElementById('error').textContent").startswith("num_kv_blocks:")
    assert browser.eval("window.lab.trace()") == before
    reset(browser)
    assert browser.eval("document.getElementById('error').textContent") == ""


def test_an_address_opens_the_lab_with_its_knobs(browser, site):
    assert only_local(browser.requests, site.url) == []  # (open() starts a new page, and a new list)
    browser.open(site.url + "lab.html#stage=3&block_size=16&seed=2&step=9")
    browser.wait_for(READY.format(n=1), timeout=120)
    assert browser.eval("window.lab.fragment()") == "stage=3&block_size=16&seed=2"
    assert browser.eval("window.lab.currentStep()") == 9
    assert json.loads(browser.eval("window.lab.trace()")) == run_lab(LabOptions(stage=3, block_size=16, seed=2))
    reset(browser)


def test_a_broken_address_is_said_under_the_knobs(browser, site):
    assert only_local(browser.requests, site.url) == []
    browser.open(site.url + "lab.html#num_requests=%E0&stage=9")
    browser.wait_for("window.labTimes && window.labTimes.attempts >= 1", timeout=120)
    assert browser.eval("document.getElementById('error').textContent").startswith("stage: ")
    assert not browser.errors, browser.report()
    browser.open(site.url + "lab.html")
    browser.wait_for(READY.format(n=1), timeout=120)


# --- predictions, files ------------------------------------------------------------------------------------


def test_a_prediction_is_asked_before_the_step_and_judged_as_the_notebooks_judge(browser):
    turn(browser, {"stage": 5, "seed": 0})
    browser.eval(f"{FRAME}.pagedlab.goToStep(4)")
    browser.eval("document.getElementById('predict').checked = true")
    browser.click("#ask")
    browser.wait_for("!document.getElementById('predict-panel').hidden", timeout=30)
    text = browser.eval("document.getElementById('question').textContent")
    assert text.startswith("Before step 5: ") and browser.eval("window.lab.currentStep()") == 4  # not shown yet
    lab_browser.set_template(page_template())
    fragment = browser.eval("window.lab.fragment()")
    asked = json.loads(lab_browser.question(fragment, 4))
    assert text.endswith(asked["text"])
    browser.set_value("#guess", "0")
    browser.click("#answer")
    browser.wait_for("document.getElementById('verdict').textContent.length > 0", timeout=30)
    expected = json.loads(lab_browser.judge(fragment, 4, asked["name"], json.dumps(asked["given"]), "0"))
    assert browser.eval("document.getElementById('verdict').textContent") == expected["message"]
    assert browser.eval("document.getElementById('verdict').dataset.verdict") == expected["verdict"]
    assert browser.eval("window.lab.currentStep()") == 5  # then the step is shown
    browser.eval("document.getElementById('predict').checked = false")


def test_the_download_button_saves_the_trace_that_pagedlab_trace_draws(browser, tmp_path):
    turn(browser, {"stage": 3, "seed": 1})
    browser.send("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)}, session=False)
    browser.click("#download")
    found = []
    for _ in range(100):  # the file lands a moment after the click: 5 s at most
        found = sorted(tmp_path.glob("*.json"))  # (Chromium writes a .crdownload first, then renames it)
        if found:
            break
        time.sleep(0.05)
    (saved,) = found
    assert saved.name == "pagedlab-lab-stage=3_seed=1.json"
    assert load(saved) == run_lab(LabOptions(stage=3, seed=1))
    assert run_cli_ok("trace", "--from", str(saved), "--html", str(tmp_path / "run.html"))
    reset(browser)


def run_cli_ok(*argv: str) -> bool:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return done.value.code == 0


def test_a_desktop_trace_opens_in_the_page(browser, tmp_path):
    demo = tmp_path / "demo.json"
    with pytest.raises(SystemExit):
        main(["trace", "--json", str(demo)])  # the demo's run, with its model: any trace opens
    document = browser.send("DOM.getDocument")
    node = browser.send("DOM.querySelector", {"nodeId": document["root"]["nodeId"], "selector": "#open"})
    browser.send("DOM.setFileInputFiles", {"files": [str(demo)], "nodeId": node["nodeId"]})
    browser.wait_for(f"{FRAME}.document.getElementById('title').textContent.includes('demo.json') || "
                     f"{FRAME}.document.getElementById('title').textContent.includes('from a file')")  # fmt: skip
    steps = load(demo)["steps"]
    assert browser.eval(f"{FRAME}.pagedlab.lastStep()") == steps[-1]["step"]
    assert json.loads(browser.eval("window.lab.trace()")) == load(demo)
    browser.set_value("#knob-seed", "1")  # a knob runs the lab again
    browser.wait_for("window.lab.fragment() === 'seed=1' && !window.lab.busy", timeout=60)
    reset(browser)
