"""Course: a grading's results: Gradescope's results.json, and the text a student reads first.

Builds on: course/grading.py (TaskResult).
Read with: chapters/98-assignments.md (Grading, Feedback).

One Gradescope test per task, worth exactly the task's points (so the tests'
max_scores add up to the stage's points, as integers), plus the hidden tests,
worth nothing and shown after publication. The text report gives every task's
score (the share of its cases drawn at grading that passed; the visible cases,
whose answers the student holds, are shown beside them and never score), the
first case it failed and the first test that says why, and folds the tasks not
started into one line:

    pool-allocate-free       20      15  3/4 (visible 2/3)
        seeded-2: after op 4 ("free"), item 2: expected ["raised", ...], got ["ok", null]
        test tests/kv/test_block_pool.py::test_a_block_returns_only_at_ref_cnt_zero: AssertionError: ...
    not started: 3 tasks (allocate-slots, slot-mapping, paged-gather)
"""

from __future__ import annotations

from pagedlab.stages import STAGE_NAMES


def results(root, number, tasks: dict, hidden_tests: list, notes: list, seed: int, local: bool, isolation) -> dict:
    """Gradescope's keys, plus the stage, the seed, the isolation and one row per task."""
    rows = [_row(root, result) for result in tasks.values()]
    score = round(sum(r["score"] for r in rows), 2)
    max_score = sum(r["points"] for r in rows)
    isolated, why = isolation
    out = {
        "score": score,
        "max_score": max_score,
        "stage": number,
        "seed": None if local else seed,
        "isolation": f"bwrap: {why}" if isolated else f"none: {why}",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": [_test(r) for r in rows] + hidden_tests,
        "tasks": rows,
        "notes": notes,
    }
    out["output"] = summary(out, local)
    return out


def _row(root, result) -> dict:
    """A task's row. `cases`/`passed` count the graded cases (drawn at grading); `visible` counts the visible ones
    (their answers are the student's to check, so they explain and never score); the first failure shown is a
    visible case's when one failed, since the student can rerun it."""
    body = result.body
    region = body.region
    failed = {name: why for name, why in result.cases.items() if why is not None}
    graded = result.graded
    visible = [name for name in result.cases if name not in graded]
    points = region.points
    return {
        "id": region.task_id,
        "points": points,
        "file": str(region.path.relative_to(root)),
        "line": body.line or region.start + 1,
        "status": body.status,
        "reasons": body.reasons,
        "score": round(points * result.fraction, 2),
        "cases": len(graded),
        "passed": sum(name not in failed for name in graded),
        "visible": [sum(name not in failed for name in visible), len(visible)],
        "first_failure": next(iter(failed.items()), None),
        "feedback": result.feedback,
    }


def _test(row: dict) -> dict:
    return {
        "name": f"{row['id']} ({row['file']}:{row['line']})",
        "score": row["score"],
        "max_score": row["points"],
        "status": "passed" if row["score"] == row["points"] else "failed",
        "output": "\n".join(_explain(row)),
        "visibility": "visible",
        "tags": [row["id"]],
    }


def _explain(row: dict) -> list[str]:
    """Why a task has the score it has, in at most three lines."""
    if row["status"] == "not started":
        return ["not started: the region still holds the hand-out's stub"]
    if row["status"] in ("refused", "missing"):
        return [f"{row['status']}: {why}" for why in row["reasons"][:3]]
    lines = [f"{row['passed']}/{row['cases']} graded cases passed" + _visible(row)]
    if row["first_failure"]:
        name, why = row["first_failure"]
        lines.append(f"{name}: {why}")
    if row["feedback"]:
        lines.append(f"test {row['feedback']}")
    return lines


def _visible(row: dict) -> str:
    passed, total = row["visible"]
    return f" (visible {passed}/{total})" if total else ""


def summary(out: dict, local: bool) -> str:
    """The text report: the total, the isolation, one block per task, the tasks not started in one line."""
    number = out["stage"]
    lines = [f"Stage {number} ({STAGE_NAMES[number]}): {out['score']:g} / {out['max_score']:g}"]
    if not out["isolation"].startswith("bwrap"):
        lines.append(f"WARNING: ran without isolation ({out['isolation'][6:]}): student code ran as a plain process.")
    if local:
        lines.append("Your own copy: the visible cases only (scenarios.json); the teacher's grading adds seeded ones.")
    else:
        lines.append(f"seed {out['seed']} (the seeded cases were drawn from it)")
    lines += ["", f"{'task':24} {'points':>6} {'score':>7}  cases"]
    idle = [r["id"] for r in out["tasks"] if r["status"] == "not started"]
    for row in out["tasks"]:
        if row["status"] == "not started":
            continue
        cases = f"{row['passed']}/{row['cases']}{_visible(row)}" if row["status"] == "accepted" else row["status"]
        lines.append(f"{row['id']:24} {row['points']:>6} {row['score']:>7g}  {cases}")
        lines += [f"    {line}" for line in _explain(row)[1 if row["status"] == "accepted" else 0 :]]
    if idle:
        lines.append(f"not started: {len(idle)} task{'s' * (len(idle) > 1)} ({', '.join(idle)})")
    hidden = [t for t in out["tests"] if t["visibility"] == "after_published"]
    if hidden:
        lines.append(f"{len(hidden)} hidden tests ran (shown after publication; they do not count)")
    lines += ["", *[f"note: {n}" for n in out["notes"]]] if out["notes"] else []
    return "\n".join(lines)
