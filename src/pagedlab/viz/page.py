"""Stage 1: a run as one self-contained HTML page to step through in a browser (`pagedlab trace --html`).

Builds on: viz/trace.py (the trace format the page reads), viz/palette.py (its colours).
Read with: chapters/05-continuous-batching.md, chapters/97-architecture.md (One engine step).

The page is viz/step_through.html (plain JavaScript, no framework) with the trace embedded as JSON:

    <script type="application/json" id="trace">{"version": 1, ...}</script>

It reads nothing else: no network, no other file, so it can be mailed or opened from a USB stick. A slider,
◀ / ▶, play, ← / → and Home / End move through the steps; `page.html#step=N` opens at engine step N and the
address follows the slider. Panels, all of one step: the queues, the block tables, the pool map, the token
budget, what changed; and a Gantt of the whole run with the step's cursor.
"""

from __future__ import annotations

import html
import json
import re
from importlib.resources import files
from pathlib import Path

from pagedlab.errors import InvariantError
from pagedlab.viz.trace import dumps, to_trace, validate

TEMPLATE = "step_through.html"  # package data beside this file (pyproject: [tool.setuptools.package-data])
HELD = "#bbbbbb"  # the Gantt: a running request that holds K/V but was not scheduled this step


def render_html(trace: dict, title: str = "pagedlab: step through a run") -> str:
    """The page for `trace` (a viz.trace dict, validated first) as one HTML string."""
    return fill_trace(page_template(), trace, title)


def page_template() -> str:
    """The page with its colours filled in and the trace and title still markers: the live lab ships it and fills
    those in the browser (lessons/lab_browser.py), where matplotlib, the palette's source, is not."""
    from pagedlab.viz import palette

    page = files("pagedlab.viz").joinpath(TEMPLATE).read_text(encoding="utf-8")
    colours = {"__PALETTE__": _palette_css(palette), "__REQUEST_COLOURS__": json.dumps(list(palette._REQUEST_COLOURS))}
    return fill_markers(page, colours)


def fill_trace(template: str, trace: dict, title: str) -> str:
    """page_template()'s markers filled: the title (text positions only: <title> and <h1>) and the trace."""
    validate(trace)
    return fill_trace_text(template, dumps(trace), title)


def fill_trace_text(template: str, text: str, title: str) -> str:
    """fill_trace for a trace already written as JSON text (`dumps`) and known valid: the live lab's, which it
    also offers for download, so the text is made once."""
    return fill_markers(template, {"__TITLE__": html.escape(title), "__TRACE__": text.translate(_SCRIPT_SAFE)})


def fill_markers(template: str, values: dict[str, str]) -> str:
    """`template` with each marker (a key of `values`) replaced by its value, in one pass over the template.

    One pass, not a chain of str.replace: a value is never searched for markers itself, so a title or a prompt
    that reads "__TRACE__" stays that text, and the trace goes in only where the template asks for it.
    """
    missing = [marker for marker in values if marker not in template]
    if missing:
        raise InvariantError(f"the template lacks {missing}")
    markers = re.compile("|".join(map(re.escape, values)))
    return markers.sub(lambda found: values[found.group(0)], template)


def write_html(trace: dict, path, title: str = "pagedlab: step through a run") -> Path:
    """Write render_html(trace) to `path` (its folder made if needed); returns the path."""
    return _write(render_html(trace, title), path)


def render_compare_html(
    runs: list[tuple[str, dict]], title: str = "pagedlab: two runs side by side", found: list[dict] | None = None
) -> str:
    """Two (or more) runs' pages side by side under one slider: one engine step for all, the same colour for a
    request in every run (colours follow the request ids' order). Each run is its own page in a frame
    (`srcdoc`: still one file, no network); the shared controls call each page's window.pagedlab.goToStep.
    `found`: the divergences between the first two runs (viz/compare.py), listed under the controls, the first
    one highlighted, each a link to its step and to the ledger row that explains it (or "unexplained")."""
    if len(runs) < 2:
        raise ValueError(f"compare: expected at least two runs, got {len(runs)}")
    frames = "\n".join(
        f'<figure><figcaption data-run="{i}">{html.escape(label)} · <span class="frame-label"></span></figcaption>'
        f'<output class="frame-decisions" data-run="{i}"></output>'
        f'<iframe data-run="{i}" title="{html.escape(label)}" srcdoc="{html.escape(render_html(trace, label))}">'
        "</iframe></figure>"
        for i, (label, trace) in enumerate(runs)
    )
    last = max((t["steps"][-1]["step"] if t["steps"] else 0) for _, t in runs)
    notes = "" if found is None else _divergence_notes(found)
    values = {"__TITLE__": html.escape(title), "__FRAMES__": frames, "__LAST__": str(last), "__NOTES__": notes}
    return fill_markers(_COMPARE, values)


def _divergence_notes(found: list[dict]) -> str:
    """The divergences as a list (the first marked), then the ledger rows they cite, quoted with their chapter."""
    from pagedlab.viz.compare import LEDGER

    if not found:
        return '<section id="divergences" data-count="0"><p>Every step decided the same.</p></section>'
    items = []
    for i, d in enumerate(found):
        why = (f'<a href="#ledger-{d["ledger"]}">{html.escape(d["ledger"])}</a>' if d["ledger"] else
               '<span class="unexplained">unexplained</span>')  # fmt: skip
        after = "" if d["step"] == d["first"] else f" (follows from step {d['first']})"
        text = f"step {d['step']}: {d['field']}: pagedlab {d['ours']!r}, vLLM {d['vllm']!r}"
        items.append(f'<li class="{"first" if i == 0 else ""}" data-step="{d["step"]}" data-field="{d["field"]}" '
                     f'data-ledger="{d["ledger"] or ""}"><a href="#step={d["step"]}">{html.escape(text)}</a>'
                     f"{after} · {why}</li>")  # fmt: skip
    rows = [LEDGER[key] for key in dict.fromkeys(d["ledger"] for d in found if d["ledger"])]
    ledger = "".join(
        f'<p id="ledger-{r.key}" class="ledger">chapters/{r.chapter}, Differences from vLLM: '
        f"<q>{html.escape(r.pagedlab)}</q>: {html.escape(r.summary)}</p>"
        for r in rows
    )
    first = found[0]["step"]
    return (f'<section id="divergences" data-count="{len(found)}" data-first="{first}"><details open>'
            f"<summary>{len(found)} divergences; the first at step {first}</summary><ol>{''.join(items)}</ol>"
            f"{ledger}</details></section>")  # fmt: skip


def write_compare_html(runs: list[tuple[str, dict]], path, title: str = "pagedlab: two runs side by side") -> Path:
    return _write(render_compare_html(runs, title), path)


def step_through(llm_or_trace, compare=None, height: int = 1050):
    """The step-through page inline in a notebook: an IPython HTML object holding the page in a frame.

    `llm_or_trace`: an LLM run with record_trace=True (or its viz.trace dict); `compare`: another one, shown
    side by side under one slider, or "vllm": the same run through vLLM's own scheduler (`pagedlab fetch vllm`).
    The page travels inside the notebook's output (no kernel round-trip to scrub), so it also works in a static
    notebook viewer and in exported HTML.
    """
    from IPython.display import HTML

    def as_trace(x) -> dict:
        return x if isinstance(x, dict) else to_trace(x)

    first = as_trace(llm_or_trace)
    if compare is None:
        page = render_html(first)
    elif compare == "vllm":
        page = render_vllm_compare_html(first)
    else:
        second = as_trace(compare)
        page = render_compare_html([(_run_label(first), first), (_run_label(second), second)])
    frame = f'<iframe srcdoc="{html.escape(page)}" style="width:100%;height:{height}px;border:0"></iframe>'
    return HTML(f'<div class="pagedlab-step-through">{frame}</div>')  # a bare <iframe> makes IPython warn


def render_vllm_compare_html(trace: dict, title: str | None = None) -> str:
    """`trace` beside the same run through vLLM 0.33.0's Scheduler (viz/compare.py), with their divergences."""
    from pagedlab.lessons.vllm_peer import vllm_trace
    from pagedlab.viz.compare import VLLM_LABEL, divergences

    theirs = vllm_trace(trace)
    title = title or f"pagedlab's {_run_label(trace)} and {VLLM_LABEL}, on the same requests"
    runs = [(f"pagedlab: {_run_label(trace)}", trace), (VLLM_LABEL, theirs)]
    return render_compare_html(runs, title, found=divergences(trace, theirs))


def _run_label(trace: dict) -> str:
    c = trace["config"]
    mode = f", {c['preemption_mode']}" if trace["stage"] >= 5 else ""
    return f"stage {trace['stage']} ({trace['stage_name']}{mode})"


def _write(page: str, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


_COMPARE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 12px; }
  #controls { display: flex; gap: 8px; align-items: center; margin: 8px 0; }
  #slider { flex: 1; }
  .runs { display: flex; flex-wrap: wrap; gap: 12px; }
  figure { flex: 1 1 640px; margin: 0; }
  figcaption { font-weight: 600; margin-bottom: 4px; }
  iframe { width: 100%; height: 1000px; border: 1px solid #ccc; }
  #divergences li.first { background: #fff3b0; font-weight: 600; }
  #divergences li.here { outline: 2px solid #e69f00; }
  .unexplained { color: #b00020; font-weight: 600; }
  .frame-decisions { display: none; }
</style></head>
<body>
<h1>__TITLE__</h1>
<div id="controls"><button id="prev">◀</button><button id="play">play</button><button id="next">▶</button>
<input type="range" id="slider" min="1" max="__LAST__" value="1"><span id="step-label"></span></div>
__NOTES__
<div class="runs">
__FRAMES__
</div>
<script>
"use strict";
(function () {
  const LAST = __LAST__;
  const frames = [...document.querySelectorAll("iframe")];
  let step = 1, timer = null, ready = 0;
  const $ = (id) => document.getElementById(id);
  function show(n) {
    step = Math.max(1, Math.min(LAST, n | 0));
    $("slider").value = String(step);
    $("step-label").textContent = `step ${step} of ${LAST}`;
    document.body.dataset.step = String(step);
    for (const f of frames) {
      const page = f.contentWindow && f.contentWindow.pagedlab;
      if (!page) continue;
      page.goToStep(step);  /* a run that ended earlier stays on its last step */
      const caption = document.querySelector(`figcaption[data-run="${f.dataset.run}"] .frame-label`);
      caption.textContent = page.label();
      /* what this run decided at the step shown, readable from outside the frame (tests, a reader's console) */
      const out = document.querySelector(`output.frame-decisions[data-run="${f.dataset.run}"]`);
      if (out && page.decisions) out.textContent = JSON.stringify(page.decisions());
    }
    for (const li of document.querySelectorAll("#divergences li"))
      li.classList.toggle("here", li.dataset.step === String(step));
    history.replaceState(null, "", `#step=${step}`);
  }
  function play() {
    if (timer) { clearInterval(timer); timer = null; $("play").textContent = "play"; return; }
    if (step >= LAST) show(1);
    $("play").textContent = "pause";
    timer = setInterval(() => { if (step >= LAST) play(); else show(step + 1); }, 600);
  }
  const KEYS = {ArrowLeft: () => show(step - 1), ArrowRight: () => show(step + 1), Home: () => show(1),
                End: () => show(LAST), " ": play};
  document.addEventListener("keydown", (e) => {
    const action = KEYS[e.key];
    if (!action || e.altKey || e.ctrlKey || e.metaKey) return;
    e.preventDefault();
    action();
  });
  $("prev").addEventListener("click", () => show(step - 1));
  $("next").addEventListener("click", () => show(step + 1));
  $("play").addEventListener("click", play);
  $("slider").addEventListener("input", (e) => show(parseInt(e.target.value, 10)));
  window.addEventListener("hashchange", () => {
    const n = parseInt(new URLSearchParams(location.hash.slice(1)).get("step"), 10);
    if (Number.isFinite(n) && n !== step) show(n);
  });
  /* #step=N opens at step N; keys=right,left,... presses those keys through the same handler (tests). */
  function start() {
    const params = new URLSearchParams(location.hash.slice(1));
    const n = parseInt(params.get("step"), 10);
    show(Number.isFinite(n) ? n : 1);
    const names = {left: "ArrowLeft", right: "ArrowRight", home: "Home", end: "End"};
    for (const k of (params.get("keys") || "").split(",").filter(Boolean))
      if (names[k]) document.dispatchEvent(new KeyboardEvent("keydown", {key: names[k], bubbles: true}));
  }
  for (const f of frames) f.addEventListener("load", () => { if (++ready === frames.length) start(); });
})();
</script>
</body></html>
"""


# Characters that could end or reinterpret a <script> element ("</script>", "<!--", "]]>"), or that some
# JavaScript parsers take for line ends, as JSON escapes. In the trace's JSON they occur only inside strings
# (its syntax uses none of them), where "\u003c" is the same string as "<": JSON.parse reads the trace back.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def embed_json(trace: dict) -> str:
    """The trace as JSON text to put inside <script type="application/json">: no markup can end it early."""
    return dumps(trace).translate(_SCRIPT_SAFE)  # fill_trace_text does the same


def _palette_css(palette) -> str:
    """The one palette as CSS variables (--free, --used, ...), so the page's colours are the figures' colours."""
    names = {"free": palette.FREE, "used": palette.USED, "shared": palette.SHARED, "cached": palette.CACHED,
             "prefill": palette.PREFILL, "decode": palette.DECODE, "waiting": palette.WAITING,
             "preempted": palette.PREEMPTED, "swapped": palette.SWAPPED, "held": HELD}  # fmt: skip
    return "\n".join(f"  --{name}: {colour};" for name, colour in names.items())
