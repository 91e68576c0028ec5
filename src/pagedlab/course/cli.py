"""The course (apps): `pagedlab assignment` and its actions, their arguments and what they run (tools/cli.py
adds it).

Builds on: course/assignment.py, grading.py, batch.py, gradescope.py.
Read with: chapters/98-assignments.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_command(sub) -> None:
    """`pagedlab assignment make|grade|grade-all|check|gradescope`, the limits' defaults the grader's own; `--tests`
    on make, grade and check: the tests assignment (the student writes tests, graded by the mutants they kill)."""
    from pagedlab.course.grading import PER_TEST_TIMEOUT, TOTAL_TIMEOUT
    from pagedlab.course.mutation_grading import COUNT as MUTANTS
    from pagedlab.course.similarity import THRESHOLD

    a = sub.add_parser(
        "assignment",
        help="course assignments: make a student copy of a stage, grade one or a batch",
        description="Course assignments. A code assignment stubs stage N's tasks and grades the student's bodies by "
        "scenarios; a tests assignment (--tests on make, grade and check) hands out stage N's code whole and grades "
        "the student's tests by the share of mutants of that code they kill (chapters/98-assignments.md).",
    )
    actions = a.add_subparsers(dest="action", required=True)
    make = actions.add_parser(
        "make", help="write a student workspace with stage N's tasks stubbed (or, with --tests, whole)"
    )
    make.add_argument("stage", help="stage number or name")
    make.add_argument("--out", required=True, help="new or empty folder")
    make.add_argument("--with-solutions", action="store_true", help="a teacher's copy: nothing removed")
    make.add_argument(
        "--tests",
        action="store_true",
        help="a tests assignment: stage N's code whole, the student writes tests/ (graded by the mutants they kill)",
    )
    grade = actions.add_parser(
        "grade",
        help="grade a workspace: each task's scenarios, run on its body in a sandbox, compared with the reference's",
    )
    grade.add_argument("dir", help="a folder written by `assignment make` (nothing in it is trusted)")
    grade.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="write Gradescope's results.json to FILE (stdout without one), even if grading fails",
    )
    batch = actions.add_parser(
        "grade-all", help="grade every submission in a folder (one seed), flag near-identical bodies, write a CSV"
    )
    batch.add_argument("dir", help="a folder holding one folder per submission")
    batch.add_argument("--csv", default=None, metavar="FILE", help="write one row per submission to FILE")
    batch.add_argument(
        "--threshold", type=float, default=THRESHOLD, help="similarity (0..1, names and literals abstracted) to flag"
    )
    grade.add_argument(
        "--tests",
        action="store_true",
        help="grade it as a tests assignment (the teacher's word): its tests/ run on the reference, then on "
        "mutants drawn now; score = the share killed (equivalent mutants, by the scenarios, not counted)",
    )
    grade.add_argument("--mutants", type=int, default=MUTANTS, help="with --tests: mutants drawn (drill faults on top)")
    for p in (grade, batch):
        p.add_argument("--stage", required=True, help="the stage to grade as (the teacher's word, not the folder's)")
        p.add_argument("--extra-tests", default=None, help="a folder of hidden tests (each tagged with a task)")
        p.add_argument("--timeout", type=float, default=PER_TEST_TIMEOUT, help="seconds per scenario case or test")
        p.add_argument("--total-timeout", type=float, default=TOTAL_TIMEOUT, help="seconds for one grading")
        p.add_argument("--seed", type=int, default=None, help="the seeded cases' seed (default: drawn now)")
        p.add_argument("--no-feedback", action="store_true", help="skip running the tests of tasks that lost points")
    check = actions.add_parser(
        "check", help="grade an untouched copy and the reference of each stage: <= 10 %% and 100 %%, and how long"
    )
    check.add_argument("stages", nargs="*", help="stage numbers (default: all)")
    check.add_argument("--extra-tests", default=None, help="hidden tests to check (each file must tag a task)")
    check.add_argument(
        "--tests",
        action="store_true",
        help="check the tests assignment instead: the starter file and the project's own tests, graded by mutants",
    )
    check.add_argument("--mutants", type=int, default=MUTANTS, help="with --tests: mutants drawn per grading")
    gs = actions.add_parser("gradescope", help="write an autograder's setup.sh and run_autograder for stage N")
    gs.add_argument("stage", help="stage number or name")
    gs.add_argument("--out", required=True, help="new or empty folder")
    a.set_defaults(func=_cmd_assignment)


def _cmd_assignment(args: argparse.Namespace) -> int:
    import sys

    from pagedlab.course import assignment, batch, gradescope, grading, mutation_grading, tests_assignment
    from pagedlab.stages import STAGES

    if args.action == "make" and args.tests:
        out = tests_assignment.make_tests(args.stage, args.out)
        print(f"wrote {out}: stage {args.stage}, a tests assignment (see {out / 'HANDOUT.md'})")
        return 0
    if args.action == "make":
        out = assignment.make(args.stage, args.out, with_solutions=args.with_solutions)
        tasks = json.loads((out / "assignment.json").read_text())["tasks"]
        print(f"wrote {out}: stage {args.stage}, {len(tasks)} tasks (see {out / 'HANDOUT.md'})")
        return 0
    if args.action == "check" and args.tests:
        rows = tests_assignment.check_tests_stages([int(n) for n in args.stages] or [2, 3, 4, 5], args.mutants,
                                                   out=sys.stderr)  # fmt: skip
        print(tests_assignment.check_tests_table(rows))
        return 0 if all(r["empty"]["score"] == 0 for r in rows) else 1
    if args.action == "check":
        rows = assignment.check_stages([int(n) for n in args.stages] or list(STAGES), extra_tests=args.extra_tests)
        print(assignment.check_table(rows))
        return 0 if all(r["reference"] == r["max_score"] and r["untouched"] <= r["max_score"] / 10 for r in rows) else 1
    if args.action == "gradescope":
        for path in gradescope.write_gradescope(args.stage, args.out):
            print(f"wrote {path}")
        return 0
    limits = {"per_test_timeout": args.timeout, "total_timeout": args.total_timeout, "extra_tests": args.extra_tests,
              "run_feedback": not args.no_feedback}  # fmt: skip
    if args.action == "grade-all":
        found = batch.grade_all(args.dir, args.stage, args.csv, args.threshold, seed=args.seed, **limits)
        return 0 if all("error" not in r for r in found["rows"]) else 1
    try:
        if args.tests:
            times = {"per_test_timeout": args.timeout, "total_timeout": args.total_timeout}
            result = mutation_grading.grade_tests(args.dir, args.stage, seed=args.seed, count=args.mutants, **times)
        else:
            result = grading.grade(args.dir, args.stage, seed=args.seed, **limits)
    except Exception as e:  # Gradescope needs its JSON even when grading itself fails
        if args.json is None:
            raise
        result = grading.failed_grading(f"{type(e).__name__}: {e}")
    if args.json is not None:
        text = json.dumps(gradescope.gradescope_json(result), indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    grading.print_grades(result)
    return 0 if result["tests"] and result["score"] == result["max_score"] else 1
