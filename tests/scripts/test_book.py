"""Foundation: `make book` turns the README, chapters and notebooks into one HTML site with no broken links.

Builds on: scripts/book.py.
Read with: README.md (the chapters), tests/test_chapters.py (the same links, checked in the Markdown).

The whole site is built once without executing the notebooks (about a second); one notebook, the
fastest (04, about 5 s on a quiet 2-core CPU, timed with nbclient), is executed through the same
`build` to show that its outputs reach its page. A tiny hand-made repository pins the link
rewriting and the output rendering, and a tiny hand-made site pins the link checker.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path, PurePosixPath

import nbformat
import pytest

from scripts import book
from tests.conftest import need_pyodide
from tests.test_chapters import anchors

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FASTEST = PurePosixPath("notebooks/04_prefix_caching.ipynb")
PNG = base64.b64decode(  # a 1x1 PNG: figures and outputs need bytes, not a picture
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real site, notebooks as committed (not executed); with the live lab, which needs Pyodide."""
    need_pyodide()
    out = tmp_path_factory.mktemp("book") / "book"
    assert book.main(["--out", str(out), "--no-execute", "--no-check"]) == 0
    return out


def ids(page: Path) -> set[str]:
    return set(re.findall(r'\sid="([^"]+)"', page.read_text(encoding="utf-8")))


def test_every_chapter_and_notebook_has_a_page(site: Path):
    pages = [site / "index.html"]
    pages += [site / "chapters" / f"{c.stem}.html" for c in CHAPTERS]
    pages += [site / "notebooks" / f"{n.stem}.html" for n in NOTEBOOKS]
    assert CHAPTERS and NOTEBOOKS and all(p.is_file() for p in pages), [p for p in pages if not p.is_file()]
    nav = re.search(r"<nav>.*?</nav>", (site / "index.html").read_text()).group(0)
    listed = re.findall(r'href="([^"]+)"', nav)  # the sidebar lists every chapter and notebook, in order
    assert listed == ["index.html"] + [f"{d.parent.name}/{d.stem}.html" for d in CHAPTERS + NOTEBOOKS]


def test_the_real_site_has_no_broken_links(site: Path):
    assert book.check_links(site) == []


def test_the_live_lab_is_built_in_and_linked_with_its_knobs(site: Path):
    assert (site / "lab.html").is_file() and (site / "lab" / "pagedlab.zip").is_file()
    chapter = (site / "chapters" / "04-prefix-caching.html").read_text(encoding="utf-8")
    assert 'href="../lab.html#stage=4' in chapter


def test_figures_are_copied_and_shown(site: Path):
    shown = set()
    for chapter in CHAPTERS:
        shown |= set(
            re.findall(r'<img src="\.\./(figures/[^"]+)"', (site / "chapters" / f"{chapter.stem}.html").read_text())
        )
    assert shown, "no chapter shows a figure"
    for rel in shown:
        assert (site / rel).read_bytes() == (ROOT / rel).read_bytes(), rel


@pytest.mark.parametrize("doc", CHAPTERS + [ROOT / "README.md"], ids=lambda d: d.name)
def test_every_heading_anchor_is_an_id(site: Path, doc: Path):
    """Each anchor tests/test_chapters.py lets a link name is an id on the built page (book.slug is its rule)."""
    page = site / ("index.html" if doc.name == "README.md" else f"chapters/{doc.stem}.html")
    assert anchors(doc) <= ids(page), sorted(anchors(doc) - ids(page))


def test_slug_is_githubs_rule():
    assert book.slug("5. The `check_stop` order, twice") == "5-the-check_stop-order-twice"
    assert book.slug("Who owns what?") == "who-owns-what"
    unique = book.Slugger()
    assert [unique("Swap"), unique("Swap"), unique("Swap")] == ["swap", "swap-1", "swap-2"]


def tiny_repo(root: Path) -> Path:
    """A repository in miniature: README, two chapters, a notebook with outputs, a figure, a source file."""
    (root / "chapters").mkdir(parents=True)
    (root / "notebooks").mkdir()
    (root / "figures").mkdir()
    (root / "src").mkdir()
    (root / "README.md").write_text("# Home\n\n[start](chapters/a.md), [nb](notebooks/n.ipynb)\n")
    (root / "chapters" / "a.md").write_text(
        "# A `x`\n\n## Who owns what?\n\n## Who owns what?\n\n"
        "[b](b.md#the-end) [code](../src/m.py) [data](../figures/f.png) [again](#who-owns-what-1) "
        "[home](../README.md) [web](https://example.org) [notebook](../notebooks/n.ipynb)\n\n"
        "![a figure](../figures/f.png)\n\n<!-- numbers from figures/f.json -->\n\n"
        "| a | b |\n|---|---|\n| 1 | ~~2~~ |\n\n```python\nx = '<b>'\n```\n"
    )
    (root / "chapters" / "b.md").write_text("# B\n\n## The end\n")
    (root / "figures" / "f.png").write_bytes(PNG)
    (root / "src" / "m.py").write_text("x = '<b>'\n")
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print('hi')")
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="hello from a cell\n"),
        nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(PNG).decode(), "text/plain": "x"}),
        nbformat.v4.new_output(
            "display_data", data={"text/html": '<iframe srcdoc="&lt;p&gt;step&lt;/p&gt;"></iframe>'}
        ),
        nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=["\x1b[31mValueError\x1b[0m: bad"]),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# N\n\n[chapter](../chapters/a.md#who-owns-what)"), code]
    nbformat.write(nb, root / "notebooks" / "n.ipynb")
    return root


def test_links_and_outputs_of_a_tiny_repo(tmp_path: Path):
    root, out = tiny_repo(tmp_path / "repo"), tmp_path / "site"
    assert book.main(["--root", str(root), "--out", str(out), "--no-execute"]) == 0
    a = (out / "chapters" / "a.html").read_text()
    for href in ("b.html#the-end", "../src/m.py.html", "../figures/f.png", "#who-owns-what-1", "../index.html"):
        assert f'href="{href}"' in a, href
    assert 'href="https://example.org"' in a and 'href="../notebooks/n.html"' in a
    assert 'id="who-owns-what"' in a and 'id="who-owns-what-1"' in a and 'id="a-x"' in a
    assert '<img src="../figures/f.png"' in a and "<table>" in a and "<s>2</s>" in a
    assert "<pre><code class=\"language-python\">x = '&lt;b&gt;'" in a
    assert (out / "figures" / "f.png").read_bytes() == PNG
    assert "x = &#x27;&lt;b&gt;&#x27;" in (out / "src" / "m.py.html").read_text()
    n = (out / "notebooks" / "n.html").read_text()
    assert 'href="../chapters/a.html#who-owns-what"' in n and "hello from a cell" in n
    assert 'src="data:image/png;base64,' in n and '<iframe srcdoc="&lt;p&gt;step&lt;/p&gt;">' in n
    assert '<pre class="error">ValueError: bad</pre>' in n  # the colours are gone
    (root / "chapters" / "c.md").write_text("# C\n\n[gone](missing.md) [nope](b.md#nope)\n")
    assert book.main(["--root", str(root), "--out", str(out), "--no-execute"]) == 1  # a rebuild empties `out`
    assert book.check_links(out) == [
        "chapters/c.html: missing.md (no such file)",
        "chapters/c.html: b.html#nope (no id 'nope' on chapters/b.html)",
    ]


def test_link_checker_on_a_hand_made_site(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.html").write_text('<h2 id="there">B</h2><a name="old">')
    (tmp_path / "pic.png").write_bytes(PNG)
    (tmp_path / "a.html").write_text(
        '<h1 id="here">A</h1><a href="#here">ok</a><a href="sub/b.html#there">ok</a><a href="sub/b.html#old">ok</a>'
        '<img src="pic.png"><a href="https://x.org/y">web</a><a href="mailto:a@b.c">mail</a>'
        '<img src="data:image/png;base64,AAAA"><iframe srcdoc="&lt;a href=&quot;gone.html&quot;&gt;"></iframe>'
        '<a href="missing.html">1</a><a href="sub/b.html#nowhere">2</a><a href="#absent">3</a><img src="gone.png">'
    )
    assert book.check_links(tmp_path) == [
        "a.html: missing.html (no such file)",
        "a.html: sub/b.html#nowhere (no id 'nowhere' on sub/b.html)",
        "a.html: #absent (no id 'absent' on a.html)",
        "a.html: gone.png (no such file)",
    ]


def test_refuses_a_folder_it_did_not_make(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "notes.txt").write_text("mine")
    assert book.main(["--out", str(tmp_path), "--no-execute"]) == 1
    assert "not made by this tool" in capsys.readouterr().err and (tmp_path / "notes.txt").exists()


@pytest.mark.slow
def test_one_notebook_executes_into_its_page(tmp_path: Path):
    """The fastest notebook, run by the kernel as `make book` runs it: its outputs are on its page."""
    book.build(tmp_path, execute=True, only=[FASTEST], log=lambda _: None)
    page = (tmp_path / "notebooks" / f"{FASTEST.stem}.html").read_text()
    assert '<pre class="output' in page and 'src="data:image/' in page
    assert book.check_links(tmp_path) == []


@pytest.mark.slow
def test_a_failing_notebook_fails_the_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    root = tmp_path / "repo"
    (root / "notebooks").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("raise ValueError('boom in a cell')")]
    nbformat.write(nb, root / "notebooks" / "bad.ipynb")
    assert book.main(["--root", str(root), "--out", str(tmp_path / "site")]) == 1
    err = capsys.readouterr().err
    assert "notebooks/bad.ipynb failed to execute" in err and "boom in a cell" in err
