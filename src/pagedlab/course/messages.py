"""Course: what a sandboxed child may say, read as a strict schema before the parent uses any of it.

Builds on: nothing of pagedlab (bytes in, plain records out).
Read with: course/grading.py, course/feedback.py, chapters/98-assignments.md (The boundary).

A child's lines are the only thing that crosses the boundary, and student code
can write any of them. Each is read here and kept only if it has one of the
shapes below, every type, length and count in range; anything else is dropped,
as if it had never been written (a case then has no result, and fails):

    the scenarios' child (course/run_scenarios.py)
      {"start": case}                              case: one of those the parent asked for
      {"case": case, "obs": value}                 value: JSON data, nested at most 48 deep, at most 200,000
                                                   values, strings of at most 4,096 characters, |ints| < 2**63
      {"case": case, "error": name, "at": [file, line]}
                                                   name: an identifier of at most 60 characters;
                                                   file: a .py file of the tree; 0 <= line <= its length
      a line naming an asked case in any other shape becomes {"case": case, "unreadable": true}: it counts as
      a report of that case (so beside a valid one, the case was reported twice), with no result
    the tests' child (course/grading_runner.py)
      {"start": test}                              test: an id in one of the files the parent asked for
      {"result": test, "outcome": "passed" | "failed" | "skipped" | "unknown", "message": text <= 4,000,
       "tasks": [task, ...], "gpu": bool}          tasks: among those the parent asked for
      {"collected": [{"id": test, "tasks": [task, ...]}, ...]}   {"collect_error": test, "longrepr": text}
    the mutants' child (course/mutation_runner.py)
      {"start": variant}                           variant: one of the ids the parent gave
      {"variant": variant, "verdict": "passed" | "failed" | "timeout" | "crashed", "seconds": number}, and
        "tests": [[test, outcome], ...]            test: an id in an asked file (or the file); at most 10,000
        or "obs": plain JSON data                  (a scenarios run: no student code in its tree)
"""

from __future__ import annotations

import builtins
import json
from functools import cache
from pathlib import Path

MAX_LINE = 8 << 20  # bytes in one line (a stage-6 case's tensors take a few hundred KiB)
MAX_DEPTH = 48
MAX_VALUES = 200_000
MAX_STRING = 4096
MAX_TEXT = 4000  # a test's message
MAX_INT = 1 << 63
KNOWN_ERRORS = frozenset(
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), BaseException)
) | {"InvariantError", "CaseTimeout", "CalledProcessError"}  # fmt: skip  (named in a report whatever the tree held)
OUTCOMES = ("passed", "failed", "skipped", "unknown")
VERDICTS = ("passed", "failed", "timeout", "crashed")


def lines(output: bytes) -> list[dict]:
    """Every line of `output` that is a JSON object within MAX_LINE bytes (split on "\\n" only)."""
    found = []
    for line in output.split(b"\n"):
        if not line.strip() or len(line) > MAX_LINE:
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            continue
        if isinstance(msg, dict):
            found.append(msg)
    return found


def scenario_messages(output: bytes, cases: list[str], tree: Path) -> list[dict]:
    """The scenarios' child's valid messages, in order (see the module's docstring)."""
    asked, kept = set(cases), []
    for msg in lines(output):
        keys, case = set(msg), msg.get("case")
        if keys == {"start"} and msg["start"] in asked:
            kept.append(msg)
        elif keys == {"done"} and msg["done"] is True:
            kept.append(msg)
        elif not isinstance(case, str) or case not in asked:
            continue
        elif keys == {"case", "obs"} and is_plain(msg["obs"]):
            kept.append(msg)
        elif keys == {"case", "error", "at"} and _error_name(msg["error"]) and _place(msg["at"], tree):
            kept.append(msg)
        else:
            kept.append({"case": case, "unreadable": True})
    return kept


def test_messages(output: bytes, files: list[str], tasks: list[str]) -> list[dict]:
    """The tests' child's valid messages, in order (see the module's docstring)."""
    kept = []
    for msg in lines(output):
        keys = set(msg)
        if keys == {"start"} and _test_id(msg["start"], files):
            kept.append(msg)
        elif "result" in msg and _result(msg, files, tasks):
            kept.append({k: msg[k] for k in ("result", "outcome", "message", "tasks", "gpu")})
        elif keys == {"collected"} and isinstance(msg["collected"], list) and len(msg["collected"]) <= 10_000:
            if all(_collected(c, files, tasks) for c in msg["collected"]):
                kept.append(msg)
        elif keys == {"collect_error", "longrepr"} and all(_text(msg[k]) for k in keys):
            kept.append(msg)
    return kept


def variant_messages(output: bytes, variants: list[str], files: list[str]) -> list[dict]:
    """The mutants' child's valid messages, in order (see the module's docstring); a variant reported twice keeps
    its first report only when both are equal (else neither: an unknown outcome)."""
    asked, kept, seen = set(variants), [], {}
    for msg in lines(output):
        keys = set(msg)
        if keys == {"start"} and msg["start"] in asked:
            kept.append(msg)
        elif msg.get("variant") in asked and _variant(msg, files):
            kept.append(msg)
            seen[msg["variant"]] = seen.get(msg["variant"], 0) + 1
    twice = {v for v, n in seen.items() if n > 1}
    return [m for m in kept if m.get("variant") not in twice]


def _variant(msg: dict, files: list[str]) -> bool:
    base = {"variant", "verdict", "seconds"}
    if msg.get("verdict") not in VERDICTS or type(msg.get("seconds")) not in (int, float) or msg["seconds"] < 0:
        return False
    if set(msg) == base:
        return True
    if set(msg) == base | {"obs"}:
        return is_plain(msg["obs"])
    tests = msg.get("tests")
    return (set(msg) == base | {"tests"} and isinstance(tests, list) and len(tests) <= 10_000
            and all(isinstance(t, list) and len(t) == 2 and (_test_id(t[0], files) or t[0] in files)
                    and t[1] in OUTCOMES for t in tests))  # fmt: skip


def is_plain(value) -> bool:
    """JSON data within the bounds: depth, number of values, string length, integer size (walked without
    recursion, so a deep value cannot overflow the parent's stack)."""
    stack, count = [(value, 0)], 0
    while stack:
        item, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_VALUES:
            return False
        if isinstance(item, dict):
            if not all(isinstance(k, str) and len(k) <= MAX_STRING for k in item):
                return False
            stack += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, depth + 1) for v in item]
        elif isinstance(item, str):
            if len(item) > MAX_STRING:
                return False
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -MAX_INT < item < MAX_INT:
                return False
        elif not (item is None or isinstance(item, (bool, float))):
            return False
    return True


def _error_name(name) -> bool:
    return isinstance(name, str) and len(name) <= 60 and name.isascii() and name.isidentifier()


def _place(at, tree: Path) -> bool:
    """[file, line]: a .py file of the tree's src/ (or "", 0: nowhere) and a line it has."""
    if not (isinstance(at, list) and len(at) == 2 and isinstance(at[0], str) and type(at[1]) is int):
        return False
    if at == ["", 0]:
        return True
    if len(at[0]) > 200 or not at[0].endswith(".py") or ".." in Path(at[0]).parts:
        return False
    return 0 <= at[1] <= _num_lines(tree / "src" / at[0])


@cache
def _num_lines(path: Path) -> int:
    """How many lines the file has (-1: no such file, so no line can be in it)."""
    try:
        return path.read_bytes().count(b"\n") + 1 if path.is_file() else -1
    except OSError:
        return -1


def _test_id(test, files: list[str]) -> bool:
    return isinstance(test, str) and len(test) <= 500 and any(test.startswith(f + "::") for f in files)


def _text(value) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _tasks(value, tasks: list[str]) -> bool:
    return isinstance(value, list) and len(value) <= len(tasks) and all(t in tasks for t in value)


def _result(msg: dict, files: list[str], tasks: list[str]) -> bool:
    return (_test_id(msg.get("result"), files) and msg.get("outcome") in OUTCOMES and _text(msg.get("message"))
            and _tasks(msg.get("tasks"), tasks) and type(msg.get("gpu")) is bool)  # fmt: skip


def _collected(entry, files: list[str], tasks: list[str]) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == {"id", "tasks"}
        and _test_id(entry["id"], files)
        and _tasks(entry["tasks"], tasks)
    )
