"""Stage 5: viz/compare.py (two runs' decisions, where they part and why) and the page that shows pagedlab's run
beside vLLM's real scheduler (`pagedlab trace --compare vllm`, `viz.step_through(llm, compare="vllm")`).

The divergence rules are checked on hand-made traces; the page, against vLLM itself where it is fetched (skipped
otherwise, a failure under PAGEDLAB_REQUIRE_VLLM=1): headless Chromium shows it with no page error, and at
every step the vLLM side shows exactly what vLLM's own driver recorded.
"""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path

import pytest

from pagedlab.lessons import vllm_peer
from pagedlab.lessons.demo import DemoOptions, demo_trace
from pagedlab.tools.cli import main
from pagedlab.viz import compare
from pagedlab.viz.page import render_compare_html
from tests.conftest import need_vllm
from tests.viz.test_step_through import dump_dom, embedded_trace

CHAPTERS = Path(__file__).resolve().parents[2] / "chapters"


@pytest.fixture(scope="module")
def demo() -> dict:
    return demo_trace(DemoOptions())


def test_a_run_against_itself_has_no_divergence(demo):
    assert compare.divergences(demo, copy.deepcopy(demo)) == []
    assert compare.summary([]) == {"same_schedule": True, "same_blocks": True, "unexplained": 0, "first": None}


def test_the_first_divergence_is_unexplained_without_a_ledger_row_and_the_rest_follow_it(demo):
    other = copy.deepcopy(demo)
    other["steps"][3]["scheduled"] = {"0": 99}
    other["steps"][5]["preempted"] = ["7"]
    found = compare.divergences(demo, other)
    assert [(d["step"], d["field"], d["ledger"], d["first"]) for d in found] == [
        (4, "scheduled", None, 4),
        (6, "preempted", None, 4),
    ]
    assert found[0]["vllm"] == {"0": 99} and compare.summary(found)["unexplained"] == 2


def test_after_vllm_cached_one_block_twice_the_duplicate_row_explains_it(demo):
    other = copy.deepcopy(demo)
    pool = other["steps"][1]["pool"]
    a, b = [i for i, ref in enumerate(pool["ref"]) if ref > 0][:2]
    pool["hash"][a] = pool["hash"][b] = 0  # two blocks under one hash, as vLLM keeps them
    other["steps"][6]["tables"] = {"0": [1, 2, 3]}
    found = compare.divergences(demo, other)
    assert [(d["step"], d["field"], d["ledger"]) for d in found] == [(7, "tables", "duplicate-cached-blocks")]


def test_cached_tokens_are_compared_at_each_requests_first_scheduling(demo):
    # pagedlab writes num_cached_tokens at every step a request is scheduled, vLLM's driver only at the first
    other = copy.deepcopy(demo)
    for step in other["steps"]:
        step["num_cached_tokens"] = {}
    for rid, first in compare.first_cached_tokens(demo["steps"])[0].items():
        other["steps"][0]["num_cached_tokens"][rid] = first
    later = [i for i, cached in enumerate(compare.first_cached_tokens(demo["steps"])) if cached and i > 0]
    for i in later:
        other["steps"][i]["num_cached_tokens"] = compare.first_cached_tokens(demo["steps"])[i]
    assert compare.divergences(demo, other) == []


@pytest.mark.parametrize("key", list(compare.LEDGER))
def test_every_ledger_row_the_page_cites_is_in_its_chapter(key):
    row = compare.LEDGER[key]
    text = (CHAPTERS / row.chapter).read_text(encoding="utf-8")
    ledger = text[text.index("## Differences from vLLM") :]
    assert f"| {row.pagedlab} |" in ledger, f"{row.chapter} has no ledger row starting {row.pagedlab!r}"


def test_the_page_lists_divergences_first_highlighted_with_their_ledger_rows(demo):
    other = copy.deepcopy(demo)
    other["steps"][3]["scheduled"] = {"0": 99}
    page = render_compare_html([("ours", demo), ("theirs", other)], found=compare.divergences(demo, other))
    assert '<section id="divergences" data-count="1" data-first="4">' in page
    assert '<li class="first" data-step="4" data-field="scheduled" data-ledger="">' in page
    assert '<span class="unexplained">unexplained</span>' in page


# --- against vLLM's own scheduler --------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_side(demo):
    """(vLLM's own steps from the driver, the comparison page's path) for the demo's scenario."""
    need_vllm()
    (result,) = vllm_peer.run_vllm([demo["recording"]])
    assert result["error"] is None
    return result["steps"]


@pytest.mark.slow
def test_cli_compare_vllm_writes_the_page_and_says_where_they_part(demo, vllm_side, tmp_path, capsys):
    out = tmp_path / "vllm.html"
    with pytest.raises(SystemExit) as done:
        main(["trace", "--html", str(out), "--compare", "vllm"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    found = compare.divergences(demo, compare.as_trace(vllm_side, demo))
    assert printed.startswith(f"wrote {out} (") and f"{len(demo['steps'])} and {len(vllm_side)} steps" in printed
    assert "same schedule: yes" in printed and f"the first at step {found[0]['step']}" in printed
    frames = [html.unescape(f) for f in re.findall(r'srcdoc="([^"]*)"', out.read_text(encoding="utf-8"))]
    untimed = lambda steps: [{k: v for k, v in s.items() if k != "time"} for s in steps]  # noqa: E731
    assert untimed(embedded_trace(frames[0])["steps"]) == untimed(demo["steps"])
    assert embedded_trace(frames[1])["steps"] == vllm_side  # the vLLM side is vLLM's own trace, unchanged


@pytest.mark.slow
def test_the_vllm_side_shows_vllms_own_decisions_in_chromium(demo, vllm_side, tmp_path):
    theirs = compare.as_trace(vllm_side, demo)
    found = compare.divergences(demo, theirs)
    page = tmp_path / "vllm.html"
    page.write_text(render_compare_html([("pagedlab", demo), ("vllm", theirs)], found=found), encoding="utf-8")
    first = found[0]["step"]
    for step in sorted({1, 6, first, len(vllm_side)}):
        dom = dump_dom(page, fragment=f"#step={step}")  # also asserts that no page error was logged
        shown = [json.loads(n.full_text()) for n in dom.find(**{"class": "frame-decisions"})]
        want = vllm_side[step - 1]
        assert shown[1] == {k: want[k] for k in ("step", "scheduled", "preempted", "finished", "tables")}
        assert shown[0]["step"] == step and shown[0]["scheduled"] == demo["steps"][step - 1]["scheduled"]
        marked = [n for n in dom.by_id("divergences").find(data_step=None) if "first" in n.attrs.get("class", "")]
        assert [n.attrs["data-step"] for n in marked] == [str(first)]


@pytest.mark.slow
def test_step_through_compare_vllm_in_a_notebook(vllm_side):
    from pagedlab import LLM, SamplingParams, viz

    llm = LLM(stage=5, block_size=4, num_kv_blocks=12, max_num_seqs=2, record_trace=True)
    llm.generate(["ROMEO:", "JULIET:", "KING:"], SamplingParams(max_tokens=6, temperature=0.0), use_tqdm=False)
    shown = html.unescape(html.unescape(viz.step_through(llm, compare="vllm")._repr_html_()))
    assert shown.count('<script type="application/json" id="trace">') == 2
    assert '<section id="divergences"' in shown
