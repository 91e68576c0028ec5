"""The bench figures beside the chapters and the numbers the chapters quote come from one run: the committed JSON.

Builds on: bench/__init__.py (BENCHES: which bench draws which figure), scripts/chapter_tables.py (its tables as
Markdown).
Read with: chapters/97-architecture.md (Benchmarks).

A chapter quotes a bench through a marked table or paragraph (scripts/chapter_tables.py):

    <!-- from figures/05_throughput.json: systems -->       the next table must be exactly the one rendered
    <!-- numbers from figures/05_throughput.json -->        the next paragraph's measured numbers must appear
                                                            in one of that JSON's tables

After `pagedlab figures --rerun-benches` (or `pagedlab bench NAME`, which rewrites figures/NN_NAME.*), the
tables here fail and print what the chapter should now say; `git checkout figures/` restores the committed run.
No test here measures anything.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scripts.chapter_tables import chapter_tables

from pagedlab.bench.common import read_rows, write_rows_beside
from pagedlab.bench.figures import figure_benches, redraw_bench_figure, rows_path

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"
CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))
TABLE = re.compile(r"^<!-- from figures/(\w+)\.json: ([\w ]+) -->\n((?:.+\n?)+)", re.M)
NUMBERS = re.compile(r"^<!-- numbers from figures/(\w+)\.json -->\n((?:.+\n?)+)", re.M)
MEASURED = re.compile(r"\d+\.\d+|\d+(?= ?[%×])")  # a decimal point, or a % or × after it
DESIGN_FIELDS = {  # chapters/97-architecture.md (Benchmarks): every row has these
    "memory": ("system", "block_size", "workload", "num_requests", "token_states", "reservation"),
    "sharing": ("mode", "width", "workload", "block_size", "saved"),
    "prefix": ("workload", "caching", "stage", "num_requests", "prompt_tokens", "computed_prefill_tokens"),
    "throughput": ("system", "workload", "num_requests", "num_kv_blocks", "tokens_per_s", "normalized_latency_s"),
    "real": ("system", "kv_budget_bytes", "tokens_per_s", "mean_running", "max_running", "ttft_p50_s", "ttft_p99_s"),
    "traces": ("trace", "policy", "index", "pool_blocks", "tier_blocks", "hit_ratio", "dead_blocks_mean", "refused"),
    "serve": (
        "system",
        "request_rate",
        "num_requests",
        "tokens_per_s",
        "normalized_latency_s",
        "ttft_p50_s",
        "itl_p50_s",
    ),
}
BENCH_FIGURES = {b.name: b.figure for b in figure_benches()}  # bench -> its figure's stem
STALE = "figures/{0}.json changed since the chapter quoted it (`git checkout figures/` restores it)"


def marks(pattern: re.Pattern) -> list[tuple[str, tuple[str, ...]]]:
    """(chapter name, the marker's groups) for every marker of `pattern` in every chapter."""
    return [(doc.name, m.groups()) for doc in CHAPTERS for m in pattern.finditer(doc.read_text(encoding="utf-8"))]


def rows_of(stem: str) -> list[dict]:
    path = FIGURES / f"{stem}.json"
    assert path.exists(), f"{path} is missing: `pagedlab figures --rerun-benches` writes it"
    return read_rows(path)["rows"]


def prose(text: str) -> str:
    """A paragraph without its link targets and inline code (file names and settings are not measurements)."""
    return re.sub(r"`[^`]*`|\]\([^)]*\)", "", text)


@pytest.mark.parametrize("name", BENCH_FIGURES)
def test_every_bench_figure_has_its_rows_beside_it_and_a_chapter_quotes_them(name):
    result = read_rows(rows_path(name, FIGURES))
    assert result["bench"] == name and result["run"]["command"] == f"pagedlab bench {name}"
    assert (FIGURES / f"{BENCH_FIGURES[name]}.png").exists()
    for row in result["rows"]:
        assert all(field in row for field in DESIGN_FIELDS[name]), row
    quoted = {stem for _, (stem, _, _) in marks(TABLE)}
    assert BENCH_FIGURES[name] in quoted, f"no chapter has a table marked <!-- from figures/{BENCH_FIGURES[name]}.json"


@pytest.mark.parametrize(("chapter", "mark"), marks(TABLE), ids=lambda v: v if isinstance(v, str) else v[1])
def test_a_marked_table_is_the_one_the_committed_json_renders(chapter, mark):
    stem, table, text = mark
    rendered = chapter_tables(stem, rows_of(stem))
    assert table in rendered, f"{chapter}: no table {table!r} for {stem}"
    want = rendered[table]
    got = text.strip()
    assert got == want, f"{chapter}: {STALE.format(stem)}, or the table was edited; it should read:\n{want}"


@pytest.mark.parametrize(("chapter", "mark"), marks(NUMBERS), ids=lambda v: v if isinstance(v, str) else v[0])
def test_a_marked_paragraph_quotes_only_numbers_of_the_committed_json(chapter, mark):
    stem, text = mark
    rows = rows_of(stem)
    known = {n for text in chapter_tables(stem, rows).values() for n in re.findall(r"\d+(?:\.\d+)?", text)}
    unknown = [n for n in MEASURED.findall(prose(text)) if n not in known]
    assert not unknown, f"{chapter}: {unknown} appear in no table of figures/{stem}.json; {STALE.format(stem)}"


def test_the_markers_are_found_at_all():
    # A typo in a marker would silently check nothing: every bench's JSON is quoted by at least one paragraph too.
    assert {stem for _, (stem, _) in marks(NUMBERS)} == set(BENCH_FIGURES.values())


@pytest.mark.parametrize("name", BENCH_FIGURES)
def test_a_bench_figure_redraws_from_its_committed_json(name, tmp_path):
    path = redraw_bench_figure(name, tmp_path, rows_dir=FIGURES)
    assert path == tmp_path / f"{BENCH_FIGURES[name]}.png" and path.stat().st_size > 10_000


def test_rows_written_beside_a_figure_read_back_the_same(tmp_path):
    result = {"bench": "sharing", "rows": [{"mode": "beam", "width": 2, "saved": 0.25, "paper_saved": None}] * 2}
    path = write_rows_beside(result, tmp_path / "03_sharing.png", seconds=2.0)
    assert path == tmp_path / "03_sharing.json"
    back = read_rows(path)
    assert back["rows"] == result["rows"] and back["run"]["seconds"] == 2.0
    assert path.read_text().count("\n") == 2 + len(result["rows"])  # one row per line: readable diffs
    with pytest.raises(ValueError, match="is missing"):
        redraw_bench_figure("sharing", tmp_path / "empty")
    with pytest.raises(ValueError, match="draws no committed figure"):
        rows_path("scheduler")


def test_pagedlab_figures_redraws_the_bench_figures_from_the_json_in_its_out_folder(tmp_path, monkeypatch, capsys):
    import shutil

    import pagedlab.lessons
    from pagedlab.tools.cli import main

    monkeypatch.setattr(pagedlab.lessons, "make_figures", lambda out: [])  # the scenario figures: tests/viz/test_viz.py
    for stem in BENCH_FIGURES.values():
        shutil.copy(FIGURES / f"{stem}.json", tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["figures", "--out", str(tmp_path)])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed] == [str(tmp_path / f"{s}.png") for s in BENCH_FIGURES.values()]
    assert all((tmp_path / f"{s}.png").stat().st_size > 10_000 for s in BENCH_FIGURES.values())
    # A folder without the JSON: nothing to redraw from, which it says on stderr; not an error.
    with pytest.raises(SystemExit) as exit_info:
        main(["figures", "--out", str(tmp_path / "elsewhere")])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0 and captured.out == ""
    assert ", ".join(f"{s}.json" for s in BENCH_FIGURES.values()) + " not in" in captured.err


def test_rerun_runs_each_bench_that_draws_a_committed_figure_into_the_out_folder(tmp_path, monkeypatch):
    from pagedlab import bench
    from pagedlab.bench.figures import rerun_bench_figures

    calls = []  # fakes: the real ones take minutes (tests/bench/ runs them on tiny streams)
    monkeypatch.setattr(bench, "run_bench", lambda name, **kw: calls.append((name, kw)))
    paths = rerun_bench_figures(None, tmp_path)
    assert calls == [(name, {"figure": True, "figures_dir": tmp_path, "console": None}) for name in BENCH_FIGURES]
    assert paths[:2] == [tmp_path / "02_memory.png", tmp_path / "02_memory.json"]
    assert len(paths) == 2 * len(BENCH_FIGURES)
