"""The prediction points of notebooks 02 to 05 (lessons/predict.py): their truths agree with what the engine then
did, a right guess is told so, a wrong one gets a hint without the answer, and `...` asks for an answer.

Each notebook's code runs here, up to the cell after its last check; every `check(...)` cell records the state it
was given. The truth, computed then, is compared with the trace of the steps that followed.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import nbformat
import pytest

from pagedlab.lessons import predict
from pagedlab.lessons.predict import BY_NAME, PREDICTIONS

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[2]
# None where the notebook is absent (a student workspace of `pagedlab assignment make`): collection must not fail
# there, since the grader runs `-m stageN` over every test file and these tests are deselected.
NOTEBOOKS = {n: next(ROOT.glob(f"notebooks/{n}_*.ipynb"), None) for n in PREDICTIONS}
CHECK = re.compile(r"""check\(\s*["']([\w-]+)["']\s*,\s*(\w+)\s*,\s*(\w+)\s*\)""")


def _cells(number: str) -> list:
    return nbformat.read(NOTEBOOKS[number], as_version=4).cells


def _run(number: str) -> tuple[dict, list]:
    """Run the notebook's code to the cell after its last check; returns (namespace, checkpoints), where a
    checkpoint is (name, state, the truth then, the index of the next step, the verdicts then)."""
    code = [c.source for c in _cells(number) if c.cell_type == "code"]
    last = max(i for i, src in enumerate(code) if CHECK.search(src))
    points: list = []
    ns: dict = {}

    def recording_check(name, guess, state):
        # k: the index of the next step, in the trace (or, for the beams' engine, in its SchedulerOutputs)
        k = len(ns["beam_outputs"]) if state is ns.get("beams") else len(state.engine.trace)
        truth = predict.answer(name, state)
        judged = {"...": predict.verdict(name, ..., state), "none": predict.verdict(name, None, state)}
        judged |= {"truth": predict.verdict(name, truth, state), "wrong": predict.verdict(name, _wrong(truth), state)}
        points.append((name, state, truth, k, judged))

    for src in code[: last + 2]:
        exec(compile(src, str(NOTEBOOKS[number]), "exec"), ns)
        ns["check"] = recording_check  # after the import cell has defined the real one
    return ns, points


def _running_before(trace, k) -> set:
    return set(trace[k - 1].running) if k else set()


def _slot_of_last(t, rid: str, block_size: int) -> int:
    pos = t.kv_used[rid] - 1  # the position of the token fed this step
    return t.block_tables[rid][pos // block_size] * block_size + pos % block_size


def _first_step(trace, rid: str):
    return next(t for t in trace if rid in t.scheduled)


def _beam_gained(ns, k) -> set:
    so = ns["beam_outputs"][k]
    return {b for ids in so.new_block_ids.values() for b in ids} | {c.dst for c in so.block_copies}


# name -> (namespace, trace, k: the index of the step after the check) -> what the trace says
OBSERVED = {
    "02-admitted": lambda ns, tr, k: set(tr[k].running) - _running_before(tr, k),
    "02-next-block": lambda ns, tr, k: _slot_of_last(tr[k], "B", 4) // 4,
    "02-free-after-finish": lambda ns, tr, k: (  # nothing is cached at stage 2: freed blocks go to the head
        [b for rid in tr[k].finished for b in reversed(tr[k].block_tables[rid])] + list(tr[k].free_queue)
    ),
    "02-E-table": lambda ns, tr, k: tr[k].block_tables["E"],
    "02-next-slot": lambda ns, tr, k: _slot_of_last(tr[k], "E", 4),
    "03-leader-feeds": lambda ns, tr, k: tr[k].scheduled["0_A"],
    "03-copies-step2": lambda ns, tr, k: len(tr[k].copies),
    "03-shared-after-step2": lambda ns, tr, k: set.intersection(*(set(t) for t in tr[k].block_tables.values())),
    "03-copies-step3": lambda ns, tr, k: len(tr[k].copies),
    "03-beam-new-blocks": lambda ns, tr, k: _beam_gained(ns, k),
    "03-last-block-slots": lambda ns, tr, k: tr[k - 1].kv_used["0_A"] % 4 or 4,
    "04-B-hits": lambda ns, tr, k: tr[k].num_prompt_tokens["B"] - tr[k].scheduled["B"],
    "04-B-table": lambda ns, tr, k: tr[k].block_tables["B"],
    "04-C-lookup": lambda ns, tr, k: _first_step(tr, "C").num_prompt_tokens["C"] - _first_step(tr, "C").scheduled["C"],
    "04-cached-free": lambda ns, tr, k: {
        b for b, h in enumerate(tr[k - 1].block_hashes) if h is not None and tr[k - 1].ref_cnts[b] == 0
    },
    "04-E-hits": lambda ns, tr, k: _first_step(tr, "E").num_prompt_tokens["E"] - _first_step(tr, "E").scheduled["E"],
    "05-step1-fed": lambda ns, tr, k: tr[k].scheduled["2"],
    "05-step2-admitted": lambda ns, tr, k: set(tr[k].running) - _running_before(tr, k),
    "05-preempted-step10": lambda ns, tr, k: set(tr[k].preempted),
    "05-admitted-step10": lambda ns, tr, k: len(set(tr[k].running) - _running_before(tr, k)),
    "05-step11-admitted": lambda ns, tr, k: set(tr[k].running) - _running_before(tr, k),
}


def test_every_prediction_has_an_observation():
    assert set(OBSERVED) == set(BY_NAME)


@pytest.fixture(scope="module", params=sorted(PREDICTIONS))
def notebook_run(request):
    return request.param, *_run(request.param)


def test_each_notebook_checks_every_prediction_of_its_group(notebook_run):
    number, _, points = notebook_run
    names = [name for name, *_ in points]
    assert len(names) >= 5 and len(set(names)) == len(names)
    assert set(names) == {p.name for p in PREDICTIONS[number]}


def test_truth_agrees_with_the_trace(notebook_run):
    number, ns, points = notebook_run
    for name, _, truth, k, _ in points:
        assert truth == OBSERVED[name](ns, ns["engine"].trace, k), name


def test_right_wrong_and_placeholder(notebook_run):
    _, _, points = notebook_run
    for name, _, truth, _, judged in points:
        assert judged["..."] == judged["none"] == ("missing", predict.PLACEHOLDER), name
        assert judged["truth"][0] == "right" and judged["truth"][1].startswith("✓ right: "), name
        kind, message = judged["wrong"]
        assert kind == "wrong" and message.startswith("✗ not quite: "), name
        assert message != "✗ not quite: " + predict.NO_HINT, name  # some sentence of the hint survived
        for word in predict._words(truth):
            assert not re.search(rf"(?<!\w){re.escape(word)}(?!\w)", message), (name, message)


def test_check_prints_and_never_raises(capsys):
    ns, points = _run("02")
    llm = points[0][1]
    predict.check("02-admitted", ..., llm)
    assert "write your answer" in capsys.readouterr().out
    predict.check("02-next-block", 8, llm)  # the notebook has run on: B is gone
    assert predict.STALE in capsys.readouterr().out


def _wrong(truth):
    if isinstance(truth, set):
        return truth | {"nobody"}
    if isinstance(truth, list):
        return [*truth, -1]
    return truth + 1


@pytest.mark.parametrize("number", sorted(PREDICTIONS))
def test_no_answer_before_its_check(number):
    """No cell names the teacher's answer, and no check cell holds anything but the placeholder."""
    cells = _cells(number)
    sources = [c.source for c in cells]
    assert not any("answer(" in s or "verdict(" in s or "hint(" in s for s in sources)
    checks = [s for s in sources if CHECK.search(s)]
    assert len(checks) >= 5
    for s in checks:
        name = CHECK.search(s).group(1)
        assert name in BY_NAME and name.startswith(number)
        assert re.search(r"^guess = \.\.\.  # your answer", s, re.M), s


def test_every_prediction_is_documented_for_teachers():
    text = (Path(__file__).parents[2] / "chapters" / "98-assignments.md").read_text()
    for name in BY_NAME:
        assert f"`{name}`" in text, name
