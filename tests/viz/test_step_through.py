"""pagedlab.viz.page (step_through) and `pagedlab trace --html`: one self-contained page, and what headless Chromium
shows in it at a step (the label, the queues, the block tables, the pool, the events) is that step of the trace."""

from __future__ import annotations

import html
import json
import re
import subprocess
import time
from html.parser import HTMLParser

import pytest

from pagedlab.lessons.demo import DemoOptions, demo_trace
from pagedlab.tools.cli import main
from pagedlab.viz import page as step_through
from pagedlab.viz.trace import from_json, to_trace, trace_groups
from tests.browser import need_chromium

HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000"]
QUIET_STEP = "nothing else changed: every request ran on as before"  # the events of a step without any
SCENARIOS = {"continuous": {}, "contiguous": {"stage": 1}, "paged": {"stage": 2}, "swap": {"preemption_mode": "swap"}}


@pytest.fixture(scope="module")
def traces() -> dict[str, dict]:
    """The demo's scenario at stage 5 (recompute and swap), 1 and 2."""
    return {name: demo_trace(DemoOptions(**opts)) for name, opts in SCENARIOS.items()}


# --- without a browser -------------------------------------------------------------------------------


def embedded_trace(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="trace">(.*?)</script>', page, re.S)
    assert found, "no embedded trace"
    return from_json(found.group(1))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_page_is_self_contained_and_embeds_the_trace(traces, name):
    page = step_through.render_html(traces[name])
    assert not re.search(r"https?://", page), "an external URL in the page"
    for attr, target in re.findall(r"""\b(src|href)\s*=\s*["']?([^"'\s>]*)""", page):
        assert target.startswith(("#", "data:")), f"{attr}={target!r} leaves the page"
    assert embedded_trace(page) == traces[name]
    assert "__TRACE__" not in page and "__PALETTE__" not in page


def test_script_end_tags_in_texts_cannot_break_out():
    # A prompt that closes the script element early would run as HTML; escaped, it stays a JSON string.
    opts = DemoOptions(num_requests=1, max_tokens=2)
    trace = demo_trace(opts)
    trace["requests"]["0"]["prompt"] = "</script><script>alert(1)</script><!--"
    page = step_through.render_html(trace)
    assert page.count("</script>") == 2  # the trace's and the page's own
    assert embedded_trace(page)["requests"]["0"]["prompt"] == "</script><script>alert(1)</script><!--"


# Text that names every marker of the page's templates and holds live markup: a title, a label or a prompt.
HOSTILE = "__TRACE__ __LAST__ __FRAMES__ __TITLE__ __PALETTE__ </script><img src=x onerror=alert(1)> & \u2028"


def hostile_trace(max_tokens: int = 2) -> dict:
    """One short request whose prompt is HOSTILE."""
    trace = demo_trace(DemoOptions(num_requests=1, max_tokens=max_tokens))
    trace["requests"]["0"]["prompt"] = HOSTILE
    return trace


def test_markers_and_markup_in_a_title_or_prompt_stay_text():
    # The title goes in escaped where text goes; the trace goes in once, its "<" and ">" as JSON escapes.
    trace = hostile_trace()
    page = step_through.render_html(trace, title=HOSTILE)
    escaped = html.escape(HOSTILE)
    assert f"<title>{escaped}</title>" in page and f'<h1 id="title">{escaped}</h1>' in page
    assert page.count('<script type="application/json" id="trace">') == 1
    assert embedded_trace(page) == trace
    assert "<img" not in page


def test_markers_and_markup_in_compare_labels_stay_text():
    # Each label names a frame and titles its page; the comparison's own title names the markers too.
    runs = [(HOSTILE, hostile_trace(2)), ("b " + HOSTILE, hostile_trace(3))]
    page = step_through.render_compare_html(runs, title=HOSTILE)
    assert page.count(f"<title>{html.escape(HOSTILE)}</title>") == 1 and "<img" not in page
    last = max(len(t["steps"]) for _, t in runs)
    assert f'max="{last}"' in page and f"const LAST = {last};" in page
    captions = re.findall(r'<figcaption data-run="\d">(.*?) · <span', page)
    assert captions == [html.escape(label) for label, _ in runs]
    frames = [html.unescape(frame) for frame in re.findall(r'srcdoc="([^"]*)"', page)]
    assert [embedded_trace(frame) for frame in frames] == [trace for _, trace in runs]
    for (label, _), frame in zip(runs, frames):
        assert f"<title>{html.escape(label)}</title>" in frame and "<img" not in frame


def test_cli_writes_the_page_and_prints_its_size(tmp_path, capsys):
    path = tmp_path / "run.html"
    with pytest.raises(SystemExit) as exit_info:
        main(["trace", "--html", str(path), "--stage", "paged", "--num-requests", "4", "--max-tokens", "6"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    size = re.search(r"wrote (\S+) \((\d+\.\d) KiB, (\d+) steps\)", out)
    assert size and size.group(1) == str(path), out
    assert float(size.group(2)) == pytest.approx(path.stat().st_size / 1024, abs=0.05)
    trace = embedded_trace(path.read_text(encoding="utf-8"))
    assert trace["stage"] == 2 and len(trace["requests"]) == 4 and len(trace["steps"]) == int(size.group(3))


def test_cli_refuses_a_run_that_does_not_end(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["trace", "--html", str(tmp_path / "run.html"), "--max-steps", "3"])
    assert exit_info.value.code == 2
    assert "unfinished after 3 engine steps" in capsys.readouterr().err
    assert not (tmp_path / "run.html").exists()


# --- in headless Chromium ----------------------------------------------------------------------------


class Node:
    def __init__(self, tag: str, attrs: dict):
        self.tag, self.attrs, self.children, self.text = tag, attrs, [], ""

    def all(self):
        yield self
        for child in self.children:
            yield from child.all()

    def find(self, **attrs) -> list[Node]:
        """Descendants whose attributes (data_x for data-x) have these values (None: present at all)."""
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [n for n in self.all() if all(k in n.attrs and v in (None, n.attrs[k]) for k, v in want.items())]

    def by_id(self, id_: str) -> Node:
        (node,) = self.find(id=id_)
        return node

    def full_text(self) -> str:
        return self.text + "".join(child.full_text() for child in self.children)


class DomParser(HTMLParser):
    """The DOM Chromium dumps, as a tree of Nodes (void elements have no end tag)."""

    VOID = {"meta", "input", "br", "img", "link", "hr", "col", "area", "base", "source", "wbr"}

    def __init__(self):
        super().__init__()
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(text := Node("#text", {}))
        text.text = data


def chromium(page, *flags: str, fragment: str = "") -> subprocess.CompletedProcess:
    cmd = [need_chromium(), *HEADLESS, "--enable-logging=stderr", "--v=0", *flags, page.as_uri() + fragment]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def page_errors(stderr: str) -> list[str]:
    """What the page's scripts reported: Chromium logs console messages and uncaught errors as CONSOLE lines."""
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line or "console(" in line]


def dump_dom(page, fragment: str = "") -> Node:
    result = chromium(page, "--dump-dom", fragment=fragment)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not page_errors(result.stderr), page_errors(result.stderr)
    parser = DomParser()
    parser.feed(result.stdout)
    return parser.root


def requests_in(node: Node) -> list[str]:
    return [n.attrs["data-request"] for n in node.find(data_request=None) if "req" in n.attrs.get("class", "")]


def assert_shows_step(dom: Node, trace: dict, index: int) -> None:
    """The page shows trace["steps"][index]: label and address, queues, block tables, pool, events, budget."""
    step, last = trace["steps"][index], trace["steps"][-1]["step"]
    assert dom.by_id("step-label").full_text() == f"step {step['step']} of {last}"
    body = next(n for n in dom.all() if n.tag == "body")
    assert body.attrs["data-hash"] == f"#step={step['step']}"  # the address follows the step shown
    for queue in ("waiting", "running", "preempted", "swapped"):
        assert requests_in(dom.by_id(f"queue-{queue}")) == step[queue], queue
    assert list(shown_tables(dom).items()) == list(group_tables(trace, step).items())
    hybrid = trace_groups(trace["config"]) > 1
    assert_pool(dom.by_id("pool"), step["pool"], 0 if trace["config"].get("sliding_window") or hybrid else None)
    items = [li for li in dom.by_id("events").children if li.tag == "li"]
    events = [(li.attrs["data-kind"], li.full_text().removeprefix(li.attrs["data-kind"])) for li in items]
    assert events == ([(e["kind"], e["text"]) for e in step["events"]] or [("none", QUIET_STEP)])
    prefill = sum(n for rid, n in step["scheduled"].items() if rid in step["prefills"])
    decode = sum(step["scheduled"].values()) - prefill
    budget = dom.by_id("budget").attrs
    assert (int(budget["data-prefill"]), int(budget["data-decode"])) == (prefill, decode)


def shown_tables(dom: Node) -> dict[str, list[list[int]]]:
    """The block tables the page draws: request -> its rows' block ids (one row, or a hybrid model's one per group)."""
    shown: dict[str, list[list[int]]] = {}
    for row in (n for n in dom.by_id("tables").children if "row" in n.attrs.get("class", "")):
        blocks = [int(c.attrs["data-block"]) for c in row.find(data_block=None)]
        shown.setdefault(row.attrs["data-request"], []).append(blocks)
    return shown


def group_tables(trace: dict, step: dict) -> dict[str, list[list[int]]]:
    """A step's tables as lists of tables: a hybrid trace's are already one per group, an ordinary one's is one."""
    hybrid = trace_groups(trace["config"]) > 1
    return {rid: table if hybrid else [table] for rid, table in step["tables"].items()}


def assert_pool(pool: Node, expected: dict | None, null: int | None = None) -> None:
    """The pool map shows `expected` (a step's "pool"); `null`: the null block's id, a sliding window's."""
    cells = pool.find(data_block=None)
    if expected is None:  # stage 1: regions, no pool
        assert cells == []
        return
    assert [int(c.attrs["data-block"]) for c in cells] == list(range(len(expected["ref"])))
    assert [int(c.attrs["data-ref"]) for c in cells] == expected["ref"]
    states = [_state(ref, h) for ref, h in zip(expected["ref"], expected["hash"])]
    if null is not None:
        states[null] = "null"
    assert [c.attrs["data-state"] for c in cells] == states


def _state(ref: int, hash_index) -> str:
    return "shared" if ref > 1 else "used" if ref == 1 else "cached" if hash_index is not None else "free"


def first_step_with(trace: dict, kind: str) -> int:
    return next(i for i, s in enumerate(trace["steps"]) if any(e["kind"] == kind for e in s["events"]))


@pytest.fixture(scope="module")
def pages(traces, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("pages")
    return {name: step_through.write_html(trace, folder / f"{name}.html") for name, trace in traces.items()}


@pytest.mark.slow
def test_chromium_reports_a_page_error_as_this_check_reads_it(tmp_path):
    # The console check below is only worth something if it sees a thrown error: it does.
    page = tmp_path / "broken.html"
    page.write_text('<p id="a">hi</p><script>throw new Error("deliberate")</script>', encoding="utf-8")
    errors = page_errors(chromium(page, "--dump-dom").stderr)
    assert any("deliberate" in line for line in errors), errors


@pytest.mark.slow
def test_the_page_shows_the_step_of_its_address(traces, pages):
    trace, page = traces["continuous"], pages["continuous"]
    last = len(trace["steps"]) - 1
    for index in (0, first_step_with(trace, "preempt"), first_step_with(trace, "refill"), last):
        start = time.perf_counter()
        dom = dump_dom(page, f"#step={trace['steps'][index]['step']}")
        assert time.perf_counter() - start < 30
        assert_shows_step(dom, trace, index)


@pytest.mark.slow
def test_keys_step_forward_and_back(traces, pages):
    # The page presses the keys of #keys= through the document's keydown handler, as a person's keys go.
    trace, page = traces["continuous"], pages["continuous"]
    assert_shows_step(dump_dom(page, "#step=3&keys=right,right,left"), trace, 3)
    assert_shows_step(dump_dom(page, "#step=3&keys=end,left"), trace, len(trace["steps"]) - 2)
    assert_shows_step(dump_dom(page, "#step=9&keys=home,right"), trace, 1)
    assert_shows_step(dump_dom(page, "#keys=left"), trace, 0)  # no step: the first; nothing before it


@pytest.mark.slow
def test_a_selected_request_lights_up_its_blocks_in_the_pool(traces, pages):
    # #request=ID selects as a click on the request does (both call select()).
    trace, page = traces["continuous"], pages["continuous"]
    index = first_step_with(trace, "hit")
    step = trace["steps"][index]
    rid = next(r for r in step["tables"] if step["tables"][r])
    dom = dump_dom(page, f"#step={step['step']}&request={rid}")
    lit = [int(c.attrs["data-block"]) for c in dom.by_id("pool").find(data_block=None) if "hl" in c.attrs["class"]]
    assert sorted(lit) == sorted(set(step["tables"][rid]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["contiguous", "paged", "swap"])
def test_other_stages_render_without_errors(traces, pages, name):
    trace = traces[name]
    for index in (0, len(trace["steps"]) // 2, len(trace["steps"]) - 1):
        assert_shows_step(dump_dom(pages[name], f"#step={trace['steps'][index]['step']}"), trace, index)


@pytest.mark.slow
def test_a_sliding_window_run_shows_its_null_block(pages, tmp_path):
    # Block 0 stands in for blocks behind the window: drawn as the null block, never as a free one.
    from pagedlab.lessons.window import windowed_bundled_model

    trace = demo_trace(DemoOptions(model=str(windowed_bundled_model(16))))
    page = step_through.write_html(trace, tmp_path / "window.html")
    index = next(i for i, s in enumerate(trace["steps"]) if any(0 in t for t in s["tables"].values()))
    dom = dump_dom(page, f"#step={trace['steps'][index]['step']}")
    assert_shows_step(dom, trace, index)
    (null,) = dom.by_id("pool").find(data_block="0")
    assert (null.attrs["data-state"], null.attrs["data-ref"]) == ("null", "0")
    assert "hidden" not in dom.by_id("legend-null").attrs
    assert dom.by_id("subtitle").full_text().endswith(" · sliding window of 16 tokens")
    assert "hidden" in dump_dom(pages["continuous"]).by_id("legend-null").attrs  # no window, no null block


def hybrid_trace() -> dict:
    """A hybrid model's run, without a model: the differential's recording (layers full, sliding-8, full,
    sliding-16: four KV cache groups) replayed by the stage-5 scheduler and KV manager."""
    from pagedlab.engine.replay import ReplayEngine
    from pagedlab.lessons.differential import workload

    return to_trace(ReplayEngine(workload("hybrid", 0)).run())


@pytest.mark.slow
def test_a_hybrid_run_shows_a_table_per_group_and_lights_up_every_group(tmp_path):
    # The step where a request holds real blocks in every group and a sliding group has dropped some (null).
    trace = hybrid_trace()
    kinds = [g["kind"] for g in trace["config"]["kv_cache_groups"]]
    assert len(kinds) == trace_groups(trace["config"]) > 1 and "full" in kinds and len(set(kinds)) > 1

    def shows_all(table: list[list[int]]) -> bool:
        return all(any(b != 0 for b in group) for group in table) and any(0 in group for group in table)

    index, rid = next((i, r) for i, s in enumerate(trace["steps"]) for r, t in s["tables"].items() if shows_all(t))
    step = trace["steps"][index]
    page = step_through.write_html(trace, tmp_path / "hybrid.html")
    assert_shows_step(dump_dom(page, f"#step={step['step']}"), trace, index)  # every request's rows, the pool, ...
    dom = dump_dom(page, f"#step={step['step']}&request={rid}")
    rows = [n for n in dom.by_id("tables").children if n.attrs.get("data-request") == rid]
    assert [row.attrs["data-group"] for row in rows] == [str(g) for g in range(len(kinds))]
    labels = [row.find(**{"class": "group"})[0] for row in rows]
    assert [label.full_text() for label in labels] == kinds
    for g, (label, group) in enumerate(zip(labels, trace["config"]["kv_cache_groups"])):
        assert label.attrs["title"] == f"KV cache group {g}: layers {', '.join(map(str, group['layers']))}"
    for row, blocks in zip(rows, step["tables"][rid]):
        cells = row.find(data_block=None)
        assert [int(c.attrs["data-block"]) for c in cells] == blocks
        assert [("null" in c.attrs["class"].split()) for c in cells] == [b == 0 for b in blocks]
    chips = [[n for n in row.find(data_request=rid) if "req" in n.attrs.get("class", "")] for row in rows]
    assert [len(c) for c in chips] == [1] + [0] * (len(rows) - 1)  # the request's chip on its first row only
    lit = [int(c.attrs["data-block"]) for c in dom.by_id("pool").find(data_block=None) if "hl" in c.attrs["class"]]
    held = {b for group in step["tables"][rid] for b in group} - {0}  # every group's blocks, not the null block
    assert sorted(lit) == sorted(held)
    assert all(any(b in lit for b in group) for group in step["tables"][rid])  # each group's blocks light up
    assert "hidden" not in dom.by_id("legend-groups").attrs and "hidden" not in dom.by_id("legend-null").attrs
    assert dom.by_id("subtitle").full_text().endswith(f"a block table per KV cache group ({', '.join(kinds)})")


@pytest.mark.slow
def test_screenshots_of_two_steps(traces, pages, tmp_path):
    trace = traces["continuous"]
    for index in (first_step_with(trace, "preempt"), first_step_with(trace, "refill")):
        shot = tmp_path / f"step{index}.png"
        fragment = f"#step={trace['steps'][index]['step']}"
        result = chromium(pages["continuous"], f"--screenshot={shot}", "--window-size=1280,1000", fragment=fragment)
        assert result.returncode == 0 and not page_errors(result.stderr), result.stderr[-2000:]
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@pytest.mark.slow
def test_markers_and_markup_stay_text_in_chromium(tmp_path):
    # Chromium shows the title and the selected request's prompt as the text they are: no <img>, no error.
    trace = hostile_trace()
    dom = dump_dom(step_through.write_html(trace, tmp_path / "page.html", title=HOSTILE), "#request=0")
    assert [n for n in dom.all() if n.tag in ("img", "iframe")] == []
    assert dom.by_id("title").full_text() == HOSTILE
    assert HOSTILE in dom.by_id("detail").full_text()  # the prompt, as JSON.parse read it
    assert dom.by_id("step-label").full_text() == f"step 1 of {len(trace['steps'])}"
    runs = [(HOSTILE, trace), ("b " + HOSTILE, hostile_trace(3))]
    dom = dump_dom(step_through.write_compare_html(runs, tmp_path / "cmp.html", title=HOSTILE))
    assert [n for n in dom.all() if n.tag == "img"] == [] and len([n for n in dom.all() if n.tag == "iframe"]) == 2
    assert next(n for n in dom.all() if n.tag == "h1").full_text() == HOSTILE
    captions = [n.full_text() for n in dom.all() if n.tag == "figcaption"]
    assert captions == [f"{label} · step 1 of {len(t['steps'])}" for label, t in runs]  # both pages ran


def test_trace_json_is_what_the_page_reads(traces):
    # The page parses the embedded text with JSON.parse: the escaped text is still the same JSON.
    text = step_through.embed_json(traces["continuous"])
    assert "</" not in text and json.loads(text) == traces["continuous"]


# --- side by side, and inline in a notebook ------------------------------------------------------------


def text_of(node: Node) -> str:
    return "".join(n.text for n in node.all() if n.tag == "#text").strip()


def test_a_comparison_is_one_self_contained_page_holding_both_runs(traces):
    runs = [("recompute", traces["continuous"]), ("swap", traces["swap"])]
    page = step_through.render_compare_html(runs)
    assert not re.search(r"https?://", page)
    frames = re.findall(r'srcdoc="([^"]*)"', page)
    assert len(frames) == 2
    for (_, trace), frame in zip(runs, frames):
        assert embedded_trace(html.unescape(frame)) == trace
    with pytest.raises(ValueError, match="compare: expected at least two runs"):
        step_through.render_compare_html(runs[:1])


def test_cli_compare_runs_the_scenario_twice(tmp_path, capsys):
    out = tmp_path / "cmp.html"
    with pytest.raises(SystemExit) as done:
        main(["trace", "--html", str(out), "--compare", "preemption-mode=swap"])
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out} (") and printed.endswith(" KiB, 35 and 38 steps)\n")
    with pytest.raises(SystemExit) as done:
        main(["trace", "--html", str(tmp_path / "x.html"), "--compare", "delay=3"])
    assert done.value.code == 2 and "compare: expected NAME=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_one_cursor_moves_both_runs_in_chromium(traces, tmp_path):
    runs = [("recompute", traces["continuous"]), ("swap", traces["swap"])]
    page = step_through.write_compare_html(runs, tmp_path / "cmp.html")
    last = [t["steps"][-1]["step"] for _, t in runs]
    end = max(last)
    dom = dump_dom(page, fragment="#step=10&keys=right,right,left")
    assert dom.by_id("step-label").full_text().strip() == f"step 11 of {end}"
    labels = [text_of(n) for n in dom.find(**{"class": "frame-label"})]
    assert labels == [f"step 11 of {last[0]}", f"step 11 of {last[1]}"]
    dom = dump_dom(page, fragment="#keys=end")
    labels = [text_of(n) for n in dom.find(**{"class": "frame-label"})]
    assert labels == [f"step {last[0]} of {last[0]}", f"step {end} of {last[1]}"]  # the shorter run stays at its end


def test_step_through_in_a_notebook_is_an_iframe_of_the_page(traces):
    from pagedlab.viz.page import step_through as inline

    shown = inline(traces["continuous"])._repr_html_()
    assert (
        shown.startswith('<div class="pagedlab-step-through"><iframe srcdoc=')
        and embedded_trace(html.unescape(shown)) == traces["continuous"]
    )
    both = inline(traces["continuous"], compare=traces["swap"])._repr_html_()
    inner = html.unescape(html.unescape(both))  # the notebook's frame holds the comparison, which holds two pages
    assert inner.count('<script type="application/json" id="trace">') == 2


@pytest.mark.slow
def test_hits_copies_and_request_colours_are_marked_in_chromium(traces, pages, tmp_path):
    """A prefix-cache hit is framed in its request's row, a copy-on-write copy carries its source in its title, and
    no request is drawn in a block state's colour (the legend says so)."""
    from pagedlab import LLM, SamplingParams
    from pagedlab.viz.palette import STATE_COLOURS
    from pagedlab.viz.trace import to_trace

    trace, index = traces["continuous"], first_step_with(traces["continuous"], "hit")
    dom = dump_dom(pages["continuous"], fragment=f"#step={trace['steps'][index]['step']}")
    (hit,) = [e for e in trace["steps"][index]["events"] if e["kind"] == "hit"][:1]
    (row,) = [n for n in dom.by_id("tables").children if n.attrs.get("data-request") == hit["request"]]
    framed = [int(c.attrs["data-block"]) for c in row.find(data_block=None) if "hit" in c.attrs["class"].split()]
    assert framed == hit["blocks"]
    assert "a request's colour is its own" in dom.full_text()
    chips = [n.attrs["style"] for n in dom.find(data_request=None) if "req" in n.attrs.get("class", "")]
    assert chips and not any(colour.lower() in style.lower() for style in chips for colour in STATE_COLOURS)

    llm = LLM(stage="cow", block_size=4, num_kv_blocks=16, max_num_seqs=8, record_trace=True)
    llm.engine.add_request("A", "ROMEO:", SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=4, ignore_eos=True))
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    cow = to_trace(llm)
    page = step_through.write_html(cow, tmp_path / "cow.html")
    index = first_step_with(cow, "copy")
    dom = dump_dom(page, fragment=f"#step={cow['steps'][index]['step']}")
    for rid, src, dst in cow["steps"][index]["copies"]:
        (row,) = [n for n in dom.by_id("tables").children if n.attrs.get("data-request") == rid]
        (cell,) = [c for c in row.find(data_block=str(dst))]
        assert "copied" in cell.attrs["class"].split() and f"a copy of block {src}" in cell.attrs["title"]


def _gantt_state(step: dict, rid: str) -> str | None:
    """The Gantt's state of a request in a step: the first list naming it decides."""
    for name, state in (("preempted", "preempted"), ("swapped", "swapped")):
        if rid in step[name]:
            return state
    if rid in step["scheduled"]:
        return "prefill" if rid in step["prefills"] else "decode"
    return "held" if rid in step["running"] else "waiting" if rid in step["waiting"] else None


@pytest.mark.parametrize("name", ["continuous", "swap"])
def test_the_gantt_draws_each_requests_states_as_runs_of_steps(traces, pages, name):
    """One rect per run of steps in one state (a long run stays a light page), covering exactly the trace's states."""
    trace, root = traces[name], dump_dom(pages[name])
    index = {s["step"]: i for i, s in enumerate(trace["steps"])}
    drawn, rects = {}, root.by_id("gantt").find(data_state=None)
    for rect in rects:
        first, last = index[int(rect.attrs["data-step"])], index[int(rect.attrs["data-last-step"])]
        for i in range(first, last + 1):
            assert (rect.attrs["data-request"], i) not in drawn
            drawn[(rect.attrs["data-request"], i)] = rect.attrs["data-state"]
    expected = {(rid, i): _gantt_state(s, rid) for i, s in enumerate(trace["steps"]) for rid in trace["requests"]}
    assert drawn == {key: state for key, state in expected.items() if state is not None}
    assert len(rects) < len(drawn) / 2  # runs, not cells
