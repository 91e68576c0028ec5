"""Course: an incident drill's student copy and its grader: `pagedlab drill make NAME --out DIR`, `drill grade DIR`.

Builds on: course/drills/catalog.py (the drills), course/scenarios/drills.py, course/grading.py (run_cases: the
sandboxed children and the strict reading of what they say), course/submission.py (bounded reading).
Read with: chapters/98-assignments.md (Incident drills).

A student copy is the whole engine (src/) with one fault planted, the chapters and notebooks to read, and a
ticket: the symptom as a user reported it and the script they attached (repro.py). It holds no test suite (the
bug got past one), none of the grader's scenarios and no post-mortem.

Grading reads the copy's engine as text: every source file of src/pagedlab that the reference has, outside
course/ (the grader's own), a regular file inside the folder and of bounded size. It builds a tree from the
teacher's src/ with those files in place, and runs three groups of cases there, sandboxed, with seeds drawn now;
each case passes when its observation equals the teacher's reference's, run here:

    the symptom       the ticket's workload, drawn anew: what the user saw is gone
    at the fault      the unit-level cases of the component that holds the fault: the fix is there, not a mask
                      elsewhere (a mask makes the symptom's cases pass and these fail)
    nothing else      every task's scenarios of stages 2-5 and an engine run per stage: nothing regressed
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pagedlab.course.drills.catalog import DRILLS, Drill, drill
from pagedlab.course.grading import TOTAL_TIMEOUT, Limits, as_json, forbidden_folders, run_cases
from pagedlab.course.regions import repo_root
from pagedlab.course.scenarios import run_case, stage_scenarios
from pagedlab.course.submission import _IGNORE, SOURCE_LIMIT, SRC_IGNORE

PER_CASE_TIMEOUT = 30.0  # seconds one case may run (a symptom that is a livelock ends here)
GROUPS = ("symptom", "at the fault", "nothing else")
WEIGHTS = {"symptom": 40, "at the fault": 30, "nothing else": 30}  # points of 100
GRADER_ONLY = ("course/drills", "course/scenarios/drills.py")  # never in a student's copy
REGRESSION_STAGES = (2, 3, 4, 5)
_EXPECTED: dict = {}  # (seed, case) -> the reference's observation, once per process


def make(name: str, out: str | Path) -> Path:
    """Write drill `name`'s student copy into `out` (new or empty): src/ with the fault, reading, TICKET.md,
    repro.py, drill.json."""
    d, out, root = drill(name), Path(out), repo_root()
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} exists and is not empty")
    shutil.copytree(root / "src", out / "src", ignore=_grader_only(root / "src" / "pagedlab"))
    faulted = out / "src" / "pagedlab" / d.fault.path
    faulted.write_text(d.fault.apply(faulted.read_text()))
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(root / file, out / file)
    for folder in ("chapters", "notebooks"):
        shutil.copytree(root / folder, out / folder, ignore=shutil.ignore_patterns("98-*", ".ipynb_checkpoints"))
    (out / "TICKET.md").write_text(_ticket(d))
    (out / "repro.py").write_text(d.repro)
    (out / "drill.json").write_text(json.dumps({"drill": d.name, "stage": d.stage}) + "\n")
    return out


def _grader_only(src_pkg: Path):
    """shutil.copytree's ignore: caches, and the grader's own drill files."""
    skip = {str(src_pkg / part) for part in GRADER_ONLY}

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(_IGNORE(folder, names)) | {n for n in names if os.path.join(folder, n) in skip}

    return ignore


def _ticket(d: Drill) -> str:
    return (
        f"{d.ticket}\n---\n\nThis copy of pagedlab runs the engine the ticket's user ran (stage {d.stage}); find the "
        "cause and fix it where it lies. `python repro.py` (from this folder, with `pip install -e .` done) shows "
        "the symptom. The project's own tools help: `debug_checks=True`, `pagedlab trace` (the step-through page), "
        "the oracle (`pagedlab.oracle`), the chapters. The teacher grades the fix with `pagedlab drill grade`: the "
        "symptom must be gone on workloads like the ticket's, the code at the fault must behave as it should, and "
        "nothing else may change.\n"
    )


def grade(workspace, name: str | None = None, seed: int | None = None, per_case_timeout=PER_CASE_TIMEOUT,
          total_timeout=TOTAL_TIMEOUT, groups=GROUPS) -> dict:  # fmt: skip
    """Grade a drill's copy: the teacher names the drill (`name`; else the copy's drill.json, whose word is all
    it decides). {"drill", "seed", "score", "groups": {group: {case: None or why}}, "notes", "execution_time"};
    `groups` (a part of GROUPS) runs only those (the check's untouched copies need no regression run)."""
    started, root = time.monotonic(), repo_root()
    ws = Path(workspace).resolve()
    if not (ws / "src" / "pagedlab").is_dir():
        raise ValueError(f"workspace: {ws} has no src/pagedlab (not a folder written by `drill make`)")
    notes = []
    if name is None:
        name = _claimed(ws)
        notes.append(f"graded as drill {name!r}, the name in the copy's drill.json (pass --drill to decide)")
    d = drill(name)
    seed = secrets.randbelow(1 << 31) if seed is None else seed
    cases = {g: c if g in groups else [] for g, c in _cases(d).items()}
    expected = {case: _reference(seed, case) for group in cases.values() for case in group}
    seeds = {case: seed for group in cases.values() for case in group}
    limits = Limits(per_case_timeout, started + total_timeout, forbidden_folders(root, ws))
    with tempfile.TemporaryDirectory(prefix="pagedlab-drill-") as tmp:
        tree = Path(tmp) / "tree"
        notes += engine_tree(root, ws, tree, d)
        with ThreadPoolExecutor(2) as pool:  # the symptom and the fault's cases beside the long regression run
            short = {c: expected[c] for c in cases["symptom"] + cases["at the fault"]}
            long = {c: expected[c] for c in cases["nothing else"]}
            runs = [pool.submit(run_cases, tree, {}, part, seeds, limits, Path(tmp) / f"log-{i}.txt")
                    for i, part in enumerate((short, long))]  # fmt: skip
            verdicts = runs[0].result() | runs[1].result()
    found = {g: {c: verdicts[c] for c in cases[g]} for g in groups}
    score = sum(WEIGHTS[g] * _share(found[g]) for g in groups)
    return {"drill": d.name, "seed": seed, "score": round(score, 2), "max_score": sum(WEIGHTS[g] for g in groups),
            "groups": found,
            "notes": notes, "execution_time": round(time.monotonic() - started, 1)}  # fmt: skip


def _share(verdicts: dict) -> float:
    return sum(v is None for v in verdicts.values()) / len(verdicts) if verdicts else 0.0


def _claimed(ws: Path) -> str:
    path = ws / "drill.json"
    st = path.lstat() if path.exists() or path.is_symlink() else None
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
        raise ValueError(f"drill: {ws} has no readable drill.json; name the drill (--drill NAME)")
    try:
        claimed = json.loads(path.read_text())["drill"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"drill: {path} is not a drill's drill.json; name the drill (--drill NAME)") from e
    return drill(str(claimed)).name


def _cases(d: Drill) -> dict[str, list[str]]:
    """{group: ["suite|task|case", ...]}: the symptom's, those aimed at the fault, every other task's and engine's."""

    def names(suite: str, task: str) -> list[str]:
        scenarios = stage_scenarios(int(suite) if suite.isdigit() else suite)[task]
        return [f"{suite}|{task}|{case}" for case in scenarios.case_names()]

    aimed = [c for suite, task in d.aimed for c in names(suite, task)]
    rest = [(str(s), t) for s in REGRESSION_STAGES for t in stage_scenarios(s)] + [
        ("drills", f"engine-{s}") for s in REGRESSION_STAGES
    ]
    beside = [c for suite, task in rest if (suite, task) not in d.aimed for c in names(suite, task)]
    return {"symptom": names("drills", f"symptom-{d.symptom}"), "at the fault": aimed, "nothing else": beside}


def _reference(seed: int, case: str):
    """The teacher's reference's observation of one case, run here (once per process and seed)."""
    key = (seed, case)
    if key not in _EXPECTED:
        suite, task, name = case.split("|")
        scenarios = stage_scenarios(int(suite) if suite.isdigit() else suite)[task]
        _EXPECTED[key] = as_json(run_case(scenarios, name, seed if name.startswith("seeded-") else None))
        while len(_EXPECTED) > 4096:
            _EXPECTED.pop(next(iter(_EXPECTED)))
    return _EXPECTED[key]


def engine_tree(root: Path, ws: Path, dest: Path, d: Drill) -> list[str]:
    """The teacher's src/ in `dest` with the copy's engine in place: each .py file of ws/src/pagedlab that the
    reference has, outside course/, if it is a regular file inside the copy of at most SOURCE_LIMIT bytes of UTF-8;
    a file missing or refused stays as handed out (the faulted one with its fault). Returns notes on those."""
    shutil.copytree(root / "src", dest / "src", ignore=SRC_IGNORE)
    theirs, ours, notes = ws / "src" / "pagedlab", dest / "src" / "pagedlab", []
    faulted = ours / d.fault.path
    faulted.write_text(d.fault.apply(faulted.read_text()))
    for path in sorted(ours.rglob("*.py")):
        rel = path.relative_to(ours)
        if rel.parts[0] == "course":
            continue
        student = theirs / rel
        try:
            st = student.lstat()
        except OSError:
            notes.append(f"{rel}: missing in the copy; graded as handed out")
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > SOURCE_LIMIT:
            notes.append(f"{rel}: not a regular source file of at most {SOURCE_LIMIT} bytes; graded as handed out")
            continue
        try:
            text = student.read_bytes().decode()
        except UnicodeDecodeError:
            notes.append(f"{rel}: not UTF-8; graded as handed out")
            continue
        path.write_text(text)
    return notes


def report(result: dict, verbose: bool = False) -> str:
    """The grade as text: a line per group (its cases that pass), the score; `verbose` names the failing cases."""
    lines = [f"drill {result['drill']} (seed {result['seed']}): {result['score']:g} / {result['max_score']}"]
    labels = {"symptom": "the symptom is gone", "at the fault": "the code at the fault behaves",
              "nothing else": "nothing else changed"}  # fmt: skip
    for group, verdicts in result["groups"].items():
        passed = sum(v is None for v in verdicts.values())
        mark = "ok  " if passed == len(verdicts) else "FAIL"
        lines.append(f"  {mark} {labels[group]}: {passed} of {len(verdicts)} cases as the reference")
        if verbose:
            lines += [f"         {case}: {why}" for case, why in verdicts.items() if why is not None][:20]
    lines += [f"  note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def check(names=None, seed: int = 0) -> list[dict]:
    """The drills' own check: each copy, untouched, fails its symptom's cases; with the post-mortem's fix (the
    fault's text put back) it passes every case. One row per drill."""
    rows = []
    for d in [drill(n) for n in names] if names else DRILLS:
        with tempfile.TemporaryDirectory(prefix="pagedlab-drill-check-") as tmp:
            copy = make(d.name, Path(tmp) / "copy")
            before = grade(copy, d.name, seed, groups=("symptom", "at the fault"))
            fixed = copy / "src" / "pagedlab" / d.fault.path
            text = fixed.read_text()
            fixed.write_text(text.replace(d.fault.new, d.fault.old) if d.fault.new else _unplant(d, text))
            after = grade(copy, d.name, seed)
        rows.append({"drill": d.name, "stage": d.stage, "before": before, "after": after})
    return rows


def _unplant(d: Drill, text: str) -> str:
    """Put a deleted fault's text back: at the place the reference has it (the text before it, found once)."""
    reference = (repo_root() / "src" / "pagedlab" / d.fault.path).read_text()
    before = reference[: reference.index(d.fault.old)]
    anchor = before[-200:]
    at = text.index(anchor) + len(anchor)
    return text[:at] + d.fault.old + text[at:]


def check_passed(row: dict) -> bool:
    """Untouched: some case of the symptom and some case at the fault fail; fixed: every case passes."""
    before = row["before"]["groups"]
    broken = all(any(v is not None for v in before[g].values()) for g in ("symptom", "at the fault"))
    return broken and row["after"]["score"] == row["after"]["max_score"]


def check_table(rows: list[dict]) -> str:
    lines = ["| drill | stage | untouched: cases failing (symptom / at the fault) | fixed: score | grading time |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        b = r["before"]["groups"]
        counts = " / ".join(f"{sum(v is not None for v in b[g].values())}/{len(b[g])} fail" for g in b)
        lines.append(f"| {r['drill']} | {r['stage']} | {counts} | {r['after']['score']:g} | "
                     f"{r['before']['execution_time']} s / {r['after']['execution_time']} s |")  # fmt: skip
    return "\n".join(lines)
