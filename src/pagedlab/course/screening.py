"""Course: a submitted body's shape, checked before it runs (a fast first filter; the sandbox is the wall).

Builds on: nothing of pagedlab (it parses text).
Read with: chapters/98-assignments.md (What a body may contain).

The score never rests on this check. A body runs only in a sandbox that holds
no secret (course/sandbox.py), and earns a point only by producing the
reference's observations (course/scenarios/). Screening only refuses, with a
clear reason, a body that could not be spliced into its region:

    does not parse on its own               a syntax error, unbalanced code
    reaches outside its region              a line indented less than the region's first
    drops a function it must define         in a region of whole functions, each of the stub's functions
    holds more than functions               in a region of whole functions

`screen(body, indent, whole_functions)` returns the reasons (empty: accepted).
"""

from __future__ import annotations

import ast
import textwrap


def screen(body: str, indent: str, whole_functions: list[str] | None = None) -> list[str]:
    """Why `body` (the lines between a region's markers, indented by `indent`) cannot be spliced; [] if it can.

    `whole_functions` lists the functions a region of whole functions must define (None: a region of statements).
    """
    reasons = [
        f"line {i}: indented less than the region: code outside it is not accepted"
        for i, line in enumerate(body.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#") and not line.startswith(indent)
    ]
    if reasons:
        return reasons
    try:
        tree = ast.parse(textwrap.dedent(body) if body.strip() else "pass")
    except SyntaxError as e:
        return [f"line {e.lineno}: does not parse on its own ({e.msg})"]
    if whole_functions is None:
        return []
    reasons = [
        f"line {node.lineno}: a region of whole functions holds only function definitions"
        for node in tree.body
        if not isinstance(node, ast.FunctionDef)
    ]
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [name for name in whole_functions if name not in defined]
    return reasons + ([f"line 1: the region must define {', '.join(missing)}"] if missing else [])
