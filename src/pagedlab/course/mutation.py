"""Course: mutants of the reference, made at grade time from a stage's solution regions (the tests assignment).

Builds on: course/regions.py (where a stage's code is), course/drills (the drills' planted faults).
Read with: chapters/98-assignments.md (Tests graded by the bugs they catch).

A mutant is the reference with one small slip in one file, inside one of the
stage's regions, of one of these kinds:

    operator swap       <  <=   >  >=   ==  !=   is  is not   in  not in   +  -   and  or   (one operator)
    off-by-one          an integer constant n  ->  n + 1 or n - 1;  a slice bound b  ->  b + 1 or b - 1
    dropped statement   a simple statement (an assignment, a call, a return, a raise ...)  ->  pass
    negated condition   if c / while c / x if c else y  ->  not (c)
    drill fault         a fault of the incident drills (course/drills: `faults(stage)`), always included

Every candidate is listed in a fixed order; a grading draws `count` of them
with its seed, spread over the stage's tasks and the kinds (the drills' faults
always in). The mutated text replaces only the mutated node's own characters,
so the rest of the file is the reference's, byte for byte. A mutant never
leaves the grader: its report names a kind, a file and a task, never a line.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from pathlib import Path

from pagedlab.course.regions import Region, stage_regions

KINDS = ("operator swap", "off-by-one", "dropped statement", "negated condition")
_SWAPS = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Add: ast.Sub, ast.Sub: ast.Add,
    ast.And: ast.Or, ast.Or: ast.And,
}  # fmt: skip
_KEEP = (ast.Pass, ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)  # dropping these shows nothing


@dataclass(frozen=True)
class Mutant:
    """One slip planted in one file of the reference."""

    path: str  # the file, relative to src/pagedlab ("kv/block_pool.py")
    text: str  # the whole mutated file
    kind: str  # one of KINDS, or a drill fault's kind
    task: str  # the task whose region it is in ("" for a drill fault outside every region)
    label: str  # where and what, for the teacher's eyes only (never in a report): "kv/block_pool.py:93 Lt->LtE"


@dataclass(frozen=True)
class _Site:
    """A node to replace: its characters (1-based lines, 0-based columns, as ast gives them) and the new text."""

    start: tuple[int, int]
    end: tuple[int, int]
    new: str
    kind: str
    what: str


def candidates(root: Path, stage: int) -> list[Mutant]:
    """Every mutant of the stage's regions, in a fixed order (file, then position, then kind)."""
    regions = stage_regions(root, stage)
    found = []
    for path in sorted({r.path for r in regions}):
        text = path.read_text()
        rel = str(path.relative_to(root / "src" / "pagedlab"))
        tree = ast.parse(text)
        reference = ast.dump(tree)
        for region in (r for r in regions if r.path == path):
            for site in _sites(tree, region):
                mutated = _replace(text, site)
                if _differs(mutated, reference):
                    found.append(Mutant(rel, mutated, site.kind, region.task_id, f"{rel}:{site.start[0]} {site.what}"))
    return found


def draw(root: Path, stage: int, seed: int, count: int) -> list[Mutant]:
    """`count` mutants of the stage drawn with `seed` (round robin over tasks, then kinds), and every drill fault."""
    rng = random.Random(f"mutants:{stage}:{seed}")
    buckets: dict[tuple[str, str], list[Mutant]] = {}
    for m in candidates(root, stage):
        buckets.setdefault((m.task, m.kind), []).append(m)
    for bucket in buckets.values():
        rng.shuffle(bucket)
    tasks = sorted({task for task, _ in buckets})
    rng.shuffle(tasks)
    chosen: list[Mutant] = []
    while len(chosen) < count and any(buckets.values()):
        for task in tasks:
            kinds = [k for k in KINDS if buckets.get((task, k))]
            if kinds and len(chosen) < count:
                chosen.append(buckets[(task, rng.choice(kinds))].pop())
    return chosen + drill_mutants(root, stage)


def drill_mutants(root: Path, stage: int) -> list[Mutant]:
    """The drills' faults of the stage as mutants (none where course/drills is absent: a student's copy)."""
    try:
        from pagedlab.course.drills import faults
    except ImportError:
        return []
    regions = stage_regions(root, stage)
    out = []
    for i, fault in enumerate(faults(stage)):
        source = root / "src" / "pagedlab" / fault.path
        text = fault.apply(source.read_text())
        line = source.read_text().split(fault.old)[0].count("\n") + 1
        task = next((r.task_id for r in regions if r.path == source and r.start < line <= r.end + 1), "")
        out.append(Mutant(fault.path, text, fault.kind, task, f"{fault.path}:{line} drill fault {i}"))
    return out


def _sites(tree: ast.Module, region: Region) -> list[_Site]:
    """The mutation sites of the nodes inside the region's code (after its task comment, before END)."""
    first, last = region.start + 1 + region.header + 1, region.end  # 1-based lines of the region's code
    inside = lambda n: hasattr(n, "lineno") and first <= n.lineno and n.end_lineno <= last  # noqa: E731
    docstrings = {id(n.body[0]) for n in ast.walk(tree) if _has_docstring(n)}
    sites = []
    for node in ast.walk(tree):
        if not inside(node):
            continue
        sites += _swaps(node) + _off_by_one(node) + _negations(node)
        if isinstance(node, ast.stmt) and not isinstance(node, _KEEP) and id(node) not in docstrings:
            if not hasattr(node, "body"):  # simple statements only: compound ones are negated instead
                sites.append(_Site(_start(node), _end(node), "pass", "dropped statement", type(node).__name__))
    return sorted(sites, key=lambda s: (s.start, s.end, s.kind, s.new))


def _swaps(node) -> list[_Site]:
    if isinstance(node, ast.Compare):
        out = []
        for i, op in enumerate(node.ops):
            if type(op) in _SWAPS:
                ops = [*node.ops[:i], _SWAPS[type(op)](), *node.ops[i + 1 :]]
                new = ast.Compare(node.left, ops, node.comparators)
                out.append(_site(node, ast.unparse(new), "operator swap", _pair(op)))
        return out
    if isinstance(node, (ast.BinOp, ast.BoolOp, ast.AugAssign)) and type(node.op) in _SWAPS:
        fields = {f: getattr(node, f) for f in node._fields}
        new = type(node)(**{**fields, "op": _SWAPS[type(node.op)]()})
        kind = "operator swap"
        return [_site(node, ast.unparse(ast.fix_missing_locations(new)), kind, _pair(node.op))]
    return []


def _off_by_one(node) -> list[_Site]:
    out = []
    if isinstance(node, ast.Constant) and type(node.value) is int:
        for d in (1, -1):
            out.append(_site(node, repr(node.value + d), "off-by-one", f"{node.value}->{node.value + d}"))
    if isinstance(node, ast.Slice):
        for bound in (node.lower, node.upper):
            if bound is not None and not isinstance(bound, ast.Constant):
                text = ast.unparse(bound)
                out += [_site(bound, f"({text}) + 1", "off-by-one", "slice+1"),
                        _site(bound, f"({text}) - 1", "off-by-one", "slice-1")]  # fmt: skip
    return out


def _negations(node) -> list[_Site]:
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        test = node.test
        return [_site(test, f"not ({ast.unparse(test)})", "negated condition", f"not {type(node).__name__}")]
    return []


def _site(node, new: str, kind: str, what: str) -> _Site:
    return _Site(_start(node), _end(node), new, kind, what)


def _start(node) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _end(node) -> tuple[int, int]:
    return node.end_lineno, node.end_col_offset


def _pair(op) -> str:
    return f"{type(op).__name__}->{_SWAPS[type(op)].__name__}"


def _has_docstring(node) -> bool:
    body = getattr(node, "body", None)
    return (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and bool(body)
            and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str))  # fmt: skip


def _replace(text: str, site: _Site) -> str:
    """`text` with the characters from site.start to site.end (ast's columns count UTF-8 bytes) replaced."""
    lines = text.splitlines(keepends=True)
    (l0, c0), (l1, c1) = site.start, site.end
    head = lines[l0 - 1].encode()[:c0].decode()
    tail = lines[l1 - 1].encode()[c1:].decode()
    return "".join(lines[: l0 - 1]) + head + site.new + tail + "".join(lines[l1:])


def _differs(text: str, reference: str) -> bool:
    """The mutant parses, and its syntax tree is not the reference's (`reference`: its ast.dump)."""
    try:
        return ast.dump(ast.parse(text)) != reference
    except SyntaxError:
        return False
