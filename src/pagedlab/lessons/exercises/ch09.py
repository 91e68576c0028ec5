"""Stage 5: the exercises of chapter 9 (graduating to vLLM): each has a worked solution, none a self-check.

Builds on: lessons/exercises/core.py.
Read with: chapters/09-graduate-to-vllm.md (Exercises, Solutions).
"""

from __future__ import annotations

from pagedlab.lessons.exercises.core import Exercise

EXERCISES = [
    Exercise("09.1", "The same victim", solution=True),
    Exercise("09.2", "An eighth family", solution=True),
    Exercise("09.3", "Undo a fix", solution=True),
]
