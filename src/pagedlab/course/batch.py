"""Course: grading a batch: `pagedlab assignment grade-all SUBMISSIONS/ --stage N --csv scores.csv`.

Builds on: course/grading.py (one grading), course/submission.py (the bodies), course/similarity.py.
Read with: chapters/98-assignments.md (A batch, Copying).

Every folder of SUBMISSIONS/ is one student's workspace (or holds one). They
are graded with one seed drawn for the batch, so the reference's observations
are computed once, and each row of the CSV gives the total, every task's score
and the isolation. Then every started body is compared with the reference's
and with every other submission's (course/similarity.py): the pairs at or
above the threshold are flagged, in the CSV and in the text, for the teacher
to judge.
"""

from __future__ import annotations

import csv
import secrets
import sys
from pathlib import Path

from pagedlab.course import grading, similarity
from pagedlab.course.regions import repo_root, stage_regions
from pagedlab.course.submission import read_bodies
from pagedlab.stages import parse_stage


def grade_all(folder, stage, csv_path=None, threshold=similarity.THRESHOLD, seed=None, out=sys.stderr, **kw) -> dict:
    """Grade every submission in `folder`; {"rows": [...], "pairs": flagged pairs, "seed"}; the CSV if asked."""
    number, root, folder = parse_stage(stage), repo_root(), Path(folder)
    if not folder.is_dir():
        raise ValueError(f"submissions: {folder} is not a folder")
    subs = sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not subs:
        raise ValueError(f"submissions: {folder} holds no submission folder")
    seed = secrets.randbelow(1 << 31) if seed is None else seed
    regions = stage_regions(root, number)
    rows, bodies = [], {}
    for sub in subs:
        try:
            result = grading.grade(sub, number, seed=seed, **kw)
            scores = {t["id"]: t["score"] for t in result["tasks"]}
            rows.append({"submission": sub.name, "score": result["score"], "max_score": result["max_score"],
                         **scores, "isolation": result["isolation"], "seconds": result["execution_time"]})  # fmt: skip
            found, _ = read_bodies(root, grading._workspace(sub), regions)
            bodies[sub.name] = {t: similarity.tokens(b.lines) for t, b in found.items() if b.status == "accepted"}
        except Exception as e:  # whatever one submission does, the next is graded: this one gets its row, with why
            rows.append({"submission": sub.name, "score": 0, "max_score": 0, "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"{sub.name}: {rows[-1]['score']:g} / {rows[-1]['max_score']:g}", file=out)
    reference = {r.task_id: similarity.tokens(r.body(r.path.read_text().splitlines())) for r in regions}
    pairs = similarity.flag_pairs(bodies, reference, threshold)
    for row in rows:
        row["similar_to"] = "; ".join(f"{b if a == row['submission'] else a} {s:.2f}" for a, b, s, _ in pairs
                                      if row["submission"] in (a, b))  # fmt: skip
    if csv_path is not None:
        _write_csv(Path(csv_path), rows, [r.task_id for r in regions])
    print(similarity_text(pairs, threshold), file=out)
    return {"rows": rows, "pairs": pairs, "seed": seed}


def _write_csv(path: Path, rows: list[dict], task_ids: list[str]) -> None:
    columns = ["submission", "score", "max_score", *task_ids, "isolation", "seconds", "similar_to", "error"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def similarity_text(pairs: list, threshold: float) -> str:
    """The flagged pairs, most alike first, with the tasks behind each score."""
    if not pairs:
        return f"similarity: no pair at or above {threshold:.2f} (names and literals abstracted)"
    lines = [f"similarity: {len(pairs)} pair(s) at or above {threshold:.2f}, for the teacher to judge:"]
    for a, b, score, per in pairs:
        tasks = ", ".join(f"{t} {s:.2f}" for t, s in per.items())
        lines.append(f"  {a} ~ {b}: {score:.2f}  ({tasks})")
    return "\n".join(lines)
