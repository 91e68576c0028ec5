"""The prediction points of notebooks 02 to 05 (lessons/predict.py): asked first, answered, then revealed.

Each notebook's walk-through runs here in-process (its cells up to its experiments), with `ask` wrapped to record
every question: its truth, computed when asked, must be what the engine then did (read back from the trace); a
right answer is told so, a wrong one gets a hint without the answer, `...` asks for one; an answer given again
after the engine moved is judged the same; what the walk-through prints after a question stays hidden until it is
answered. Then the same walk-throughs with two other settings of their knobs, and the rule that reading the
chapter first gives no answer away.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import matplotlib
import nbformat
import pytest

from pagedlab.lessons import notebook, predict
from pagedlab.lessons.predict import BY_NAME, PREDICTIONS

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]
# None where the notebook is absent (a student workspace of `pagedlab assignment make`): collection must not fail
# there, since the grader runs `-m stageN` over every test file and these tests are deselected.
NOTEBOOKS = {n: next(ROOT.glob(f"notebooks/{n}_*.ipynb"), None) for n in (*PREDICTIONS, "06")}
CHAPTERS = {n: next(ROOT.glob(f"chapters/{n}-*.md"), None) for n in PREDICTIONS}
OTHER_KNOBS = {  # two other settings per notebook, each run through the walk-through and the your-turn cell
    "02": [{"block_size": 8, "num_kv_blocks": 8}, {"block_size": 2, "num_kv_blocks": 30, "max_num_seqs": 3}],
    "03": [{"block_size": 8, "n": 2}, {"block_size": 2, "num_kv_blocks": 40, "n": 4, "beam_width": 3}],
    "04": [{"block_size": 8, "num_kv_blocks": 8}, {"block_size": 2, "num_kv_blocks": 24}],
    "05": [
        {"block_size": 8, "num_kv_blocks": 14},
        {"num_kv_blocks": 40, "max_num_batched_tokens": 32, "long_prefill_token_threshold": 0},
    ],  # fmt: skip
    "06": [{"block_size": 4, "seq_lens": [20, 3]}, {"partition_size": 32, "num_heads": 8, "num_kv_heads": 1}],
}


def _code(number: str) -> list[str]:
    return [c.source for c in nbformat.read(NOTEBOOKS[number], as_version=4).cells if c.cell_type == "code"]


def walk_through(number: str) -> list[str]:
    """The notebook's code cells before its first experiment (the questions are all in there)."""
    cells = nbformat.read(NOTEBOOKS[number], as_version=4).cells
    end = next((i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Experiment")),
               len(cells))  # fmt: skip
    return [c.source for c in cells[:end] if c.cell_type == "code"]


def run_cells(number: str, sources: list[str], monkeypatch=None) -> tuple[dict, list, list[str]]:
    """Execute cells in one namespace, as the notebook would: (namespace, the questions asked, each cell's output).
    A question is (name, state, Question, the index of the next step in its engine's trace, what was given)."""
    asked, outputs, ns = [], [], {"display": lambda *a, **k: None}

    def recording_ask(name, state, **given):
        question = predict.ask(name, state, **given)
        engine = getattr(state, "engine", state)  # the beams' engine keeps no trace: its SchedulerOutputs count
        k = len(ns["beam_outputs"]) if state is ns.get("beams") else len(engine.trace)
        asked.append((name, state, question, k, given))
        return question

    predict._ASKED.clear()
    for src in sources:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(src, str(NOTEBOOKS[number]), "exec"), ns)
        ns["ask"] = recording_ask  # after the import cell has defined the real one
        outputs.append(out.getvalue())
        matplotlib.pyplot.close("all")
    return ns, asked, outputs


def _running_before(trace, k) -> set:
    return set(trace[k - 1].running) if k else set()


def _slot_of_last(t, rid: str, block_size: int) -> int:
    pos = t.kv_used[rid] - 1  # the position of the token fed this step
    return t.block_tables[rid][pos // block_size] * block_size + pos % block_size


def _first_step(trace, rid: str):
    return next(t for t in trace if rid in t.scheduled)


def _hits(trace, rid: str) -> int:
    first = _first_step(trace, rid)
    return first.num_prompt_tokens[rid] - first.scheduled[rid]


def _beam_gained(ns, k) -> set:
    so = ns["beam_outputs"][k]
    return {b for ids in so.new_block_ids.values() for b in ids} | {c.dst for c in so.block_copies}


def _bs(ns) -> int:
    return ns["K"]["block_size"]


# name -> (namespace, trace, k: the index of the next step, what the question was given) -> what the trace says
OBSERVED = {
    "02-admitted": lambda ns, tr, k, g: set(tr[k].running) - _running_before(tr, k),
    "02-next-block": lambda ns, tr, k, g: _slot_of_last(tr[k], g["rid"], _bs(ns)) // _bs(ns),
    "02-free-after-finish": lambda ns, tr, k, g: (  # nothing is cached at stage 2: freed blocks go to the head
        [b for rid in tr[k].finished for b in reversed(tr[k].block_tables[rid])] + list(tr[k].free_queue)
    ),
    "02-E-table": lambda ns, tr, k, g: tr[k].block_tables[g["rid"]],
    "02-next-slot": lambda ns, tr, k, g: _slot_of_last(tr[k], g["rid"], _bs(ns)),
    "03-leader-feeds": lambda ns, tr, k, g: tr[k].scheduled[g["rid"]],
    "03-copies-step2": lambda ns, tr, k, g: len(tr[k].copies),
    "03-shared-after-step2": lambda ns, tr, k, g: set.intersection(*(set(t) for t in tr[k].block_tables.values())),
    "03-copies-step3": lambda ns, tr, k, g: len(tr[k].copies),
    "03-beam-new-blocks": lambda ns, tr, k, g: _beam_gained(ns, k),
    "03-last-block-slots": lambda ns, tr, k, g: tr[k - 1].kv_used[g["rid"]] % _bs(ns) or _bs(ns),
    "04-B-hits": lambda ns, tr, k, g: _hits(tr, "B"),
    "04-B-table": lambda ns, tr, k, g: tr[k].block_tables["B"],
    "04-C-lookup": lambda ns, tr, k, g: _hits(tr, "C"),
    "04-cached-free": lambda ns, tr, k, g: {
        b for b, h in enumerate(tr[k - 1].block_hashes) if h is not None and tr[k - 1].ref_cnts[b] == 0
    },
    "04-E-hits": lambda ns, tr, k, g: _hits(tr, "E"),
    "05-first-fed": lambda ns, tr, k, g: tr[k].scheduled[g["rid"]],
    "05-next-admitted": lambda ns, tr, k, g: set(tr[k].running) - _running_before(tr, k),
    "05-victim": lambda ns, tr, k, g: set(tr[k].preempted),
    "05-admitted-when-preempting": lambda ns, tr, k, g: len(set(tr[k].running) - _running_before(tr, k)),
    "05-admitted-after": lambda ns, tr, k, g: set(tr[k].running) - _running_before(tr, k),
}


def test_every_prediction_has_an_observation():
    assert set(OBSERVED) == set(BY_NAME)


@pytest.fixture(scope="module", params=sorted(PREDICTIONS))
def notebook_run(request):
    return request.param, *run_cells(request.param, walk_through(request.param))


def test_each_notebook_asks_every_prediction_of_its_group(notebook_run):
    number, _, asked, _ = notebook_run
    names = [name for name, *_ in asked]
    assert len(names) >= 5 and len(set(names)) == len(names)
    assert set(names) == {p.name for p in PREDICTIONS[number]}


def test_each_truth_is_what_the_engine_then_did(notebook_run):
    number, ns, asked, _ = notebook_run
    for name, state, question, k, given in asked:
        engine = getattr(state, "engine", state)
        assert question.truth == OBSERVED[name](ns, engine.trace, k, given), name


def test_nothing_below_a_question_shows_its_answer_before_it_is_answered(notebook_run):
    """The walk-through ran with no answers: every cell printed after a question, until the next question, must
    not hold its answer (a list or a set, written as Python writes it) and must say it is hidden."""
    number, _, asked, outputs = notebook_run
    sources = walk_through(number)
    starts = [i for i, src in enumerate(sources) if "ask(" in src]
    hidden = 0
    for (name, _, question, _, _), start in zip(asked, starts):
        end = next((i for i in starts if i > start), len(sources))
        printed = "".join(outputs[start + 1 : end])
        hidden += predict.HIDDEN.format(name=name) in printed
        if isinstance(question.truth, list | set):
            for text in predict._words(question.truth) + [repr(question.truth)]:
                assert text not in printed, (name, text)
    assert hidden >= len(asked) - 2  # the step that answers a question shows itself only once it is answered


def test_right_wrong_placeholder_and_a_second_answer_after_the_engine_moved(notebook_run, capsys):
    _, ns, asked, _ = notebook_run
    for name, _, question, _, _ in asked:
        assert question.answer(...) == "missing" and not question.answered
        assert predict.PLACEHOLDER in capsys.readouterr().out
        assert question.answer(predict.wrong_answer(question.truth)) == "wrong"
        said = capsys.readouterr().out
        assert said.startswith(f"{name}: ✗ not quite (you said ") and "the engine:" in said
        hint = said.split("): ", 1)[1].split("\n")[0]
        assert hint and hint != predict.NO_HINT, name  # some sentence of the hint survived
        for word in predict._words(question.truth):
            assert not re.search(rf"(?<!\w){re.escape(word)}(?!\w)", hint), (name, hint)
        # the notebook has run on since: the question keeps the state it asked about
        assert question.answer(question.truth) == "right" and question.verdicts == ["wrong", "right"]
        assert capsys.readouterr().out.startswith(f"{name}: ✓ right\n   the engine: ")


def test_a_question_asked_again_is_the_same_until_the_engine_moves(capsys):
    from pagedlab import LLM

    llm = LLM(stage="paged", block_size=4, num_kv_blocks=12)
    llm.engine.add_request("A", "MIRANDA:", notebook.greedy(3))
    q = predict.ask("02-admitted", llm)
    assert predict.ask("02-admitted", llm) is q  # a re-run of the cell
    q.answer({"A"})
    llm.engine.step()
    again = predict.ask("02-admitted", llm)
    assert again is not q and again.truth == set() and q.truth == {"A"}
    assert q.answer({"A"}) == "right"  # still judged against the state it asked about


def test_hidden_output_and_drawings_wait_for_the_answer(capsys):
    import matplotlib.pyplot as plt

    from pagedlab import LLM

    llm = LLM(stage="paged", block_size=4, num_kv_blocks=12)
    llm.engine.add_request("A", "MIRANDA:", notebook.greedy(3))
    q = predict.ask("02-admitted", llm)
    capsys.readouterr()
    with q.hidden():
        print("the state")
        plt.figure()
    assert capsys.readouterr().out == predict.HIDDEN.format(name="02-admitted") + "\n" and not plt.get_fignums()
    q.answer({"A"})
    capsys.readouterr()
    with q.hidden():
        print("the state")
        plt.figure()
    assert capsys.readouterr().out == "the state\n" and len(plt.get_fignums()) == 1


def test_ci_supplies_answers_through_the_environment(monkeypatch, tmp_path, capsys):
    from pagedlab import LLM

    llm = LLM(stage="paged", block_size=4, num_kv_blocks=12)
    llm.engine.add_request("A", "MIRANDA:", notebook.greedy(3))
    q = predict.ask("02-admitted", llm)
    monkeypatch.setenv("PAGEDLAB_ANSWERS", "right")
    assert q.answer(...) == "right"
    monkeypatch.setenv("PAGEDLAB_ANSWERS", "wrong")
    assert q.answer(...) == "wrong"
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"02-admitted": ["A"]}))
    monkeypatch.setenv("PAGEDLAB_ANSWERS", str(answers))
    assert q.answer(...) == "right"


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
@pytest.mark.parametrize("setting", [0, 1])
def test_the_walk_through_and_your_turn_hold_for_other_knobs(number, setting, monkeypatch):
    """Every walk-through cell computes what it says from the engine, so other knobs change the numbers and break
    nothing (the questions answered right, so that every hidden cell runs its drawing too)."""
    monkeypatch.setenv(notebook.KNOBS_VARIABLE, json.dumps({number: OTHER_KNOBS[number][setting]}))
    monkeypatch.setenv("PAGEDLAB_ANSWERS", "right")
    code = _code(number)
    if number == "06":  # the kernel walk-through is fixed cases; its knobs are its your-turn cell's
        code = code[:2] + code[-1:]
    ns, asked, outputs = run_cells(number, walk_through(number) if number != "06" else code)
    if number != "06":
        ns2, _, turn = run_cells(number, [code[0], code[-1]])  # the your-turn cell, on its own knobs
        assert turn[-1].strip()
    assert all(q.verdicts and set(q.verdicts) == {"right"} for _, _, q, _, _ in asked)
    assert "knobs: " in "".join(outputs)


@pytest.mark.parametrize("number", sorted(PREDICTIONS))
def test_reading_the_chapter_first_gives_no_answer_away(number, notebook_run):
    """The notebook asks about its own requests (lessons/notebook.py: The Tempest's speakers), never the ones its
    chapter walks through (lessons/stage*.py); and no answer that is a list or a set appears in the chapter as
    Python writes it (three or more of them: [0, 1] is in any chapter about blocks)."""
    from pagedlab import lessons

    walked = {*lessons.STAGE1_PROMPTS, "ROMEO:", lessons.BEAM_PROMPT, *lessons.STAGE4_PROMPTS.values(),
              lessons.STAGE4_PREFIX, *lessons.STAGE5_PROMPTS}  # fmt: skip
    ours = {
        "02": [p for p, _ in notebook.NB02_REQUESTS.values()],
        "03": [notebook.NB03_PROMPT, notebook.NB03_BEAM_PROMPT],
        "04": [notebook.NB04_PREFIX + s for s in notebook.NB04_SUFFIXES.values()],
        "05": list(notebook.NB05_PROMPTS),
    }[number]
    assert not set(ours) & walked
    text = CHAPTERS[number].read_text(encoding="utf-8")
    run_number, _, asked, _ = notebook_run
    if run_number == number:
        for name, _, question, _, _ in asked:
            if isinstance(question.truth, list | set) and len(question.truth) > 2:  # [0, 1] is any chapter's
                for words in predict._words(question.truth):
                    assert words not in text, (name, words)


def test_every_prediction_is_documented_for_teachers():
    text = (ROOT / "chapters" / "98-assignments.md").read_text()
    for name in BY_NAME:
        assert f"`{name}`" in text, name


@pytest.mark.parametrize("number", sorted(PREDICTIONS))
def test_the_walk_through_s_prose_quotes_no_value_of_its_run(number):
    """Values of the run (block ids, counts, budgets left) are printed by the cells, never written in the prose
    around them: change a knob and the prose stays true. What prose may say: a step, a stage or a chapter by its
    number, and the small numbers of definitions (ref_cnt 0, 1 or 2, n > 1); anything in backticks is code."""
    cells = nbformat.read(NOTEBOOKS[number], as_version=4).cells
    end = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Experiment"))
    allowed = re.compile(r"(?i)(step|stage|chapter|notebook)[ -]\d+|^[0-2]$|1e-4")
    for cell in cells[1:end]:  # after the title
        if cell.cell_type != "markdown":
            continue
        prose = re.sub(r"`[^`]*`|\]\([^)]*\)|SHA-256|(?i:steps? \d+ and \d+)", "", cell.source)
        for match in re.finditer(r"(?i)(?:(?:step|stage|chapter|notebook)[ -])?\d[\d.e-]*", prose):
            word = match.group().rstrip(".")
            assert allowed.search(word), (number, word, cell.source[:80])
