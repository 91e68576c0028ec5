"""The chapters' worked solutions still print what the chapters say they print.

A solution's code and the output below it were true when written; the engine moves on. So every ```python block
of `## Solutions` says, in an HTML comment on the line above it (invisible once rendered), what a reader does with it:

    <!-- solution: run -->                 run it; the plain ``` block right below holds its printed output, exactly
    <!-- solution: run, numbers within T -->  the same, but each number with a fraction (a float) within T of the
                                           chapter's, relative or absolute (T = 1e-4: math.isclose), integers exact:
                                           a float computed by BLAS differs in its last digits from one CPU to the next
    <!-- solution: run, numbers vary -->   the same, but every number may differ (timings)
    <!-- solution: save NAME -->           save it as NAME (a module a later block imports)
    <!-- solution: pytest NAME -->         save it as NAME and run `pytest NAME`: it must pass
    <!-- solution: not run: WHY -->        not run here, and why

A solution's blocks run in order in a fresh Python process of their own (tests/lessons/solution_session.py), in
an empty folder that holds links to the repository's src/ and tests/, with the repository on PYTHONPATH and
Triton's interpreter on. A block without a comment fails the test, so a new solution is either run or says why not.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need_triton, need_vllm
from tests.lessons.test_exercises import CHAPTERS, ROOT, solutions_in

SESSION = Path(__file__).with_name("solution_session.py")
DIRECTIVE = re.compile(
    r"^<!-- solution: (run|run, numbers vary|run, numbers within (\S+)|save (\S+)|pytest (\S+)|not run: (.+)) -->$"
)
FENCE = re.compile(r"^```(\w*)$")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")
TIMEOUT_S = 900


def blocks_of(lines: list[str]) -> list[tuple[str, str, str | None]]:
    """(language, code, directive line or None) for each fenced block, in order."""
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = lines.index("```", i + 1)
        above = next((line for line in reversed(lines[:i]) if line.strip()), "")
        directive = above if above.startswith("<!-- solution:") else None
        blocks.append((match.group(1), "\n".join(lines[i + 1 : end]) + "\n", directive))
        i = end + 1
    return blocks


def plan(lines: list[str]) -> tuple[list[dict], list[str | None], str | None]:
    """The steps to run, each run step's expected output (None: none shown), and why not run (None: it runs)."""
    steps, expected, blocks = [], [], blocks_of(lines)
    for k, (language, code, directive) in enumerate(blocks):
        if language != "python":
            continue  # an output (read with the block above it), a diff, a shell line: shown, not run
        assert directive, f"a ```{language} block without a <!-- solution: ... --> comment above it:\n{code[:200]}"
        match = DIRECTIVE.match(directive)
        assert match, f"not a solution directive: {directive}"
        action, within, save_as, pytest_file, why = match.groups()
        if why:
            return [], [], why
        following = blocks[k + 1] if k + 1 < len(blocks) else None
        shown = following[1] if following and following[0] == "" else None
        if action.startswith("run"):
            tolerance = float(within) if within else None
            steps.append({"action": "run", "name": None, "code": code, "vary": action.endswith("vary"),
                          "within": tolerance})  # fmt: skip
            expected.append(shown)
        else:
            steps.append({"action": "save" if save_as else "pytest", "name": save_as or pytest_file, "code": code})
            expected.append(None)
    return steps, expected, None


def cases():
    for chapter in CHAPTERS:
        for number, (_, lines) in solutions_in(chapter).items():
            if "```python" in lines:  # chapters 6 and 7 print what kernels and a real model computed
                marks = [pytest.mark.numerics] if chapter.name[:2] in ("06", "07") else []
                yield pytest.param(chapter, number, lines, id=f"{chapter.name[:2]}.{number}", marks=marks)


def shape(text: str) -> str:
    return NUMBER.sub("N", text)


FLOAT = re.compile(r"-?\d+\.\d+(?:e[+-]?\d+)?")


def close(got: str, want: str, tolerance: float) -> bool:
    """The same text, but each float within `tolerance` (relative or absolute) of the chapter's."""
    if FLOAT.sub("F", got) != FLOAT.sub("F", want):
        return False
    pairs = zip(FLOAT.findall(got), FLOAT.findall(want), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=tolerance, abs_tol=tolerance) for a, b in pairs)


@pytest.mark.parametrize("chapter, number, lines", list(cases()))
def test_the_solution_prints_what_the_chapter_shows(chapter: Path, number: int, lines: list[str], tmp_path: Path):
    steps, expected, why = plan(lines)
    if why:
        pytest.skip(f"{chapter.name} exercise {number} is not run: {why}")
    code = "".join(step["code"] for step in steps)
    if "triton" in code:
        need_triton()
    if "vllm_peer" in code:
        need_vllm()
    (tmp_path / "steps.json").write_text(json.dumps(steps), encoding="utf-8")
    session = tmp_path / "session"
    session.mkdir()
    for name in ("src", "tests"):
        (session / name).symlink_to(ROOT / name)
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(SESSION), str(tmp_path / "steps.json"), str(tmp_path / "results.json")],
                   cwd=session, env=env, timeout=TIMEOUT_S, check=True)  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert len(results) == len(steps)
    for k, (step, result, shown) in enumerate(zip(steps, results, expected, strict=True)):
        where = f"{chapter.name}, exercise {number}, block {k + 1} ({step['action']} {step['name'] or 'in session'})"
        assert result["error"] is None, f"{where} failed:\n{result['output']}\n{result['error']}"
        if shown is None:
            continue
        if step["vary"]:
            assert shape(result["output"]) == shape(shown), f"{where} printed another shape of output"
        elif step.get("within") is not None:
            assert close(result["output"], shown, step["within"]), f"{where} printed other numbers than the chapter"
        else:
            assert result["output"] == shown, f"{where} printed something else than the chapter shows"


def test_directives_are_parsed_as_written():
    lines = ["<!-- solution: save m.py -->", "```python", "X = 1", "```", "", "<!-- solution: run -->", "```python",
             "import m; print(m.X)", "```", "", "```", "1", "```"]  # fmt: skip
    steps, expected, why = plan(lines)
    assert why is None and [s["action"] for s in steps] == ["save", "run"] and expected == [None, "1\n"]
    assert plan(["<!-- solution: not run: needs a GPU -->", "```python", "pass", "```"])[2] == "needs a GPU"
    with pytest.raises(AssertionError, match="without a <!-- solution"):
        plan(["```python", "pass", "```"])
    assert shape("linked 0.12 us, 6,720 times, 7.97e+08") == shape("linked 3.5 us, 12 times, 1.1e-02")
    steps, _, _ = plan(["<!-- solution: run, numbers within 1e-4 -->", "```python", "pass", "```"])
    assert steps[0]["within"] == 1e-4 and not steps[0]["vary"]
    assert close("score -11.434471 in 3 steps\n", "score -11.434473 in 3 steps\n", 1e-4)
    assert not close("score -11.43 in 3 steps\n", "score -11.44 in 3 steps\n", 1e-4)
    assert not close("score -11.434471 in 3 steps\n", "score -11.434471 in 4 steps\n", 1e-4)  # integers: exact


def test_the_teachers_chapter_counts_the_solutions_that_run():
    """Chapter 98 says how many worked solutions with code run here; the count is the chapters'."""
    plans = [plan(lines) for _, _, lines in (case.values for case in cases())]
    text = (ROOT / "chapters" / "98-assignments.md").read_text(encoding="utf-8")
    match = re.search(r"\((\d+) of the (\d+)\s+solutions with code run;", text)
    assert match, "chapter 98 no longer states how many solutions run"
    assert match.groups() == (str(sum(why is None for _, _, why in plans)), str(len(plans)))
