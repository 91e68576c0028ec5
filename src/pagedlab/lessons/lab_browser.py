"""Stage 2: what the live lab's page calls in Pyodide: a run's page and trace, and prediction questions on it.

Builds on: lessons/lab.py (LabOptions, LabRun), viz/page.py (fill_trace_text: the step-through page), viz/trace.py,
lessons/predict.py (the notebooks' questions, asked here about the lab's engine).
Read with: chapters/05-continuous-batching.md (The live lab).

Every function takes the knobs as the page's fragment and returns JSON text (the page is JavaScript): a bad knob is
{"error": "field: why"}, shown under the knobs, never a traceback. Two things are kept between calls: the
step-through template the page hands over once (`set_template`), and the last run's page and trace, big strings
fetched apart (`page`, `trace_text`) so that they are not escaped into more JSON. A question is asked of a run
replayed to its step, which is cheap and always the same run.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json

from pagedlab.lessons import predict
from pagedlab.lessons.lab import LabOptions, LabRun, run_lab
from pagedlab.viz.page import fill_trace_text
from pagedlab.viz.trace import TRACE_LIMIT, dumps, from_json

_TEMPLATE: list[str] = []  # the step-through page, colours filled (viz/page.py page_template), once set
_LAST: dict[str, str] = {}  # the last run's "page" and "trace" (JSON text)


def set_template(text: str) -> None:
    _TEMPLATE[:] = [text]


def run(fragment: str) -> str:
    """{"fragment": the knobs as written back, "steps": the run's last step} or {"error": ...}; the run's page and
    trace wait in `page()` and `trace_text()` (big strings: handed over as they are, not inside more JSON)."""
    try:
        options = LabOptions.from_fragment(fragment)
        trace = run_lab(options)
    except ValueError as e:
        return json.dumps({"error": str(e)})
    title = f"pagedlab lab: stage {trace['stage']} ({trace['stage_name']}), {options.num_requests} requests"
    _LAST["trace"] = dumps(trace)
    _LAST["page"] = fill_trace_text(_TEMPLATE[0], _LAST["trace"], title) if _TEMPLATE else ""
    last = trace["steps"][-1]["step"] if trace["steps"] else 0
    return json.dumps({"fragment": options.fragment(), "steps": last})


def page() -> str:
    return _LAST.get("page", "")


def trace_text() -> str:
    return _LAST.get("trace", "")


def show(text: str) -> str:
    """A trace from a file (`pagedlab trace --json`'s, or one the page downloaded): {"steps"} or {"error"}; its
    page and text wait in `page()` and `trace_text()`, as a run's."""
    try:
        if len(text) > TRACE_LIMIT:
            raise ValueError(f"{len(text)} characters, more than a trace may hold ({TRACE_LIMIT})")
        trace = from_json(text)
    except ValueError as e:
        return json.dumps({"error": f"trace: {e}"})
    title = "pagedlab: a trace from a file"
    _LAST["trace"], _LAST["page"] = text, fill_trace_text(_TEMPLATE[0], text, title)  # from_json validated it
    return json.dumps({"steps": trace["steps"][-1]["step"] if trace["steps"] else 0})


# --- predictions ---------------------------------------------------------------------------------------


def question(fragment: str, step: int) -> str:
    """A question about step `step` + 1, asked after `step` steps: {"name", "text", "kind"} or {"none": why}."""
    try:
        options = LabOptions.from_fragment(fragment)
        if options.layer_pattern:  # predict.py's questions read one block table per request
            return json.dumps({"none": "the questions ask about one block table per request, and a hybrid model "
                                       "keeps one per KV cache group: empty layer_pattern to be asked"})  # fmt: skip
        engine = LabRun(options).run_to(step).engine
    except ValueError as e:
        return json.dumps({"error": str(e)})
    if engine.stats.num_steps < step or not engine.has_unfinished_requests():
        return json.dumps({"none": "the run has ended"})
    name, given = pick(engine, step)
    q = predict.pose(name, engine, **given)
    return json.dumps({"name": name, "given": given, "text": q.text, "kind": q.prediction.kind})


def judge(fragment: str, step: int, name: str, given: str, guess: str) -> str:
    """The verdict on `guess` (the learner's text) for question `name` at `step`, asked with `given` (JSON text, as
    `question` returned it): {"verdict", "message"}."""
    engine = LabRun(LabOptions.from_fragment(fragment)).run_to(step).engine
    q = predict.pose(name, engine, **json.loads(given))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        verdict = q.answer(parse_guess(q.prediction.kind, guess))
    return json.dumps({"verdict": verdict, "message": out.getvalue().strip()})


def pick(engine, step: int) -> tuple[str, dict]:
    """A question that says something about this step: those that apply, taken in turn as the steps go by."""
    scheduler, out = predict.ahead(engine)
    stage, running = engine.config.stage, list(engine.scheduler.running)
    admitted = [r for r in scheduler.running if r.request_id not in {x.request_id for x in running}]
    ending = [r for r in out.scheduled if predict.samples_its_last(r, out)]
    found = []
    if stage == 5 and out.preempted_req_ids:
        found.append(("05-victim", {}))
    if stage >= 3 and out.block_copies:
        found.append(("03-copies-step3", {}))
    if ending and stage < 4:
        found.append(("02-free-after-finish", {"rid": ending[0].request_id}))
    if admitted:
        found.append(("05-first-fed", {"rid": admitted[0].request_id}) if stage == 5 else
                     ("02-E-table", {"rid": admitted[0].request_id}))  # fmt: skip
    if engine.scheduler.waiting:
        found.append(("05-next-admitted" if stage == 5 else "02-admitted", {}))
    if stage >= 4 and engine.config.enable_prefix_caching and predict.answer("04-cached-free", engine):
        found.append(("04-cached-free", {}))
    fed = out.num_scheduled_tokens  # request id -> tokens (out's requests are the lookahead's copies)
    decoding = [r for r in running if r.num_computed_tokens >= r.num_prompt_tokens and r.request_id in fed]
    if decoding:
        found += [("02-next-block", {"rid": decoding[0].request_id}), ("02-next-slot", {"rid": decoding[0].request_id})]
    return found[step % len(found)] if found else ("02-admitted", {})


def parse_guess(kind: str, text: str):
    """The learner's text as the question's kind: "3" for an int; "3, 5" or "{'3', '5'}" or "" for a set of ids;
    "[4, 7]" or "4 7" for a list. What cannot be read stays text (and is judged wrong)."""
    text = text.strip()
    if kind == "set":
        if text in ("", "set()", "{}"):
            return set()
        return {part.strip(" '\"") for part in text.strip("{}[]()").replace(",", " ").split()}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        parts = text.strip("[]").replace(",", " ").split()
        return [int(p) for p in parts] if parts and all(p.lstrip("-").isdigit() for p in parts) else text
    return list(value) if isinstance(value, tuple) else value
