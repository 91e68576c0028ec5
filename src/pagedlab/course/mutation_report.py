"""Course: the tests assignment's report: the score, one entry per task, and what survived by kind and file.

Builds on: course/mutation.py (Mutant).
Read with: course/mutation_grading.py, chapters/98-assignments.md (Tests graded by the bugs they catch).

A report names a mutant only by its kind, its file and its task, never by its line or text: the student
learns which kind of slip their tests miss, not where to aim an assertion.
"""

from __future__ import annotations

from collections import Counter

from pagedlab.course.mutation import Mutant


def report(number: int, regions: list, mutants: list[Mutant], found: dict, notes: list[str], has_tests: bool) -> dict:
    """Gradescope's keys: one entry per task (its share of the counted mutants, the share it killed), and what
    survived by kind and file; never a mutant's text or line."""
    counted, killed, kept = found["counted"], found["killed"], found["kept"]
    max_score = sum(r.points for r in regions)
    n_killed = sum(killed.get(m.label, False) for m in counted)
    score = round(max_score * n_killed / len(counted), 2) if counted and kept else 0.0
    survived = [m for m in counted if not killed.get(m.label, False)]
    entries = []
    for r in regions:
        mine = [m for m in counted if m.task == r.task_id]
        dead = sum(killed.get(m.label, False) for m in mine)
        share = max_score / len(counted) if counted and kept else 0.0
        entries.append({
            "name": f"{r.task_id}: {dead} of {len(mine)} mutants killed", "score": round(share * dead, 2),
            "max_score": round(share * len(mine), 2), "status": "passed" if dead == len(mine) else "failed",
            "output": _survivors([m for m in survived if m.task == r.task_id]), "visibility": "visible",
        })  # fmt: skip
    rest = [m for m in survived if m.task not in {r.task_id for r in regions}]
    if rest:
        entries.append({"name": "other mutants", "score": 0.0, "max_score": 0.0, "status": "failed",
                        "output": _survivors(rest), "visibility": "visible"})  # fmt: skip
    head = f"Stage {number} tests: {n_killed} of {len(counted)} mutants killed -> {score:g} / {max_score}"
    lines = [head, *_lines(mutants, found, survived, has_tests), *notes]
    return {"score": score, "max_score": max_score, "stage": number, "kind": "tests", "output": "\n".join(lines),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": entries, "notes": notes,
            "mutants": {"drawn": len(mutants), "equivalent": len(found["equivalent"]), "counted": len(counted),
                        "killed": n_killed, "void": found["void"]},
            "survived": _counts(survived), "dropped": found["dropped"], "kept": len(kept)}  # fmt: skip


def _lines(mutants: list[Mutant], found: dict, survived: list[Mutant], has_tests: bool) -> list[str]:
    """The report's lines after its first: what was counted, dropped, voided and what survived."""
    lines = [f"({len(mutants)} drawn; {len(found['equivalent'])} equivalent: no scenario tells them from the "
             "reference, so they are not counted)"]  # fmt: skip
    if not has_tests:
        lines.append("No test file (tests/test_*.py) found: nothing to grade.")
    elif not found["kept"]:
        lines.append("No test passed on the reference: nothing to grade (score 0).")
    if found["dropped"]:
        dropped = found["dropped"]
        lines.append(f"Dropped, failing on the reference ({len(dropped)}): " + ", ".join(t for t, _ in dropped[:10]))
    if found["void"]:
        lines.append(f"{found['void']} mutants count as survived: a run of your tests failed on the reference "
                     "(flaky tests, or tests that keep state between runs)")  # fmt: skip
    if survived:
        lines.append("Survived: " + _survivors(survived))
    return lines


def _counts(survived: list[Mutant]) -> dict:
    return {
        "by_kind": dict(Counter(m.kind for m in survived)),
        "by_file": dict(Counter(m.path for m in survived)),
        "by_task": dict(Counter(m.task for m in survived if m.task)),
    }


def _survivors(survived: list[Mutant]) -> str:
    """ "2 operator swaps in kv/block_pool.py (free-queue), 1 off-by-one in worker/runner.py (slot-mapping)" """
    if not survived:
        return "none survived"
    groups = Counter((m.kind, m.path, m.task) for m in survived)
    parts = []
    for (kind, path, task), n in sorted(groups.items(), key=lambda g: (-g[1], g[0])):
        plural = kind if n == 1 else ("off-by-ones" if kind == "off-by-one" else kind + "s")
        parts.append(f"{n} {plural} in {path}" + (f" ({task})" if task else ""))
    return ", ".join(parts)
