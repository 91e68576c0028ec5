"""Course: copying is a separate question: how alike two bodies are once names and literals are abstracted.

Builds on: nothing of pagedlab (it parses bodies as text).
Read with: chapters/98-assignments.md (Copying).

A student may paste the public reference, or a classmate's work, and rename
things. That is plagiarism, not forging, so the grader does not refuse it; it
points at it for the teacher. Each body becomes the pre-order list of its
syntax tree's node types, with every name (variables, arguments, attributes,
functions) and every literal replaced by its kind, and docstrings dropped:

    if block is self.tail: raise ValueError("x")   ->   If Compare Name Is Attribute Name Raise Call Name Const:str

Two bodies' similarity is difflib's ratio of those lists (1.0: the same code
up to names, literals, comments and layout). A pair of submissions is flagged
when their stage-wide similarity (every task both started, weighted by size)
reaches the threshold, and so is a submission against the reference.
"""

from __future__ import annotations

import ast
import difflib
import textwrap

THRESHOLD = 0.9  # stage-wide similarity from which a pair is flagged (honest solutions measured well below it)
MIN_TOKENS = 30  # a body shorter than this (a one-line formula) says nothing about copying


def tokens(lines: list[str]) -> list[str]:
    """The body's normalized syntax: node types in pre-order, names and literals reduced to their kind."""
    try:
        tree = ast.parse(textwrap.dedent("\n".join(lines)))
    except SyntaxError:
        return []
    out: list[str] = []
    for node in tree.body:
        _walk(node, out)
    return out


def _walk(node: ast.AST, out: list[str]) -> None:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return  # a docstring or a bare string: prose, not code
    if isinstance(node, ast.Constant):
        out.append(f"Const:{type(node.value).__name__}")
        return
    if isinstance(node, (ast.expr_context, ast.Load, ast.Store, ast.Del)):
        return
    out.append(type(node).__name__)
    for child in ast.iter_child_nodes(node):
        _walk(child, out)


def ratio(a: list[str], b: list[str]) -> float:
    """1.0 for the same normalized code; 0.0 for nothing in common (or an empty side)."""
    if not a or not b:
        return 0.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def stage_similarity(a: dict[str, list[str]], b: dict[str, list[str]]) -> tuple[float, dict[str, float]]:
    """(the size-weighted similarity over the tasks both bodies hold, {task: its similarity}); tasks whose bodies
    are both shorter than MIN_TOKENS are left out."""
    per, weights = {}, {}
    for task in sorted(a.keys() & b.keys()):
        if max(len(a[task]), len(b[task])) < MIN_TOKENS:
            continue
        per[task] = ratio(a[task], b[task])
        weights[task] = len(a[task]) + len(b[task])
    total = sum(weights.values())
    return (sum(per[t] * weights[t] for t in per) / total if total else 0.0), per


def flag_pairs(bodies: dict[str, dict[str, list[str]]], reference: dict[str, list[str]], threshold=THRESHOLD):
    """[(submission, other or "reference", similarity, {task: similarity})] for every pair at or above the
    threshold, most alike first. `bodies`: {submission: {task: normalized tokens}} of the started tasks."""
    names = sorted(bodies)
    pairs = []
    for i, name in enumerate(names):
        for other, theirs in [("reference", reference)] + [(n, bodies[n]) for n in names[i + 1 :]]:
            score, per = stage_similarity(bodies[name], theirs)
            if score >= threshold:
                pairs.append((name, other, round(score, 3), {t: round(s, 3) for t, s in per.items()}))
    return sorted(pairs, key=lambda p: -p[2])


def all_pairs(bodies: dict[str, dict[str, list[str]]], reference: dict[str, list[str]]) -> list[tuple]:
    """Every pair's stage-wide similarity (the reference included), most alike first: for a teacher's table."""
    return flag_pairs(bodies, reference, threshold=-1.0)
