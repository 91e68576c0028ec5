"""The course (apps): `pagedlab drill list|make|grade|show|check`, the incident drills' commands (tools/cli.py adds
them).

Builds on: course/drills/ (imported only when a command runs: a drill's student copy does not hold it).
Read with: chapters/98-assignments.md (Incident drills).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_command(sub) -> None:
    d = sub.add_parser("drill", help="incident drills: a copy of the engine with one fault planted, a ticket, a grader")
    actions = d.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="the drills: name, stage, the ticket's subject")
    make = actions.add_parser("make", help="write a student copy of drill NAME: the faulted engine and its ticket")
    make.add_argument("name", help="a drill's name (drill list)")
    make.add_argument("--out", required=True, help="new or empty folder")
    grade = actions.add_parser("grade", help="grade a fixed copy: the symptom, the code at the fault, nothing else")
    grade.add_argument("dir", help="a folder written by `drill make` (nothing in it is trusted)")
    grade.add_argument("--drill", default=None, help="the drill to grade as (default: the copy's drill.json)")
    grade.add_argument("--seed", type=int, default=None, help="the cases' seed (default: drawn now)")
    grade.add_argument("--json", default=None, metavar="FILE", help="write the whole result, every case, to FILE")
    grade.add_argument("--verbose", action="store_true", help="name each failing case and why (a teacher's view)")
    show = actions.add_parser("show", help="a teacher's view of drill NAME: the ticket, the fault, the post-mortem")
    show.add_argument("name")
    check = actions.add_parser("check", help="each drill fails its cases untouched and passes with the reference fix")
    check.add_argument("names", nargs="*", help="drills (default: all)")
    check.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_cmd_drill)


def _cmd_drill(args: argparse.Namespace) -> int:
    try:
        from pagedlab.course.drills import catalog, grading
    except ImportError:
        print("drill: this copy of pagedlab has no drills (a drill's student copy leaves the grader out)")
        return 2
    if args.action == "list":
        for d in catalog.DRILLS:
            print(f"{d.name:24s} stage {d.stage}  {d.title}")
        return 0
    if args.action == "make":
        out = grading.make(args.name, args.out)
        print(f"wrote {out}: drill {args.name} (see {out / 'TICKET.md'}, run {out / 'repro.py'})")
        return 0
    if args.action == "show":
        d = catalog.drill(args.name)
        print(d.ticket)
        print(f"## The fault\n\nIn src/pagedlab/{d.fault.path} ({d.fault.kind}):\n\n    - {d.fault.old.strip()}\n"
              f"    + {d.fault.new.strip() or '(deleted)'}\n")  # fmt: skip
        print(d.postmortem)
        return 0
    if args.action == "check":
        rows = grading.check(args.names or None, seed=args.seed)
        print(grading.check_table(rows))
        return 0 if all(grading.check_passed(r) for r in rows) else 1
    result = grading.grade(args.dir, args.drill, seed=args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(grading.report(result, verbose=args.verbose))
    return 0 if result["score"] == result["max_score"] else 1
