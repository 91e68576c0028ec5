"""The maintainer's check that every vLLM file and symbol the chapters and docstrings cite exists at its pinned version.

Builds on: nothing of the engine (a text tool).
Read with: chapters/00-overview.md (Which vLLM?), chapters/97-architecture.md (Chapters that stay true).

`make check-vllm-refs` (not part of `make test`: it downloads 55 MiB):

    for each pinned version:   fetch vLLM's source distribution from PyPI (sha256 pinned), unpack it once
    chapters:                  every link https://github.com/vllm-project/vllm/blob/vX.Y.Z/PATH must name a
                               pinned tag, PATH must exist there, and each `::Symbol` in the link's text
                               (`block_pool.py::BlockPool.get_new_blocks`) must be defined in that file
    docstrings (src/):         every vllm/... or csrc/... path must exist at the version the line names
                               (v0.10.2 when it says so, else the current one)

Why the source distribution, not the wheel: the wheel has no csrc/ (the CUDA sources chapter 6 quotes),
and `pip download` cannot fetch an sdist of vLLM without building its metadata (which needs CUDA).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import tarfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

V0 = "0.10.2"  # the last release with v0's block manager (vllm/core/) and the original CUDA kernels
CURRENT = "0.33.0"  # the v1 engine everything else is compared with
SDIST_SHA256 = {
    V0: "57608f44cf61f5d80fb182c98e06e524cb2925bb528258a7b247c8e43a52d13e",
    CURRENT: "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
}
REPO = "https://github.com/vllm-project/vllm"
_LINK = re.compile(r"\[([^\]]*)\]\(" + re.escape(REPO) + r"/(?:blob|tree)/v(\d+\.\d+\.\d+)/([^)#\s]+)[^)]*\)")
_PATH = re.compile(r"(?<![\w/.])((?:vllm|csrc)/[\w/.-]*\w)")


@dataclass(frozen=True)
class Ref:
    """One citation: where it is, the version it names, the path, the symbols it claims are in that file."""

    where: str  # file:line
    version: str
    path: str
    symbols: tuple[str, ...] = ()


def url(version: str, path: str) -> str:
    """The pinned link a chapter should use."""
    return f"{REPO}/blob/v{version}/{path}"


_SYMBOL = r"`([A-Za-z_][\w.]*)(?:\(\))?`"
_BEFORE = re.compile(rf"(?:{_SYMBOL}(?:\s*/\s*{_SYMBOL})*)\s+(?:in|from|of)\s+$|{_SYMBOL}\s*(?:/\s*{_SYMBOL}\s*)?\($")
_AFTER = re.compile(rf"^\s*\(((?:{_SYMBOL}(?:,\s*|\s+and\s+)?)+)\)")


def chapter_refs(text: str, where: str) -> list[Ref]:
    """Every pinned vLLM link of a Markdown text, with the symbols it names as being in that file.

    A symbol is `file.py::Symbol` in the link's text, or a code name right before the link
    ("`BlockPool.touch` in [file](...)", "`check_stop` ([file](...))") or in parentheses right after it
    ("[file](...) (`get_new_blocks`, `touch`)").
    """
    refs = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in _LINK.finditer(line):
            label, version, path = m.groups()
            symbols = [s.strip(" `") for s in label.strip("`").split("::")[1:] if s.strip(" `")]
            before = _BEFORE.search(line[: m.start()])
            if before:
                symbols += [s for s in before.groups() if s]
            after = _AFTER.match(line[m.end() :])
            if after:
                symbols += re.findall(_SYMBOL, after.group(1))
            symbols = [s for s in symbols if not re.search(r"\.(py|cu|cuh|h|cpp|md)$", s) and "/" not in s]
            refs.append(Ref(f"{where}:{i}", version, path.rstrip("/"), tuple(dict.fromkeys(symbols))))
    return refs


def unpinned_mentions(text: str) -> list[tuple[int, str]]:
    """vllm/... or csrc/... paths in prose that are not inside a pinned link (code blocks excepted)."""
    found, in_code = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        bare = _LINK.sub("", line)
        bare = re.sub(r"\]\([^)]*\)", "]", bare)  # other links' targets (e.g. ../src/...) are not citations
        found += [(i, m) for m in _PATH.findall(bare)]
    return found


def docstring_refs(path: Path, where: str) -> list[Ref]:
    """vLLM paths in a Python file's text; a line that names v0.10.2 (or 0.10.2) means that version."""
    refs = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        version = V0 if V0 in line else CURRENT
        refs += [Ref(f"{where}:{i}", version, p.rstrip("/.")) for p in _PATH.findall(line)]
    return refs


def all_refs(root: Path) -> list[Ref]:
    refs = []
    for doc in sorted([root / "README.md", *(root / "chapters").glob("*.md")]):
        refs += chapter_refs(doc.read_text(), str(doc.relative_to(root)))
    for py in sorted((root / "src" / "pagedlab").rglob("*.py")):
        if py.name != "vllm_refs.py":
            refs += docstring_refs(py, str(py.relative_to(root)))
    return refs


def missing(ref: Ref, tree: Path) -> list[str]:
    """What of `ref` is not in vLLM's source `tree`: the path, or symbols not defined in it."""
    target = tree / ref.path
    if not target.exists():
        candidates = sorted(str(p.relative_to(tree)) for p in tree.rglob(Path(ref.path).name))[:3]
        hint = f" (a file of that name: {', '.join(candidates)})" if candidates else ""
        return [f"{ref.where}: {ref.path} is not in vLLM v{ref.version}{hint}"]
    if not ref.symbols:
        return []
    defined = _defined_names(target)
    return [f"{ref.where}: {ref.path} has no {s} at v{ref.version}" for s in ref.symbols if not _has(defined, s)]


def _has(defined: set[str] | str, symbol: str) -> bool:
    if isinstance(defined, str):  # C++/CUDA source: the identifier must appear
        return re.search(rf"\b{re.escape(symbol.split('.')[-1].split('::')[-1])}\b", defined) is not None
    return symbol in defined or ("." not in symbol and any(name.endswith("." + symbol) for name in defined))


def _defined_names(path: Path) -> set[str] | str:
    """A Python file's definitions, qualified (Class, Class.method, Class.attr, self.attr, CONSTANT);
    for a C++/CUDA file or a folder, the text to search."""
    if path.is_dir():
        return "\n".join(f.read_text(errors="replace") for f in sorted(path.rglob("*")) if f.is_file())
    if path.suffix != ".py":
        return path.read_text(errors="replace")
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def visit(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")
                    names.update(  # attributes set on self in the class's methods
                        f"{prefix}{node.name}.{t.attr}"
                        for sub in ast.walk(node)
                        for t in ast.walk(sub)
                        if isinstance(t, ast.Attribute)
                        and isinstance(t.ctx, ast.Store)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    )
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(prefix + t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body, prefix)

    visit(tree.body, "")
    return names


# -- the source distributions ----------------------------------------------------------------------------


def cache_dir() -> Path:
    from pagedlab.model.registry import cache_dir as pagedlab_cache

    return pagedlab_cache() / "vllm"


def fetch(version: str, folder: Path | None = None) -> Path:
    """vLLM `version`'s unpacked source distribution, downloaded once from PyPI and checked against its sha256."""
    folder = folder or cache_dir()
    tree = folder / f"vllm-{version}"
    if tree.is_dir():
        return tree
    folder.mkdir(parents=True, exist_ok=True)
    meta_url = "https://pypi.org/pypi/vllm/json"
    meta = json.load(urllib.request.urlopen(meta_url, timeout=60))
    sdist = next(f for f in meta["releases"][version] if f["packagetype"] == "sdist")
    archive = folder / sdist["filename"]
    if not archive.exists():
        print(f"downloading {sdist['filename']} ({sdist['size'] / 2**20:.0f} MiB) from PyPI", file=sys.stderr)
        urllib.request.urlretrieve(urllib.parse.urljoin(meta_url, sdist["url"]), archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256[version]:
        archive.unlink()
        raise ValueError(f"{sdist['filename']}: sha256 {digest} is not the pinned {SDIST_SHA256[version]}")
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(folder, filter="data")  # refuses links and paths out of `folder`
        except TypeError:  # Python < 3.11.4 has no filters: check the names by hand
            if any(m.name.startswith(("/", "..")) or ".." in Path(m.name).parts for m in tar.getmembers()):
                raise ValueError(f"{archive}: a member would land outside {folder}") from None
            tar.extractall(folder)
    return tree


def check(root: Path, trees: dict[str, Path]) -> tuple[list[Ref], list[str]]:
    """(every reference, what is missing); a reference to a version that is not pinned is itself a problem."""
    refs, problems = all_refs(root), []
    for ref in refs:
        if ref.version not in trees:
            problems.append(f"{ref.where}: v{ref.version} is not a pinned version ({', '.join(trees)})")
        else:
            problems += missing(ref, trees[ref.version])
    for doc in sorted([root / "README.md", *(root / "chapters").glob("*.md")]):
        for line, path in unpinned_mentions(doc.read_text()):
            problems.append(f"{doc.relative_to(root)}:{line}: {path} is cited without a pinned link")
    return refs, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/check_vllm_refs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="the pagedlab checkout")
    parser.add_argument("--cache", default=None, help="where the sdists are kept (default: the pagedlab cache)")
    args = parser.parse_args(argv)
    trees = {v: fetch(v, Path(args.cache) if args.cache else None) for v in (V0, CURRENT)}
    refs, problems = check(Path(args.root), trees)
    for version in trees:
        mine = [r for r in refs if r.version == version]
        files = {r.path for r in mine}
        symbols = sum(len(r.symbols) for r in mine)
        print(f"vLLM v{version}: {len(mine)} references, {len(files)} files, {symbols} symbols")
    for p in problems:
        print(f"MISSING {p}")
    print("all found" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
