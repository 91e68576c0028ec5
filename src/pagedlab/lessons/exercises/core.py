"""Stage 1: what a chapter exercise is, and how a learner's answer is judged against the truth the code computes.

Builds on: nothing of the engine (each chapter's module gives the truths: lessons/exercises/ch01.py ...).
Read with: chapters/98-assignments.md (Exercises you can check).

An answer is one value, or several parts: a dict of part -> value (some parts only, to check those first), or a
tuple in the order the exercise names them. Values are compared as the truth's kind says: a set in any order, and
{3} and {"3"} name the same request; a list (a block table, a free queue) in its order; a number exactly, or to
1 % where the truth is a float. A hint sentence that contains the text of a true value is dropped, so a hint
helps without telling.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

NO_HINT = "read the chapter's walk-through again, then run the code the exercise names."
PLACEHOLDER = "write your answer in place of the `...`, then run the cell again"


@dataclass(frozen=True)
class Exercise:
    """One exercise of a chapter: a self-check (`truth`), a worked solution (`solution`), or both."""

    id: str  # "02.2": the chapter's number, then the exercise's
    title: str  # the exercise's short name, as its chapter bolds it
    truth: Callable[[], Any] | None = None  # the true answer, computed now by running the code; None: no self-check
    parts: tuple[str, ...] = ()  # the names of an answer's parts, in tuple order; () for a single value
    form: str = ""  # what an answer looks like, as the chapter's "Check:" line writes it
    hints: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # part ("" for all) -> helpful sentences
    solution: bool = False  # a worked solution in the chapter's Solutions section
    graded: str = ""  # why it makes a good graded question for teachers ("" when it does not)
    explain: str = ""  # why the answer is what it is, shown once it is right
    code: str = ""  # where to read: the files and functions that decide the answer
    needs: str = ""  # "smollm2": the truth needs the fetched SmolLM2 (`pagedlab fetch smollm2`)

    @property
    def chapter(self) -> str:
        return self.id.split(".")[0]


@dataclass(frozen=True)
class Verdict:
    """How an answer fared, part by part."""

    right: tuple[str, ...]  # parts answered right ("" for a single value)
    wrong: dict[str, str]  # part -> the hint shown for it
    missing: tuple[str, ...]  # parts not given

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.missing


# --- comparing ---------------------------------------------------------------------------------------------


def same(guess, truth) -> bool:
    """Does `guess` say what `truth` says, in the truth's kind?"""
    if isinstance(truth, bool) or truth is None:
        return guess is truth
    if isinstance(truth, float):
        return _number(guess) and math.isclose(float(guess), truth, rel_tol=0.01)
    if isinstance(truth, int):
        return _number(guess) and float(guess) == truth
    if isinstance(truth, set | frozenset):
        return isinstance(guess, set | frozenset | list | tuple) and {str(g) for g in guess} == {str(t) for t in truth}
    if isinstance(truth, list | tuple):
        ok = isinstance(guess, list | tuple) and len(guess) == len(truth)
        return ok and all(same(g, t) for g, t in zip(guess, truth))
    if isinstance(truth, Mapping):
        return (
            isinstance(guess, Mapping)
            and _keyed(guess).keys() == _keyed(truth).keys()
            and all(same(_keyed(guess)[k], v) for k, v in _keyed(truth).items())
        )
    if isinstance(truth, str):  # a request id may be given as a number; a token's text without its space
        return isinstance(guess, str | int) and str(guess).strip().lower() == truth.strip().lower()
    return guess == truth


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _keyed(d: Mapping) -> dict[str, Any]:
    """Keys as text: {'A': ...} and {1: ...} match the truth's "A" and "1"."""
    return {str(k): v for k, v in d.items()}


def show(value) -> str:
    """A value as a learner would write it: sets sorted, set() for an empty one."""
    if isinstance(value, set | frozenset):
        return "{" + ", ".join(map(repr, sorted(value, key=str))) + "}" if value else "set()"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in value.items()) + "}"
    return repr(value)


# --- hints that never tell ----------------------------------------------------------------------------------


def words(value) -> list[str]:
    """The texts that would give `value` away in a hint."""
    if isinstance(value, set | frozenset):
        return [str(sorted(value, key=str)), str(value), show(value)] if value else ["set()"]
    if isinstance(value, Mapping):
        return [str(value), show(value)] + [w for v in value.values() for w in words(v) if not isinstance(v, int)]
    if isinstance(value, float):
        return [f"{value:g}", f"{value:.1f}", str(value)]
    return [str(value), repr(value)]


def filtered(sentences, truths) -> list[str]:
    """The sentences that contain none of the truths' texts (each as a whole word)."""
    texts = {w for t in truths for w in words(t) if w}
    pattern = re.compile("|".join(rf"(?<![\w.]){re.escape(w)}(?![\w])" for w in sorted(texts, key=len)[::-1]))
    return [s for s in sentences if not pattern.search(s)]


# --- judging ------------------------------------------------------------------------------------------------


def as_parts(exercise: Exercise, guess) -> dict[str, Any]:
    """The answer as {part: value}; a ValueError naming `answer` when its shape is not the exercise's."""
    if not exercise.parts:
        return {"": guess}
    if isinstance(guess, Mapping):
        unknown = sorted(set(map(str, guess)) - set(exercise.parts))
        if unknown:
            raise ValueError(f"answer: {exercise.id} has no part {unknown[0]!r}; its parts are {list(exercise.parts)}")
        return {str(k): v for k, v in guess.items()}
    if isinstance(guess, tuple | list) and len(guess) == len(exercise.parts):
        return dict(zip(exercise.parts, guess))
    raise ValueError(f"answer: {exercise.id} wants {exercise.form or exercise.parts}: a dict of its parts, or a tuple")


def judge(exercise: Exercise, guess, truth) -> Verdict:
    """Compare `guess` with `truth` part by part; a wrong part gets its hint, less any sentence that tells its
    value (another part's value may appear: a hint for one part never says which part it would be)."""
    given = as_parts(exercise, guess)
    truths = {"": truth} if not exercise.parts else dict(truth)
    right, wrong = [], {}
    for part, value in given.items():
        if same(value, truths[part]):
            right.append(part)
        else:
            sentences = (exercise.hints.get(part, ()) if part else ()) + exercise.hints.get("", ())
            wrong[part] = " ".join(filtered(sentences, [truths[part]])) or NO_HINT
    missing = tuple(p for p in truths if p not in given)
    return Verdict(tuple(right), wrong, missing)


def report(exercise: Exercise, verdict: Verdict, truth) -> str:
    """What `check` prints."""
    head = f"{exercise.id} {exercise.title}:"
    if not exercise.parts:
        if verdict.ok:
            return f"{head} ✓ right: {show(truth)}. {exercise.explain} Read: {exercise.code}.".rstrip()
        return f"{head} ✗ not quite: {verdict.wrong['']}"
    lines = [head] + [f"  ✓ {p}" for p in verdict.right]
    lines += [f"  ✗ {p}: {hint}" for p, hint in verdict.wrong.items()]
    lines += [f"  · {p}: not given yet" for p in verdict.missing]
    if verdict.ok:
        lines.append(f"  all right. {exercise.explain} Read: {exercise.code}.".rstrip())
    return "\n".join(lines)
