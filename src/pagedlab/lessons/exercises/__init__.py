"""Stage 1: check yourself: every chapter exercise, with a self-check that runs the code, or a worked solution.

Builds on: lessons/exercises/core.py (what an exercise is, how an answer is judged) and one module per chapter,
lessons/exercises/ch01.py to ch09.py (its exercises and the code that computes their answers).
Read with: every chapter's Exercises and Solutions sections; chapters/98-assignments.md (Exercises you can check).

    from pagedlab.lessons import exercises
    exercises.check("02.2", {"slots": [...], "position": ...})   prints ✓ or ✗ with a hint; True when all is right
    exercises.answer("02.2")                                      for teachers: the true answer, computed now
    exercises.EXERCISES["02.2"]                                   its title, parts, hints, why it is good to grade

An answer is never written down: `answer` runs the engine (or the function the exercise names) with the
exercise's settings each time a process first asks, so a check stays right when the code changes. Exercises whose
answer is an explanation or a program of your own have a worked solution instead, in a collapsed section at the end
of their chapter; `EXERCISES[id].solution` says so, and `check` on one of them says where to look.
"""

from __future__ import annotations

from pagedlab.lessons.exercises import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09
from pagedlab.lessons.exercises.core import PLACEHOLDER, Exercise, Verdict, filtered, judge, report, same, show

EXERCISES: dict[str, Exercise] = {
    e.id: e for module in (ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09) for e in module.EXERCISES
}


def _self_check(exercise_id: str) -> Exercise:
    exercise = EXERCISES.get(exercise_id)
    if exercise is None:
        raise ValueError(f"exercise: no exercise {exercise_id!r}; they are {', '.join(EXERCISES)}")
    if exercise.truth is None:
        raise ValueError(
            f"exercise: {exercise_id} ({exercise.title}) has a worked solution, not a self-check: "
            f"see the Solutions section at the end of chapter {exercise.chapter}"
        )
    return exercise


def answer(exercise_id: str):
    """For teachers: the true answer of exercise `exercise_id`, computed by running the code now."""
    return _self_check(exercise_id).truth()


def verdict(exercise_id: str, guess) -> Verdict | None:
    """How `guess` fares against the truth, part by part (None for the `...` placeholder)."""
    exercise = _self_check(exercise_id)
    if guess is ... or guess is None:
        return None
    return judge(exercise, guess, exercise.truth())


def check(exercise_id: str, guess=...) -> bool:
    """Print whether `guess` answers exercise `exercise_id` (✓, or ✗ with a hint per wrong part); True when every
    part is given and right."""
    exercise = _self_check(exercise_id)
    result = verdict(exercise_id, guess)
    if result is None:
        print(f"{exercise_id} {exercise.title}: {PLACEHOLDER} (the answer's form: {exercise.form})")
        return False
    print(report(exercise, result, exercise.truth()))
    return result.ok


def graded() -> list[Exercise]:
    """The exercises that make good graded questions, in chapter order."""
    return [e for e in EXERCISES.values() if e.graded]


__all__ = ["EXERCISES", "Exercise", "Verdict", "answer", "check", "filtered", "graded", "same", "show", "verdict"]
