"""The chapter exercises you can check (lessons/exercises/): every exercise of every chapter is registered and has a
self-check or a worked solution; each self-check accepts the answer the code computes and rejects a wrong one with
a hint that does not hold the answer; each worked solution is a collapsed block that renders.

The chapters are read as text (`## Exercises`: one numbered item per exercise; `## Solutions`: one
`<details><summary>Exercise N: title</summary>` block per worked solution). A chapter that is absent (a student
workspace of `pagedlab assignment make` holds only its stage's) is skipped, never a collection error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from pagedlab.lessons import exercises
from pagedlab.lessons.exercises import EXERCISES
from pagedlab.lessons.exercises.core import NO_HINT, Exercise, filtered, same
from tests.conftest import need_smollm2

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("0[1-9]-*.md"))
SELF_CHECKS = [e for e in EXERCISES.values() if e.truth is not None]
SUMMARY = re.compile(r"^<details><summary>Exercise (\d+): (.+)</summary>$")


def section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return match.group(1) if match else ""


def exercises_in(chapter: Path) -> dict[str, str]:
    """'NN.k' -> the text of exercise k of the chapter (its numbered item in ## Exercises)."""
    items = re.split(r"^(?=\d+\. )", section(chapter.read_text(encoding="utf-8"), "Exercises"), flags=re.M)
    number = chapter.name[:2]
    return {f"{number}.{item.split('.', 1)[0]}": item for item in items if re.match(r"\d+\. ", item)}


def solutions_in(chapter: Path) -> dict[int, tuple[str, list[str]]]:
    """k -> (the summary's title, the block's lines) for each <details> block of ## Solutions."""
    lines, blocks, current = section(chapter.read_text(encoding="utf-8"), "Solutions").splitlines(), {}, None
    for line in lines:
        if line.startswith("<details>"):
            assert current is None, f"{chapter.name}: a <details> inside another: {line}"
            match = SUMMARY.match(line)
            assert match, f"{chapter.name}: a <details> line must be <details><summary>Exercise N: title</summary>"
            current = (int(match.group(1)), match.group(2), [line])
        elif current is not None:
            current[2].append(line)
            if line.startswith("</details>"):
                blocks[current[0]] = (current[1], current[2])
                current = None
    assert current is None, f"{chapter.name}: a <details> block is never closed"
    return blocks


def title_of(text: str) -> str:
    match = re.match(r"\d+\. \*\*(.+?)\.?\*\*", text)
    return match.group(1) if match else ""


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_every_exercise_of_the_chapter_is_registered_with_its_title(chapter: Path):
    found = exercises_in(chapter)
    registered = {i for i in EXERCISES if i.startswith(chapter.name[:2] + ".")}
    assert found and set(found) == registered, (sorted(found), sorted(registered))
    for exercise_id, text in found.items():
        assert title_of(text) == EXERCISES[exercise_id].title, exercise_id


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_each_exercise_says_how_to_check_it_and_has_a_self_check_or_a_worked_solution(chapter: Path):
    solved = solutions_in(chapter)
    for exercise_id, text in exercises_in(chapter).items():
        exercise, number = EXERCISES[exercise_id], int(exercise_id.split(".")[1])
        assert exercise.truth is not None or exercise.solution, exercise_id
        assert exercise.solution == (number in solved), f"{exercise_id}: registry and Solutions disagree"
        if exercise.truth is not None:
            assert f'exercises.check("{exercise_id}"' in text, f"{exercise_id}: no Check line"
        if exercise.solution:
            assert "[Solution](#solutions)" in text and solved[number][0] == exercise.title, exercise_id


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_solutions_are_collapsed_blocks_that_render_their_markdown(chapter: Path):
    text = chapter.read_text(encoding="utf-8")
    assert text.rstrip().endswith("</details>") and re.search(r"^## Solutions\n", text, re.M), "Solutions come last"
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])  # scripts/book.py's renderer
    for number, (_, lines) in solutions_in(chapter).items():
        # CommonMark ends an HTML block at a blank line: one after the summary and one before </details>, so
        # that the Markdown between them is rendered (as GitHub renders it), not shown as raw text.
        assert lines[1] == "" and lines[-2] == "" and lines[-1] == "</details>", f"exercise {number}"
        html = md.render("\n".join(lines))
        assert html.startswith(f"<details><summary>Exercise {number}: ") and html.rstrip().endswith("</details>")
        assert "<p>" in html, f"exercise {number}: its Markdown is not rendered"


def test_the_teachers_chapter_lists_exactly_the_graded_exercises():
    teachers = section((ROOT / "chapters/98-assignments.md").read_text(encoding="utf-8"), "Graded exercises")
    listed = set(re.findall(r"^\| (\d\d\.\d) \|", teachers, re.M))
    assert listed == {e.id for e in exercises.graded()}
    assert all(len(e.graded) > 20 for e in exercises.graded())


# --- the self-checks ----------------------------------------------------------------------------------------


def wrong(value):
    """A value of the same kind that is not `value`."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + " not"
    if isinstance(value, set | frozenset):
        return set(value) ^ {"no such thing"}
    if isinstance(value, Mapping):
        return {**value, "no such key": 0}
    return [*value, -1]


def tells(hint: str, value) -> bool:
    """Does `hint` hold `value`'s text (a number as a whole word)?"""
    if isinstance(value, int | float) and not isinstance(value, bool):
        texts = {str(value), f"{value:g}"} if isinstance(value, float) else {str(value)}
        return any(re.search(rf"(?<![\w.]){re.escape(t)}(?![\w])", hint) for t in texts)
    return str(value) in hint or exercises.show(value) in hint


def parts(exercise: Exercise, truth) -> dict:
    return dict(truth) if exercise.parts else {"": truth}


def check_one(exercise: Exercise, capsys):
    truth = exercises.answer(exercise.id)
    assert exercises.check(exercise.id, truth) is True
    assert "✓" in capsys.readouterr().out
    given = {p: wrong(v) for p, v in parts(exercise, truth).items()}
    guess = given if exercise.parts else given[""]
    assert exercises.check(exercise.id, guess) is False
    assert "✗" in capsys.readouterr().out
    verdict = exercises.verdict(exercise.id, guess)
    assert set(verdict.wrong) == set(given) and not verdict.right
    for part, hint in verdict.wrong.items():
        assert hint != NO_HINT, f"{exercise.id} {part}: every hint sentence told the answer"
        assert not tells(hint, parts(exercise, truth)[part]), f"{exercise.id} {part}: {hint}"
    if exercise.parts:  # one part at a time: right, and the others not given yet
        first = exercise.parts[0]
        assert exercises.check(exercise.id, {first: truth[first]}) is False
        out = capsys.readouterr().out
        assert f"✓ {first}" in out and "not given yet" in out


@pytest.mark.parametrize("exercise", [e for e in SELF_CHECKS if not e.needs], ids=lambda e: e.id)
def test_a_self_check_accepts_the_truth_and_rejects_a_wrong_answer_without_telling(exercise, capsys):
    check_one(exercise, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("exercise", [e for e in SELF_CHECKS if e.needs == "smollm2"], ids=lambda e: e.id)
def test_a_self_check_on_smollm2(exercise, capsys):
    need_smollm2()
    check_one(exercise, capsys)


def test_the_truths_are_the_engines_on_the_chapters_walk_throughs():
    # Where a chapter's walk-through states what its exercise's run starts from, the run agrees with it.
    step3 = exercises.answer("05.1")
    assert step3["fed"]["1"] == 1 and step3["samples"] == {"1"}  # "Why does request 1 get 1 token?"
    regions = exercises.answer("01.1")
    assert regions["R"] == math.ceil(1024 / 16) and regions["unused"] == 1000 % regions["R"]
    copies = exercises.answer("03.1")
    assert copies["prefill_11"] == 10 and copies["copies_13"] == 0  # p - 1 tokens; a new block needs no copy


def test_bad_input_is_a_value_error_naming_the_field(capsys):
    with pytest.raises(ValueError, match="exercise: no exercise '99.9'"):
        exercises.check("99.9", 1)
    with pytest.raises(ValueError, match="exercise: 01.6 .* worked solution"):
        exercises.answer("01.6")
    with pytest.raises(ValueError, match="answer: 01.1 has no part 'regions'"):
        exercises.check("01.1", {"regions": 3})
    with pytest.raises(ValueError, match="answer: 01.1 wants"):
        exercises.check("01.1", (64, 15))
    assert exercises.check("01.1") is False and "in place of the `...`" in capsys.readouterr().out


def test_answers_are_compared_as_their_kind():
    assert same({"3", 4}, {3, "4"}) and not same({3}, {3, 4})  # request ids as text or numbers, any order
    assert same([3, 2], (3, 2)) and not same([2, 3], [3, 2])  # a block table or a queue: in order
    assert same(" Of", " of") and same(2, "2") and not same(True, 1) and not same(1, True)
    assert same(0.505, 0.5) is True and same(0.6, 0.5) is False  # floats to 1 %
    assert same({"A": [0, 1]}, {"A": (0, 1)}) and not same({"A": [0, 1]}, {"A": [0, 1], "B": []})


def test_a_hint_sentence_that_holds_the_answer_is_dropped():
    sentences = ["It takes 12 blocks.", "Count the blocks of step 2.", "Look at [0, 1].", "Version 0.12 is fine."]
    assert filtered(sentences, [12]) == sentences[1:]
    assert filtered(sentences, [[0, 1]]) == [sentences[0], sentences[1], sentences[3]]
    assert filtered(sentences, [{0, 1}]) == [sentences[0], sentences[1], sentences[3]]
