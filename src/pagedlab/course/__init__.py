"""The course (apps): assignments a teacher hands out, and the grader that scores them.

Builds on: stages.py (each stage's preset: its chapter, its test marker), the tests' `task` markers.
Read with: chapters/98-assignments.md.

    regions.py         BEGIN/END SOLUTION regions: find them, stub them, put a student's back
    assignment.py      `pagedlab assignment make|check`: a student's copy of a stage, its README, the teacher's check
    screening.py       what a region may contain before it runs (no imports, no escape hatches)
    grading.py         `pagedlab assignment grade`: the student's regions in the teacher's tree, run sandboxed
    grading_runner.py  the pytest plugin the grader runs inside the sandbox (copied in, run as a script)
    gradescope.py      `pagedlab assignment gradescope`: the autograder zip Gradescope runs
"""
