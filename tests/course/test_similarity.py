"""Copying is a separate question: a batch graded with one seed, five honest stage-2 solutions in five styles all
score 100 and are not flagged; a pasted reference and a copied classmate, renamed, are (course/batch.py,
course/similarity.py)."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagedlab.course import assignment, similarity
from tests.course import routes as R
from tests.course import stage2_solutions as S

TASKS = ("free-queue", "pool-allocate-free", "allocate-slots", "slot-mapping", "paged-gather")


def test_names_literals_comments_and_layout_do_not_count_but_structure_does():
    a = ["    def f(self, n):", "        total = 0  # sum", "        for i in range(n):", "            total += i * 2",
         "        return total"]  # fmt: skip
    renamed = ["    def g(self, count):", "", "        acc = 5", "        for k in range(count):",
               "            acc += k * 7", "        return acc"]  # fmt: skip
    other = ["    def f(self, n):", "        return sum(i * 2 for i in range(n))"]
    assert similarity.ratio(similarity.tokens(a), similarity.tokens(renamed)) == 1.0
    assert similarity.ratio(similarity.tokens(a), similarity.tokens(other)) < 0.6
    assert similarity.tokens(['    """A docstring only."""']) == []


@pytest.fixture(scope="module")
def submissions(tmp_path_factory) -> Path:
    """Seven stage-2 workspaces: alice .. erin honest, copied_reference and copied_alice disguised copies."""
    root = tmp_path_factory.mktemp("subs")
    handout = assignment.make(2, root / ".handout")
    bodies = {name: {t: S.indented(b) for t, b in tasks.items()} for name, tasks in S.HONEST.items()}
    bodies["copied_reference"] = {t: S.disguise(R.reference_body(t), S.RENAMES) for t in TASKS}
    bodies["copied_alice"] = {t: S.disguise(bodies["alice"][t], S.RENAMES) for t in TASKS}
    for name, tasks in bodies.items():
        ws = Path(shutil.copytree(handout, root / name / "hw2"))  # an uploaded zip's top folder
        for task, lines in tasks.items():
            R.write_body(ws, task, lines)
    shutil.rmtree(handout)
    return root


def test_grade_all_scores_each_honest_solution_and_flags_only_the_copies(submissions, tmp_path):
    out = tmp_path / "scores.csv"
    cmd = [sys.executable, "-m", "pagedlab", "assignment", "grade-all", str(submissions), "--stage", "2",
           "--csv", str(out), "--no-feedback"]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    rows = {r["submission"]: r for r in csv.DictReader(out.open())}
    assert set(rows) == {*S.HONEST, "copied_reference", "copied_alice"}
    assert all(float(r["score"]) == 100 for r in rows.values()), {n: r["score"] for n, r in rows.items()}
    assert all(float(r[t]) == 20 for r in rows.values() for t in TASKS)
    flagged = {n: r["similar_to"] for n, r in rows.items() if r["similar_to"]}
    assert set(flagged) == {"copied_reference", "alice", "copied_alice"}, flagged
    assert flagged["copied_reference"].startswith("reference 1.00")
    assert flagged["alice"].startswith("copied_alice 1.00") and flagged["copied_alice"].startswith("alice 1.00")
    assert "similarity: 2 pair(s) at or above 0.90" in run.stderr
