"""Stage 5: the exercises of chapter 8 (online serving): each has a worked solution, none a self-check.

Builds on: lessons/exercises/core.py.
Read with: chapters/08-online-serving.md (Exercises, Solutions).

A server's answers depend on when requests arrive, so these exercises are watched, not computed: the worked
solutions say what to expect and why.
"""

from __future__ import annotations

from pagedlab.lessons.exercises.core import Exercise

EXERCISES = [
    Exercise("08.1", "Five streams, two seats", solution=True),
    Exercise("08.2", "A shared system prompt, counted", solution=True),
    Exercise("08.3", "Close a stream", solution=True),
    Exercise("08.4", "Everyone at t = 0", solution=True),
    Exercise("08.5", "Read vLLM", solution=True),
]
