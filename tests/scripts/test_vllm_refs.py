"""Chapters that stay true: every vLLM citation is pinned, every chapter ends with a tour into vLLM and a
ledger of differences whose tests exist, and the maintainer's checker (scripts/check_vllm_refs.py) finds what it should.

The download and the check against vLLM's real sources is `make check-vllm-refs` (not run here: no network).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts import check_vllm_refs as vllm_refs

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "chapters").glob("*.md")) + [ROOT / "README.md"]
TEACHING = sorted(p for p in (ROOT / "chapters").glob("0*.md"))  # chapters 00..0N end with a tour and a ledger


def section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no '## {heading}' section"
    return match.group(1)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_vllm_citation_is_a_link_at_a_pinned_tag(doc):
    text = doc.read_text()
    assert vllm_refs.unpinned_mentions(text) == [], "cite vLLM files as links at a pinned tag"
    for ref in vllm_refs.chapter_refs(text, doc.name):
        assert ref.version in vllm_refs.SDIST_SHA256, f"{ref.where}: v{ref.version} is not pinned"


@pytest.mark.parametrize("doc", TEACHING, ids=lambda p: p.name)
def test_each_chapter_ends_with_a_tour_of_pinned_stops(doc):
    tour = section(doc.read_text(), "Read vLLM next")
    stops = re.findall(r"^\d+\. (.*)$", tour, re.M)
    assert 4 <= len(stops) <= 8, f"{len(stops)} stops"
    for stop in stops:
        (ref,) = vllm_refs.chapter_refs(stop, doc.name)[:1]
        assert ref.symbols, f"a stop names a symbol: {stop[:80]}"
        assert "pagedlab:" in stop and "../src/pagedlab/" in stop, f"a stop names the pagedlab code: {stop[:80]}"


@pytest.mark.parametrize("doc", TEACHING, ids=lambda p: p.name)
def test_every_ledger_row_names_an_existing_test(doc):
    ledger = section(doc.read_text(), "Differences from vLLM")
    rows = [line for line in ledger.splitlines() if line.startswith("| ") and not line.startswith("| pagedlab |")]
    assert len(rows) >= 3, "a ledger of at least three differences"
    for row in rows:
        (test_id,) = re.findall(r"`(tests/[\w/]+\.py::\w+)`", row)
        path, name = test_id.split("::")
        assert (ROOT / path).exists(), f"{test_id}: no such file"
        assert re.search(rf"^\s*def {name}\(", (ROOT / path).read_text(), re.M), f"{test_id}: no such test"


def test_chapter_refs_read_symbols_before_after_and_inside_a_link():
    url = vllm_refs.url("0.33.0", "vllm/v1/core/block_pool.py")
    text = (
        f"`BlockPool.touch` in [`block_pool.py`]({url}).\n"
        f"[`block_pool.py::BlockPool.free_blocks`]({url}) and [`x`]({url}) (`get_new_blocks`, `touch`)\n"
        f"`reshape_and_cache` ([`cache_kernels.cu`]({vllm_refs.url('0.10.2', 'csrc/cache_kernels.cu')}))"
    )
    refs = vllm_refs.chapter_refs(text, "doc")
    assert [r.symbols for r in refs] == [
        ("BlockPool.touch",),
        ("BlockPool.free_blocks",),
        ("get_new_blocks", "touch"),
        ("reshape_and_cache",),
    ]
    assert refs[3].version == "0.10.2" and refs[3].path == "csrc/cache_kernels.cu"
    assert vllm_refs.unpinned_mentions(f"see `vllm/v1/request.py` and [`a`]({url})\n```\nvllm/x.py\n```") == [
        (1, "vllm/v1/request.py")
    ]


def test_missing_finds_absent_files_and_symbols(tmp_path):
    tree = tmp_path / "vllm-0.33.0"
    (tree / "vllm" / "v1").mkdir(parents=True)
    (tree / "vllm" / "v1" / "pool.py").write_text(
        "class BlockPool:\n    def touch(self):\n        self.hits = 0\n\nLIMIT = 3\n"
    )
    (tree / "csrc").mkdir()
    (tree / "csrc" / "k.cu").write_text("__global__ void reshape_and_cache_kernel() {}\n")

    def check(path, *symbols):
        return vllm_refs.missing(vllm_refs.Ref("doc:1", "0.33.0", path, symbols), tree)

    assert check("vllm/v1/pool.py", "BlockPool.touch", "BlockPool.hits", "LIMIT", "touch") == []
    assert check("vllm/v1/pool.py", "BlockPool.evict") == ["doc:1: vllm/v1/pool.py has no BlockPool.evict at v0.33.0"]
    assert check("vllm/v1/gone.py") == ["doc:1: vllm/v1/gone.py is not in vLLM v0.33.0"]
    assert check("csrc/k.cu", "reshape_and_cache_kernel") == [] and check("csrc", "reshape_and_cache_kernel") == []
    assert check("csrc/k.cu", "paged_attention_v1") != []


def test_docstring_refs_take_the_version_their_line_names(tmp_path):
    py = tmp_path / "m.py"
    py.write_text('"""vLLM: vllm/v1/core/block_pool.py.\nvLLM v0.10.2: vllm/core/block_manager.py (fork)."""\n')
    refs = vllm_refs.docstring_refs(py, "m.py")
    assert [(r.version, r.path) for r in refs] == [
        ("0.33.0", "vllm/v1/core/block_pool.py"),
        ("0.10.2", "vllm/core/block_manager.py"),
    ]
