"""Foundation: the chapters' and README's relative links point at files that exist, and named symbols at their code.

Builds on: nothing (reads Markdown and Python source as text; imports no pagedlab code).
Read with: chapters/00-overview.md.

A chapter that links [`StaticScheduler`](../src/pagedlab/sched/static.py) promises the reader
that `StaticScheduler` is defined in that file; when code moves or is renamed, this test says
which chapter went stale. Links into figures/ are checked separately, because figures are
generated (`pagedlab figures`) and a missing one means "regenerate", not "fix the prose".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "chapters").glob("*.md")) + [ROOT / "README.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)  # fenced code blocks hold diagrams, not links
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SYMBOL = re.compile(r"^`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`$")  # [`Name`], [`Cls.meth`], [`f()`]
EXTERNAL = ("http://", "https://", "mailto:", "ftp://")


def links(doc: Path) -> list[tuple[str, str]]:
    """(link text, target) for every Markdown link outside fenced code."""
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    return [(m.group(1), m.group(2)) for m in LINK.finditer(text)]


def local_targets(doc: Path) -> list[tuple[str, str, Path]]:
    """(link text, raw target, resolved path) for every relative link (no URLs, no pure anchors)."""
    out = []
    for label, target in links(doc):
        if target.startswith(EXTERNAL) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        out.append((label, target, path))
    return out


def is_figure(path: Path) -> bool:
    return (ROOT / "figures") in path.parents


def defines(source: str, name: str) -> bool:
    """Does `source` define `name` (class, def, assignment or annotated field / attribute)?"""
    n = re.escape(name)
    pattern = rf"^\s*(?:async\s+)?(?:class|def)\s+{n}\b|^\s*(?:self\.)?{n}\s*(?::[^=\n]+)?=|^\s*{n}\s*:"
    return re.search(pattern, source, re.M) is not None


def doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_relative_links_resolve(doc: Path):
    missing = [t for _, t, p in local_targets(doc) if not is_figure(p) and not p.exists()]
    assert not missing, f"{doc_id(doc)}: links to missing files: {missing}"


HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def anchors(doc: Path) -> set[str]:
    """GitHub's anchor of every heading outside fenced code: lower case, punctuation dropped, spaces to '-'."""
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", h.replace("`", "").lower()).replace(" ", "-") for h in HEADING.findall(text)}


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_anchors_name_headings(doc: Path):
    """[...](97-architecture.md#invariants) and [...](#measurements) point at a heading that exists."""
    broken = []
    for _, target in links(doc):
        if target.startswith(EXTERNAL) or "#" not in target:
            continue
        file, anchor = target.split("#", 1)
        path = (doc.parent / file).resolve() if file else doc
        if path.suffix == ".md" and path.exists() and anchor not in anchors(path):
            broken.append(target)
    assert not broken, f"{doc_id(doc)}: anchors that name no heading: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_figure_links_resolve(doc: Path):
    missing = [t for _, t, p in local_targets(doc) if is_figure(p) and not p.exists()]
    assert not missing, f"{doc_id(doc)}: figures not generated yet (run `pagedlab figures`): {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_linked_symbols_exist(doc: Path):
    """[`Name`](...py) (or [`Cls.method`]) names something that file defines."""
    stale = []
    for label, target, path in local_targets(doc):
        m = SYMBOL.match(label.strip())
        if not m or path.suffix != ".py" or not path.exists() or label.strip("`").endswith(".py"):
            continue
        source = path.read_text(encoding="utf-8")
        if not all(defines(source, part) for part in m.group(1).split(".")):
            stale.append(f"{label} -> {target}")
    assert not stale, f"{doc_id(doc)}: symbols not defined in the linked file: {stale}"


def test_link_checker_itself(tmp_path: Path):
    """The checker finds what it should and skips URLs, anchors and fenced code."""
    doc = tmp_path / "x.md"
    doc.write_text(
        '[`A`](a.py) [b](https://x.org) [c](#top) ![fig](f.png "t")\n```\n[d](nowhere.md)\n```\n',
        encoding="utf-8",
    )
    assert [(label, t) for label, t, _ in local_targets(doc)] == [("`A`", "a.py"), ("fig", "f.png")]
    doc.write_text("# 5. The `check_stop` order, twice\n## Who owns what?\n", encoding="utf-8")
    assert anchors(doc) == {"5-the-check_stop-order-twice", "who-owns-what"}
    src = "class A:\n    n: int = 0\n    def f(self): ...\nB = 1\n"
    assert all(defines(src, s) for s in ("A", "n", "f", "B")) and not defines(src, "C")
