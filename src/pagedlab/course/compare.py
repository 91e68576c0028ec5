"""Course: comparing a student's observations with the reference's, and saying where they first differ.

Builds on: nothing (plain JSON data in, a sentence out).
Read with: chapters/98-assignments.md (Scenarios).

Equal means equal as JSON, with types kept apart (True is not 1, 1 is not 1.0), except inside
{"floats": [...], "tol": t} where each number may differ by t + t * |expected| (torch's assert_close).
The tolerance is always the reference's. Where they differ, the sentence shows the expected value and the
student's only when it is small, plain data (numbers, and strings the expected value already holds), so
nothing of the student's process travels into a report as free text:

    after op 3 ("remove"), item 3: expected [[1, 3], [1, 3]], got [[1, 3, 4], [1, 3]]
"""

from __future__ import annotations

import json
import math
import re

_ERROR_NAME = re.compile(r"[A-Za-z_]\w{0,39}(Error|Exception|Interrupt|Exit|Timeout)")


def first_difference(expected, got, echo: bool = True) -> str | None:
    """None when `got` equals `expected`; else where they first differ, in one line. Without `echo` the student's
    value is never shown (its tree held another task's reference, which a value could carry out)."""
    found = _diff(expected, got, [])
    if found is None:
        return None
    path, want, have = found
    where = _describe(expected, path)
    shown = _show(have, _strings(expected)) if echo else "a different value"
    return f"{where}expected {_clip(json.dumps(want))}, got {shown}"


def _diff(want, have, path):
    if isinstance(want, dict) and set(want) == {"floats", "tol"}:
        return _diff_floats(want, have, path)
    if isinstance(want, dict):
        if not isinstance(have, dict) or set(have) != set(want):
            return path, want, have
        for key in want:
            found = _diff(want[key], have[key], [*path, key])
            if found:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            return path, want, have
        for i, (w, h) in enumerate(zip(want, have)):
            found = _diff(w, h, [*path, i])
            if found:
                return found
        return None
    same = type(want) is type(have) and want == have
    return None if same else (path, want, have)


def _diff_floats(want: dict, have, path):
    values = have.get("floats") if isinstance(have, dict) else None
    if not isinstance(values, list) or len(values) != len(want["floats"]):
        return path, want, have
    tol = want["tol"]
    for i, (w, h) in enumerate(zip(want["floats"], values)):
        ok = isinstance(h, (int, float)) and not isinstance(h, bool) and math.isfinite(h)
        if not ok or abs(h - w) > tol + tol * abs(w):
            return [*path, i], w, h
    return None


def _describe(expected, path: list) -> str:
    """The path as words: "op 3 ("remove")" for an entry of a program, "step 4" in a story, then keys and items."""
    words, node, previous = [], expected, None
    for key in path:
        if isinstance(node, dict) and set(node) == {"floats", "tol"}:
            node = node["floats"]  # the numbers themselves
        entry = node[key]
        if (
            previous is None
            and isinstance(key, int)
            and isinstance(entry, list)
            and entry
            and isinstance(entry[0], str)
        ):
            words.append(f'op {key + 1} ("{entry[0]}")')
        elif previous == "steps":
            words.append(f"step {key}")
        elif key != "steps":
            words.append(str(key) if isinstance(key, str) else f"item {key}")
        node, previous = entry, key
    return (", ".join(words) + ": ") if words else ""


def _strings(value) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return {s for k, v in value.items() for s in _strings(k) | _strings(v)}
    if isinstance(value, list):
        return {s for v in value for s in _strings(v)}
    return set()


def _show(value, known: set[str]) -> str:
    """The student's value, only as small plain data: else a placeholder (the sandbox never writes free text)."""
    text = json.dumps(value)
    return text if len(text) <= 160 and _plain(value, known) else "a different value"


def _plain(value, known: set[str]) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) < 1 << 31
    if isinstance(value, float):
        return True
    if isinstance(value, str):
        return value in known or value in ("ok", "raised") or bool(_ERROR_NAME.fullmatch(value))
    if isinstance(value, list):
        return all(_plain(v, known) for v in value)
    if isinstance(value, dict):
        return all(_plain(k, known) and _plain(v, known) for k, v in value.items())
    return False


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 5] + " ...]"
