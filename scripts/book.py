"""`make book`: the README, the chapters and the executed notebooks as one static HTML site to read in a browser.

Builds on: nothing of the engine (reads README.md, chapters/, notebooks/, figures/ and src/ as files; the notebooks
run in a Jupyter kernel through nbclient, as `pytest --nbmake` runs them).
Read with: README.md, chapters/00-overview.md.

    python scripts/book.py --out build/book [--no-execute] [--no-check]

The site mirrors the repository's layout, so a relative link that works on GitHub works here once its
suffix is changed:

    README.md                  ->  index.html
    chapters/NN-name.md        ->  chapters/NN-name.html          (#anchors kept: headings get GitHub's ids)
    notebooks/NN_name.ipynb    ->  notebooks/NN_name.html         (executed first, unless --no-execute)
    figures/*                  ->  figures/*                      (copied as they are)
    src/pagedlab/viz/lab.html  ->  lab.html, lab/                 (the live lab, built: `pagedlab lab --html`)
    any other linked file      ->  its path + .html               (src/pagedlab/llm.py.html: the file in a <pre>)

The live lab is the one part built with pagedlab itself (tools/lab.py; it needs `pagedlab fetch pyodide`): a
chapter links the page's template, `src/pagedlab/viz/lab.html#stage=4&...`, which GitHub shows as source, and the
book turns that link into its own working `lab.html#stage=4&...` (a fragment of knobs, not an id: not checked).

Every page gets the same sidebar (the chapters and the notebooks). After writing, `check_links` reads the
built HTML back and reports each relative href or src that names a missing file or a missing id; the build
exits non-zero when it finds any, so a link that is broken in the browser is broken in CI.
"""

from __future__ import annotations

import argparse
import html
import os
import posixpath
import re
import shutil
import sys
import time
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.token import Token

if TYPE_CHECKING:
    from nbformat import NotebookNode

ROOT = Path(__file__).resolve().parents[1]  # the source checkout: scripts/book.py
MARKER = ".pagedlab-book"  # written into the output folder, so a rebuild may empty it (and nothing else)
LAB_SOURCE = PurePosixPath("src/pagedlab/viz/lab.html")  # a link to it is a link to the built lab
LAB_PAGE = "lab.html"
SCHEME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//)")  # http:, https:, mailto:, data:, //host: not ours to check
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours in tracebacks and rich output, meaningless in a <pre>
CELL_TIMEOUT_S = 300
# One representation per output, the richest a static page can show; the order nbconvert's HTML exporter uses.
MIME_ORDER = ("text/html", "image/svg+xml", "image/png", "image/jpeg", "text/markdown", "text/plain")


class BookError(Exception):
    """The site cannot be built: a notebook failed, or the output folder is not ours to overwrite."""


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's source text, the rule tests/test_chapters.py checks the chapters' links with.

    Lower case, backticks and punctuation other than '-' and '_' dropped, spaces to '-':
    "5. The `check_stop` order, twice" -> "5-the-check_stop-order-twice".
    """
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")


class Slugger:
    """Unique ids within one page: a repeated heading gets GitHub's "-1", "-2" (the first keeps the plain one)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, heading: str) -> str:
        base = slug(heading)
        n = self.seen.get(base, 0)
        self.seen[base] = n + 1
        return base if n == 0 else f"{base}-{n}"


def out_path(src: PurePosixPath) -> PurePosixPath:
    """Where a repository file (relative to the root) lands in the site."""
    if src == PurePosixPath("README.md"):
        return PurePosixPath("index.html")
    if src.suffix in (".md", ".ipynb"):
        return src.with_suffix(".html")
    if src.parts[:1] == ("figures",):
        return src  # copied, not rendered
    return PurePosixPath(f"{src}.html")  # a source page: src/pagedlab/llm.py.html


@dataclass
class Page:
    """One rendered page, before the shared sidebar is put around it."""

    src: PurePosixPath  # relative to the repository root
    title: str
    body: str

    @property
    def out(self) -> PurePosixPath:
        return out_path(self.src)

    @property
    def section(self) -> str:
        """The sidebar's section: "home", "chapters" or "notebooks"; or "other" (a linked file, not listed)."""
        if self.src == PurePosixPath("README.md"):
            return "home"
        if self.src.suffix == ".ipynb":
            return "notebooks"
        return "chapters" if self.src.parts[:1] == ("chapters",) and self.src.suffix == ".md" else "other"


@dataclass
class Site:
    """The pages of one build. Rendering a page may find links to files that need a page of their own (`wanted`)."""

    root: Path = ROOT
    md: MarkdownIt = field(default_factory=lambda: MarkdownIt("commonmark").enable(["table", "strikethrough"]))
    wanted: set[PurePosixPath] = field(default_factory=set)
    lab: bool = False  # a page links the live lab: build it

    # -- links -------------------------------------------------------------------------------------------------

    def rewrite(self, target: str, page: PurePosixPath) -> str:
        """A link as written in `page`'s source, as it must read in the built page.

        A target that is missing (or outside the repository) is left as written: the link checker then
        reports it under the name the author typed, which is the name to fix.
        """
        if not target or target.startswith("#") or SCHEME.match(target):
            return target
        path, hash_, anchor = target.partition("#")
        file = (self.root / page).parent / unquote(path)
        try:
            src = PurePosixPath(file.resolve().relative_to(self.root.resolve()).as_posix())
        except ValueError:
            return target
        if not file.is_file():
            return target
        if src == LAB_SOURCE:
            self.lab = True
            return posixpath.relpath(LAB_PAGE, str(out_path(page).parent)) + hash_ + anchor
        if src.parts[:1] != ("figures",):
            self.wanted.add(src)
        return posixpath.relpath(str(out_path(src)), str(out_path(page).parent)) + hash_ + anchor

    # -- Markdown ----------------------------------------------------------------------------------------------

    def markdown(self, text: str, page: PurePosixPath, ids: Slugger) -> tuple[str, str | None]:
        """(HTML, the text of the first h1 or None) for Markdown found in `page`: ids on headings, links rewritten."""
        tokens = self.md.parse(text)
        title = None
        for i, tok in enumerate(tokens):
            if tok.type == "heading_open":
                heading = tokens[i + 1].content
                tok.attrSet("id", ids(heading))
                if tok.tag == "h1" and title is None:
                    title = heading.replace("`", "")
            elif tok.type == "inline":
                self._rewrite_inline(tok.children or [], page)
        return self.md.renderer.render(tokens, self.md.options, {}), title

    def _rewrite_inline(self, children: list[Token], page: PurePosixPath) -> None:
        for child in children:
            for attr in ("href",) if child.type == "link_open" else ("src",) if child.type == "image" else ():
                value = child.attrGet(attr)
                if isinstance(value, str):
                    child.attrSet(attr, self.rewrite(value, page))

    def markdown_page(self, src: PurePosixPath) -> Page:
        body, title = self.markdown((self.root / src).read_text(encoding="utf-8"), src, Slugger())
        return Page(src, title or src.name, body)

    # -- notebooks ---------------------------------------------------------------------------------------------

    def notebook_page(self, src: PurePosixPath, execute: bool) -> Page:
        import nbformat  # the dev extra's (nbmake needs it); imported here so that `--help` works without it

        nb = nbformat.read(self.root / src, as_version=4)
        if execute:
            run_notebook(nb, self.root / src, str(src))
        ids, parts, title = Slugger(), [], None
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                body, h1 = self.markdown(cell.source, src, ids)
                title = title or h1
                parts.append(f'<div class="cell markdown">{body}</div>')
            elif cell.cell_type == "code":
                outputs = "".join(self.output(out, src, ids) for out in cell.get("outputs", []))
                code = f'<pre class="input"><code class="language-python">{html.escape(cell.source)}</code></pre>'
                parts.append(f'<div class="cell code">{code}{outputs}</div>')
        return Page(src, title or src.name, "\n".join(parts))

    def output(self, out: dict, page: PurePosixPath, ids: Slugger) -> str:
        """One cell output as HTML: the first representation of MIME_ORDER that it has."""
        kind = out.get("output_type")
        if kind == "stream":
            return f'<pre class="output {out.get("name", "stdout")}">{html.escape(strip_ansi(out["text"]))}</pre>'
        if kind == "error":
            text = "\n".join(out.get("traceback") or [f"{out.get('ename')}: {out.get('evalue')}"])
            return f'<pre class="error">{html.escape(strip_ansi(text))}</pre>'
        data = out.get("data", {})
        mime = next((m for m in MIME_ORDER if m in data), None)
        if mime is None:
            return ""
        value = data[mime] if isinstance(data[mime], str) else "".join(data[mime])
        if mime == "text/html":
            return f'<div class="output html">{value}</div>'  # as is: the step-through views are <iframe srcdoc>
        if mime == "image/svg+xml":  # as an image, not inline: an SVG's own ids and <?xml?> prolog stay inside it
            return f'<img class="output" alt="" src="data:image/svg+xml;base64,{b64encode(value.encode()).decode()}">'
        if mime in ("image/png", "image/jpeg"):
            return f'<img class="output" alt="" src="data:{mime};base64,{"".join(value.split())}">'
        if mime == "text/markdown":
            return f'<div class="output markdown">{self.markdown(value, page, ids)[0]}</div>'
        return f'<pre class="output">{html.escape(strip_ansi(value))}</pre>'

    # -- other files -------------------------------------------------------------------------------------------

    def source_page(self, src: PurePosixPath) -> Page:
        text = (self.root / src).read_text(encoding="utf-8", errors="replace")
        lang = {".py": "python", ".md": "markdown"}.get(src.suffix, "text")
        body = f'<h1><code>{html.escape(str(src))}</code></h1>\n<pre class="source"><code class="language-{lang}">'
        return Page(src, str(src), body + html.escape(text) + "</code></pre>")

    def page(self, src: PurePosixPath, execute: bool = True) -> Page:
        if src.suffix == ".ipynb":
            return self.notebook_page(src, execute)
        if src.suffix == ".md":
            return self.markdown_page(src)
        return self.source_page(src)


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def run_notebook(nb: NotebookNode, path: Path, name: str) -> None:
    """Execute `nb` in place as nbmake does: the python3 kernel, the notebook's own folder as cwd, one torch thread.

    Any failure (a cell's exception, a timeout, a dead kernel) becomes a BookError that names the notebook.
    """
    from nbclient import NotebookClient

    client = NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(path.parent)}}
    )
    try:  # cwd and env are the kernel process's: relative paths start at the notebook's folder, as under nbmake
        client.execute(cwd=str(path.parent), env={**os.environ, "OMP_NUM_THREADS": "1"})
    except Exception as err:  # CellExecutionError's message holds the failing cell and its traceback
        raise BookError(f"{name} failed to execute:\n{strip_ansi(str(err))}") from err


# -- the site ------------------------------------------------------------------------------------------------------

CSS = """\
body { margin: 0; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; }
nav { position: fixed; top: 0; bottom: 0; left: 0; width: 17rem; overflow-y: auto; padding: 1rem;
      box-sizing: border-box; background: #f6f8fa; border-right: 1px solid #d0d7de; font-size: 14px; }
nav h2 { font-size: 13px; text-transform: uppercase; color: #59636e; margin: 1.2rem 0 .3rem; }
nav ul { list-style: none; padding: 0; margin: 0; }
nav li { margin: .25rem 0; }
nav a { color: #0969da; text-decoration: none; }
nav a.current { font-weight: 600; color: #1f2328; }
main { margin-left: 17rem; padding: 1rem 2.5rem 4rem; max-width: 56rem; }
a { color: #0969da; }
h1, h2, h3 { line-height: 1.25; }
h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .3rem; }
code { font: 0.9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #eff1f3;
       padding: .1em .3em; border-radius: 4px; }
pre { background: #f6f8fa; padding: .8rem 1rem; overflow-x: auto; border-radius: 6px; line-height: 1.4; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; margin: 1rem 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: .3rem .6rem; vertical-align: top; }
th { background: #f6f8fa; }
img { max-width: 100%; }
blockquote { margin: 0; padding: 0 1rem; color: #59636e; border-left: 4px solid #d0d7de; }
iframe { max-width: 100%; }
.cell.code pre.input { border-left: 4px solid #0969da; }
.cell.code pre.output, .cell.code .output { margin-top: -.5rem; }
pre.output { background: #fff; border: 1px solid #eaeef2; }
pre.stderr { background: #fff8e6; }
pre.error { background: #ffebe9; color: #82071e; }
@media (max-width: 900px) {
  nav { position: static; width: auto; border-right: 0; border-bottom: 1px solid #d0d7de; }
  main { margin-left: 0; padding: 1rem; }
}
"""


def nav(pages: list[Page], here: PurePosixPath) -> str:
    """The sidebar for the page at `here` (site-relative): home, the chapters, the notebooks."""
    base = str(here.parent)

    def link(page: Page) -> str:
        current = ' class="current"' if page.out == here else ""
        href = posixpath.relpath(str(page.out), base)
        return f'<li><a{current} href="{html.escape(href)}">{html.escape(page.title)}</a></li>'

    parts = [f"<ul>{''.join(link(p) for p in pages if p.section == 'home')}</ul>"]
    for heading, section in (("Chapters", "chapters"), ("Notebooks", "notebooks")):
        items = [link(p) for p in sorted(pages, key=lambda p: p.src) if p.section == section]
        if items:
            parts.append(f"<h2>{heading}</h2><ul>{''.join(items)}</ul>")
    return "<nav>" + "".join(parts) + "</nav>"


def html_page(page: Page, sidebar: str) -> str:
    css = posixpath.relpath("style.css", str(page.out.parent))
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(page.title)} · pagedlab</title>\n"
        f'<link rel="stylesheet" href="{css}">\n</head>\n<body>\n{sidebar}\n'
        f"<main>\n{page.body}\n</main>\n</body>\n</html>\n"
    )


def prepare(out: Path) -> None:
    """An empty output folder: one this tool made before is emptied; any other folder with files in it is refused."""
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise BookError(f"{out} is not empty and was not made by this tool: choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by python scripts/book.py; emptied on each build\n", encoding="utf-8")


def sources(root: Path) -> list[PurePosixPath]:
    """The pages every build has, in the sidebar's order: the README, the chapters, the notebooks."""
    first = [PurePosixPath("README.md")] if (root / "README.md").is_file() else []
    for folder, pattern in (("chapters", "*.md"), ("notebooks", "*.ipynb")):
        first += [PurePosixPath(p.relative_to(root).as_posix()) for p in sorted((root / folder).glob(pattern))]
    return first


def build(
    out: Path,
    root: Path = ROOT,
    execute: bool = True,
    only: list[PurePosixPath] | None = None,
    log: Callable[[str], None] = print,
) -> list[Page]:
    """Write the site into `out` and return its pages (the links are checked by `check_links`, apart).

    `only` builds those sources instead of sources(root), and the files they link to, so that the links
    still resolve; a notebook reached only through a link is rendered as committed, not executed (the
    tests execute one notebook through this same path, not all those its chapter links to).
    """
    prepare(out)
    site = Site(root=root)
    first = sources(root) if only is None else list(only)
    pages: list[Page] = []
    todo, done = list(first), set(first)
    while todo:  # rendering a page can add linked files (site.wanted): each gets a page too, once
        src = todo.pop(0)
        t0, run = time.perf_counter(), execute and src in first
        pages.append(site.page(src, run))
        if run and src.suffix == ".ipynb":
            log(f"executed {src} in {time.perf_counter() - t0:.1f} s")
        for new in sorted(site.wanted - done):
            todo.append(new)
            done.add(new)
    if (root / "figures").is_dir():
        shutil.copytree(root / "figures", out / "figures", dirs_exist_ok=True)
    (out / "style.css").write_text(CSS, encoding="utf-8")
    for page in pages:
        path = out / page.out
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html_page(page, nav(pages, page.out)), encoding="utf-8")
    if site.lab:
        build_live_lab(out, log)
    return pages


def build_live_lab(out: Path, log: Callable[[str], None]) -> None:
    """The live lab into the site (tools/lab.py): lab.html and its folder lab/."""
    from pagedlab.tools.lab import build_lab

    try:
        log(f"built the live lab: {build_lab(out)}")
    except ValueError as err:  # Pyodide not fetched
        raise BookError(f"the live lab: {err}") from None


# -- the link checker ----------------------------------------------------------------------------------------------


class _Refs(HTMLParser):
    """The ids a page defines and the hrefs and srcs it uses (srcdoc frames are attributes: not looked into)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.links.append(value)


def _refs(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser


def check_links(out_dir: Path) -> list[str]:
    """Every broken internal link of the site in `out_dir`, as "page: link (why)".

    Broken: a relative href or src naming a file that does not exist in the site, or `page.html#id` (or `#id`)
    whose id is not on that page. URLs with a scheme (http:, https:, mailto:, data:) are not checked.
    """
    site = out_dir.resolve()
    refs = {p: _refs(p) for p in sorted(site.rglob("*.html"))}
    broken = []
    for page, found in refs.items():
        for link in found.links:
            if not link or SCHEME.match(link):
                continue
            path, _, anchor = link.partition("#")
            path = path.split("?", 1)[0]
            target = (page.parent / unquote(path)).resolve() if path else page
            where = f"{page.relative_to(site).as_posix()}: {link}"
            if target != site and site not in target.parents:
                broken.append(f"{where} (outside the site)")
            elif not target.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and target.suffix == ".html" and target != site / LAB_PAGE:
                ids = refs[target].ids if target in refs else _refs(target).ids
                if unquote(anchor) not in ids:
                    broken.append(f"{where} (no id {unquote(anchor)!r} on {target.relative_to(site).as_posix()})")
    return broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/book.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/book", help="the folder to write (default: build/book)")
    parser.add_argument("--root", default=str(ROOT), help="the pagedlab checkout (default: this one)")
    parser.add_argument("--no-execute", action="store_true", help="render the notebooks as committed, unrun")
    parser.add_argument("--no-check", action="store_true", help="do not check the built site's links")
    args = parser.parse_args(argv)
    out, t0 = Path(args.out), time.perf_counter()
    try:
        pages = build(out, Path(args.root).resolve(), execute=not args.no_execute)
    except BookError as err:
        print(f"book: {err}", file=sys.stderr)
        return 1
    count = {s: sum(p.section == s for p in pages) for s in ("chapters", "notebooks", "other")}
    print(
        f"wrote {len(pages)} pages ({count['chapters']} chapters, {count['notebooks']} notebooks, "
        f"{count['other']} linked files) to {out / 'index.html'} in {time.perf_counter() - t0:.1f} s"
    )
    if args.no_check:
        return 0
    broken = check_links(out)
    for line in broken:
        print(f"BROKEN {line}")
    print(f"{len(broken)} broken links" if broken else "no broken links")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
