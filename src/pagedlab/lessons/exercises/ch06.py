"""Stage 6: the exercises of chapter 6 (Triton kernels): each has a worked solution, none a self-check.

Builds on: lessons/exercises/core.py.
Read with: chapters/06-triton-kernel.md (Exercises, Solutions).

Every exercise of this chapter asks for a kernel of your own, a measurement on a GPU, or an explanation; the
worked solutions at the end of the chapter show a reference and what its run printed.
"""

from __future__ import annotations

from pagedlab.lessons.exercises.core import Exercise

EXERCISES = [
    Exercise(
        "06.1",
        "Read each KV head once",
        solution=True,
        graded="a Triton kernel graded by the interpreter parity tests; the traffic argued",
    ),
    Exercise("06.2", "Where does V2 pay?", solution=True),
    Exercise("06.3", "Tensor cores for the prefill", solution=True),
    Exercise(
        "06.4",
        "vLLM's key layout",
        solution=True,
        graded="a store and a decode for another layout, graded by parity; the sector count argued",
    ),
    Exercise("06.5", "Break it, on purpose, in a copy", solution=True),
    Exercise("06.6", "Padding with -1", solution=True),
]
