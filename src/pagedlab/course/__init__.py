"""The course (apps): assignments a teacher hands out, and the grader that scores them.

Builds on: stages.py (each stage's preset: its chapter, its test marker), the tests' `task` markers.
Read with: chapters/98-assignments.md.

    regions.py         BEGIN/END SOLUTION regions: find them, stub them
    assignment.py      `pagedlab assignment make|check`: a student's copy of a stage, the teacher's check
    handout.py         the copy's HANDOUT.md: tasks, lines, what builds on what, how it is graded
    written.py         each stage's written problems (the answer key is in chapter 98)
    submission.py      a workspace's region bodies, read as text; the trees the grader builds from them
    screening.py       a body's shape, before it runs
    scenarios/         what grades each task: cases whose observations are plain data
    grading.py         `pagedlab assignment grade`: the trusted parent that decides the score
    sandbox.py         where student code runs: bubblewrap, and the fallback without it
    limits.py          what bounds a child: rlimits, a user id of its own, a cgroup
    run_scenarios.py   the sandboxed child that runs one task's scenarios (run as a script)
    messages.py        what a child may say: its lines read as a strict schema
    compare.py         a student's observations against the reference's
    feedback.py        the tests of a task that lost points, run for feedback; hidden tests
    grading_runner.py  the sandboxed pytest child (run as a script)
    child_guard.py     the fallback's audit hook, loaded by both children
    report.py          Gradescope's results and the text report
    batch.py           `pagedlab assignment grade-all`: a batch, a CSV, similarity flags
    similarity.py      how alike two bodies are, names and literals abstracted
    gradescope.py      `pagedlab assignment gradescope`: the autograder zip Gradescope runs
    tests_assignment.py  `make --tests`: a copy in which the student writes the tests; `check --tests`
    mutation.py        mutants of a stage's regions (operator swaps, off-by-ones, dropped statements, ...)
    mutation_grading.py  `grade --tests`: the tests on the reference, the equivalent-mutant filter, the kills
    mutation_report.py   its report: the score, what survived by kind, file and task (never a line)
    mutation_runner.py the sandboxed child that runs many mutants, one fork each (run as a script)
    drills/            the incident drills' faults (never in a student's copy of a tests assignment)
    cli.py             the `pagedlab assignment` sub-command: its actions' arguments, and what each runs
"""
