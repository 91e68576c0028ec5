"""The scenarios that grade each task: they exist for every task, are the same in every process, catch a wrong
body, run the other tasks they say they build on, and compare as the report says (course/scenarios/, compare.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pagedlab
from pagedlab.course import grading, regions
from pagedlab.course.compare import first_difference
from pagedlab.course.scenarios import run_case, stage_scenarios
from pagedlab.stages import STAGES
from tests.course.mutants import MUTANTS

SRC = Path(pagedlab.__file__).parent
POOL_STAGES = (1, 2, 3, 4, 5)  # pure Python (stage 6's kernels are checked through grading in test_assignment)


def observations(stage: int, seed: int, tasks=None) -> dict:
    return {task: {name: grading.as_json(run_case(s, name, seed)) for name in s.case_names()}
            for task, s in stage_scenarios(stage).items() if tasks is None or task in tasks}  # fmt: skip


def test_every_task_has_fixed_and_seeded_cases_and_builds_only_on_its_stage():
    for stage in STAGES:
        ids = {r.task_id for r in regions.stage_regions(SRC.parents[1], stage)}
        found = stage_scenarios(stage)
        assert set(found) == ids, stage
        for s in found.values():
            assert s.fixed and s.num_seeded >= 3 and set(s.builds_on) <= ids - {s.task}, s.task
            assert len(set(s.case_names())) == len(s.case_names())


def test_the_reference_observes_the_same_in_another_process_with_another_hash_seed():
    """The parent runs the reference here; the sandbox runs the student's code in a process with PYTHONHASHSEED=0.
    Equal code must give equal observations there: nothing may depend on str hashing or process state."""
    code = "import json; from tests.course.test_scenarios import observations as o; "
    code += f"print(json.dumps({{s: o(s, 11) for s in {POOL_STAGES}}}))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=SRC.parents[1])
    there = json.loads(run.stdout)
    for stage in POOL_STAGES:
        assert there[str(stage)] == observations(stage, 11), stage
    assert observations(5, 11) != observations(5, 12), "the seed changes the seeded cases"


@pytest.mark.parametrize("task, patch", MUTANTS, ids=[t for t, _ in MUTANTS])
def test_a_wrong_body_fails_some_fixed_case_and_most_seeded_ones(task, patch, monkeypatch):
    """Each scenario can fail: a plausible bug in the task's component changes what it observes."""
    stage = next(n for n in POOL_STAGES if task in stage_scenarios(n))
    want = observations(stage, 5, [task])[task]
    patch(monkeypatch)
    got = {name: grading.as_json(_try(stage_scenarios(stage)[task], name)) for name in want}
    wrong = [name for name in want if first_difference(want[name], got[name]) is not None]
    assert wrong, f"{task}: the mutant passes every case"
    assert len(wrong) >= 2, f"{task}: only {wrong} catches the mutant"


def _try(scenarios, name):
    try:
        return run_case(scenarios, name, 5)
    except Exception as e:
        return {"raised": type(e).__name__}


def test_each_task_runs_exactly_the_other_tasks_it_says_it_builds_on():
    """The hand-out's build-on graph is what the scenarios execute: a profiler records which regions' functions
    run during each task's cases on the reference."""
    wrong = {}
    for stage in POOL_STAGES:
        mine = regions.stage_regions(SRC.parents[1], stage)
        spans = {(str(r.path), r.start, r.end): r.task_id for r in mine}
        for task, s in stage_scenarios(stage).items():
            ran: set[str] = set()

            def profile(frame, event, arg, ran=ran, spans=spans):
                if event == "call":
                    code = frame.f_code
                    for (path, start, end), tid in spans.items():
                        if code.co_filename == path and start < code.co_firstlineno <= end:
                            ran.add(tid)

            sys.setprofile(profile)
            try:
                for seed in range(1, 7):  # seeded stories vary in what they hold (a beam search, a group)
                    for name in s.case_names(seeded=True)[len(s.fixed) if seed > 1 else 0 :]:
                        run_case(s, name, seed)
            finally:
                sys.setprofile(None)
            assert task in ran, f"{task}'s own region never ran"
            wrong.update({task: (sorted(ran - {task}), s.builds_on)} if ran - {task} != set(s.builds_on) else {})
    assert not wrong, wrong


def test_every_stub_states_its_contracts():
    """Each function a region defines keeps a docstring and a return annotation in the student's stub, and every
    message a scenario or a test checks is written in the stub of its task."""
    checked = {
        "free-queue": ['ValueError("No free blocks available")', "InvariantError"],
        "pool-allocate-free": ['ValueError(f"Cannot get {n} free blocks from the pool")', '"freed twice"'],
        "contiguous-reservation": ['"outgrew"', "None when no region is free"],
        "allocate-slots": ["None, with", "tail first"],
        "prefix-index": ["return False", "or None"],
    }
    for r in regions.find_regions(SRC):
        if r.launcher:
            continue
        text = r.path.read_text()
        stubbed = regions.stub_source(text, [r])
        body = next(m for m in regions.file_regions(r.path, stubbed) if m.task_id == r.task_id)
        stub = "\n".join(body.body(stubbed.splitlines()))
        tree = __import__("ast").parse(textwrap.dedent(stub))
        for fn in tree.body:
            doc = __import__("ast").get_docstring(fn)
            assert doc and len(doc) > 30 and fn.returns is not None, f"{r.task_id}: {fn.name} states no contract"
        for phrase in checked.get(r.task_id, []):
            assert phrase in stub, f"{r.task_id}'s stub does not state {phrase!r}"


@pytest.mark.parametrize(
    "want, got, says",
    [
        ([1, [2, 3]], [1, [2, 3]], None),
        ({"floats": [1.0, 2.0], "tol": 0.01}, {"floats": [1.005, 2.0], "tol": 99}, None),  # the reference's tol
        ({"floats": [1.0, 2.0], "tol": 0.01}, {"floats": [1.0, 2.1]}, "item 1: expected 2.0, got 2.1"),
        ([["popleft", None, ["ok", 0]]], [["popleft", None, ["ok", 1]]], 'op 1 ("popleft"), item 2, item 1'),
        ({"steps": [{"free": [1, 2]}]}, {"steps": [{"free": [2, 1]}]}, "step 0, free, item 0: expected 1, got 2"),
        ([1], [True], "expected 1, got true"),  # types apart: True is not 1
        ([1], [1.0], "expected 1, got 1.0"),
        (["a"], ["the reference's source, read by the body"], 'expected "a", got a different value'),
        ([[1, 2]], [list(range(500))], "got a different value"),  # long: never echoed
    ],
)
def test_observations_compare_as_plain_data_and_never_echo_free_text(want, got, says):
    found = first_difference(want, got)
    assert (found is None) if says is None else (says in found), found
