"""Incident drills (course/drills/): the catalog, the student copy (no answer, no grader in it), the grader's three
verdicts, and the drills' own promise: each fails its cases untouched and passes them with the reference fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedlab.course.drills import faults
from pagedlab.course.drills import grading as drills
from pagedlab.course.drills.catalog import DRILLS, drill
from pagedlab.course.regions import repo_root
from pagedlab.course.scenarios import stage_scenarios

SRC = repo_root() / "src" / "pagedlab"


def test_at_least_twelve_drills_across_stages_two_to_five():
    assert len(DRILLS) >= 12
    assert {d.stage for d in DRILLS} == {2, 3, 4, 5}
    assert len({d.name for d in DRILLS}) == len(DRILLS)
    assert sum(len(faults(s)) for s in (2, 3, 4, 5)) == len(DRILLS)


@pytest.mark.parametrize("d", DRILLS, ids=lambda d: d.name)
def test_each_drill_is_complete_and_its_ticket_names_no_cause(d):
    reference = (SRC / d.fault.path).read_text()
    assert reference.count(d.fault.old) == 1 and d.fault.apply(reference) != reference
    compile(d.fault.apply(reference), d.fault.path, "exec")  # a planted fault still parses
    compile(d.repro, f"{d.name}/repro.py", "exec")
    suite = stage_scenarios("drills")
    assert f"symptom-{d.symptom}" in suite
    for where, task in d.aimed:
        assert task in stage_scenarios(int(where) if where.isdigit() else where)
    ticket = d.ticket.lower()
    assert Path(d.fault.path).name not in ticket  # the file at fault is the student's to find
    assert d.fault.path in d.postmortem and "**Fix.**" in d.postmortem
    assert "post-mortem" not in ticket and "root cause" not in ticket


def test_unknown_drill_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="drill: no drill 'nope'"):
        drill("nope")


def test_student_copy_holds_the_fault_the_ticket_and_nothing_of_the_grader(tmp_path):
    d = drill("leak-on-disconnect")
    copy = drills.make(d.name, tmp_path / "copy")
    faulted = (copy / "src" / "pagedlab" / d.fault.path).read_text()
    assert d.fault.new in faulted and d.fault.old not in faulted
    assert not (copy / "src" / "pagedlab" / "course" / "drills").exists()
    assert not (copy / "src" / "pagedlab" / "course" / "scenarios" / "drills.py").exists()
    assert not (copy / "tests").exists() and not (copy / "chapters" / "98-assignments.md").exists()
    assert (copy / "repro.py").read_text() == d.repro
    assert json.loads((copy / "drill.json").read_text()) == {"drill": d.name, "stage": d.stage}
    assert "## Post-mortem" not in (copy / "TICKET.md").read_text()
    for path in copy.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".md", ".json", ".ipynb"):
            assert "Root cause." not in path.read_text(errors="replace"), path
    with pytest.raises(ValueError, match="--out"):
        drills.make(d.name, copy)
    env = os.environ | {"PYTHONPATH": str(copy / "src")}
    run = subprocess.run([sys.executable, "-m", "pagedlab", "drill", "list"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=copy)  # fmt: skip
    assert run.returncode == 2 and "no drills" in run.stdout  # the copy's CLI works, and has no grader


RUN_REPROS = """
import runpy, sys
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except Exception as e:
        print(f"{type(e).__name__}: {e}")
        code = 1
    print(f"EXIT {code}", flush=True)
"""


def _repros(src: Path, scripts: list[Path], cwd: Path) -> list[int]:
    """Each script's exit status, run one after another in one process that imports pagedlab from `src`."""
    env = os.environ | {"PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", RUN_REPROS, *map(str, scripts)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=cwd)  # fmt: skip
    codes = [int(line.split()[1]) for line in run.stdout.splitlines() if line.startswith("EXIT ")]
    assert len(codes) == len(scripts), run.stdout[-2000:] + run.stderr[-2000:]
    return codes


@pytest.mark.slow
def test_every_ticket_s_script_shows_its_symptom_on_the_copy_and_not_on_the_reference(tmp_path):
    copies = {d.name: drills.make(d.name, tmp_path / d.name) for d in DRILLS}
    scripts = [copies[d.name] / "repro.py" for d in DRILLS]
    assert _repros(SRC.parent, scripts, tmp_path) == [0] * len(DRILLS)  # the reference: no symptom
    broken = {d.name: _repros(copies[d.name] / "src", [copies[d.name] / "repro.py"], copies[d.name])[0] for d in DRILLS}
    assert broken == {d.name: 1 for d in DRILLS}


@pytest.mark.slow
def test_every_drill_fails_untouched_and_passes_with_the_reference_fix():
    rows = drills.check(seed=5)
    print("\n" + drills.check_table(rows))
    for row in rows:
        before, after = row["before"]["groups"], row["after"]["groups"]
        assert any(v is not None for v in before["symptom"].values()), f"{row['drill']}: no symptom"
        assert any(v is not None for v in before["at the fault"].values()), f"{row['drill']}: nothing at the fault"
        failing = {g: [c for c, v in cases.items() if v is not None] for g, cases in after.items()}
        assert row["after"]["score"] == 100, f"{row['drill']} fixed: {failing}"


@pytest.mark.slow
def test_a_fix_that_masks_the_symptom_elsewhere_fails_at_the_fault(tmp_path):
    """leak-on-disconnect, "fixed" in the engine's abort (it frees what the scheduler forgot): the ticket's symptom
    is gone, the scheduler's own abort path still leaks."""
    copy = drills.make("leak-on-disconnect", tmp_path / "copy")
    engine = copy / "src" / "pagedlab" / "engine" / "engine.py"
    text = engine.read_text()
    call = "        ended = self.scheduler.finish_requests([r.request_id for r in members], "
    call += "RequestStatus.FINISHED_ABORTED)\n"
    assert text.count(call) == 1
    engine.write_text(text.replace(call, call + "        for r in ended:\n            self.kv_manager.free(r)\n"))
    result = drills.grade(copy, "leak-on-disconnect", seed=3)
    print(drills.report(result, verbose=True))
    verdicts = result["groups"]
    assert all(v is None for v in verdicts["symptom"].values())
    assert all(v is not None for v in verdicts["at the fault"].values())
    assert result["score"] < 100


def test_the_grader_trusts_nothing_in_the_copy(tmp_path):
    copy = drills.make("priority-ignored", tmp_path / "copy")
    (copy / "drill.json").write_text('{"drill": "no-such-drill"}')
    with pytest.raises(ValueError, match="drill: no drill"):
        drills.grade(copy)
    (copy / "drill.json").unlink()
    (copy / "drill.json").symlink_to("/etc/hostname")
    with pytest.raises(ValueError, match="drill.json"):
        drills.grade(copy)
    queue = copy / "src" / "pagedlab" / "sched" / "queue.py"
    queue.unlink()
    queue.symlink_to(SRC / "sched" / "queue.py")  # the reference's fix, by a link out of the copy: not read
    d = drill("priority-ignored")
    notes = drills.engine_tree(repo_root(), copy, tmp_path / "tree", d)
    assert any("sched/queue.py: not a regular source file" in n for n in notes)
    graded = (tmp_path / "tree" / "src" / "pagedlab" / "sched" / "queue.py").read_text()
    assert d.fault.new in graded and d.fault.old not in graded  # graded as handed out: with its fault


def test_no_assignment_copy_or_graded_tree_holds_the_drills(tmp_path):
    """The drills' faults and post-mortems quote lines of the reference's regions: an assignment's copy and the
    trees its grader builds leave them out."""
    from pagedlab.course import assignment
    from pagedlab.course.submission import build_tree

    copy = assignment.make(4, tmp_path / "student")
    tree = build_tree(repo_root(), tmp_path / "tree", [], {})
    for root in (copy, tree):
        assert not (root / "src" / "pagedlab" / "course" / "drills").exists()
