"""Without graphviz's `dot`: drawings that need it are skipped with one install line, and nothing crashes.

The graphviz tests of test_graphs.py and test_viz.py need `dot` and skip without it (fail, under
PAGEDLAB_REQUIRE_DOT=1). These hide it: from PATH in this process (`no_dot`), or in a subprocess run with a
PATH that holds no `dot` while Python is started by its absolute path.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from IPython.core.formatters import DisplayFormatter

from pagedlab.lessons import fig_03_cow_before_after
from pagedlab.model.registry import SMOLLM2, is_fetched
from pagedlab.viz import graphs
from tests.conftest import need_dot

ROOT = Path(__file__).resolve().parents[2]
DRAWN_BY_DOT = ["03_cow_before_after.png", "03_beam_tree.png", "04_hash_chain.png"]  # in FIGURES order
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def no_dot(monkeypatch, tmp_path):
    """PATH is one empty folder for the test: `dot` is nowhere."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def run_without_dot(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`python *args` from the repository root, PATH stripped of every folder holding a `dot`."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    path = os.pathsep.join(d for d in folders if d and not shutil.which("dot", path=d))
    env = {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_dot_available_reads_path_on_every_call(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not graphs.dot_available()
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert graphs.dot_available()  # no cache: the same process sees the new PATH entry at once


def test_save_graph_without_dot_writes_nothing_and_prints_the_install_line(no_dot, tmp_path, capsys):
    path = tmp_path / "out" / "g.png"
    assert graphs.save_graph(graphs.block_sharing_graph({"a": [0, 1], "b": [0]}), path) is None
    assert not path.exists()
    err = capsys.readouterr().err
    assert err == graphs.dot_missing_line([path]) + "\n"
    assert err.startswith(f"graphviz's `dot` not found: skipped {path}; install it with `apt-get install graphviz`")


def test_a_dot_figure_raises_dot_not_found_before_drawing(no_dot, tmp_path):
    with pytest.raises(graphs.DotNotFound) as caught:
        fig_03_cow_before_after(tmp_path)
    assert caught.value.path == tmp_path / "03_cow_before_after.png" and not caught.value.path.exists()
    assert str(caught.value) == graphs.dot_missing_line([caught.value.path])


def test_notebook_display_without_dot_is_a_matplotlib_picture_and_the_install_line(no_dot):
    data, _ = DisplayFormatter().format(graphs.block_sharing_graph({"a": [0, 1], "b": [0]}))
    assert set(data) == {"image/png", "text/plain"} and data["image/png"][:8] == PNG
    assert data["text/plain"] == graphs.dot_missing_line(["Graphviz's layout"]) + graphs.FALLBACK


def test_notebook_display_with_dot_is_the_picture():
    need_dot()
    data, _ = DisplayFormatter().format(graphs.block_sharing_graph({"a": [0, 1], "b": [0]}))
    assert data["image/svg+xml"].startswith("<?xml")


@pytest.mark.slow
def test_figures_command_without_dot_skips_the_dot_figures_in_one_line(tmp_path):
    out = tmp_path / "figures"
    cli = "from pagedlab.tools.cli import main; main()"  # the `pagedlab` console script
    done = run_without_dot(["-c", cli, "figures", "--out", str(out)], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    told = [line for line in (done.stdout + done.stderr).splitlines() if "`dot` not found" in line]
    assert told == [graphs.dot_missing_line([out / name for name in DRAWN_BY_DOT])]
    written = [Path(line) for line in done.stdout.splitlines()]  # the command prints each path it wrote
    chapter7 = 4 if is_fetched(SMOLLM2) else 0  # chapter 7's figures need the fetched SmolLM2, not dot
    chapter6 = 3 if importlib.util.find_spec("triton") else 0  # two PNGs and the parity rows: Triton, not dot
    assert sorted(written) == sorted(out.iterdir()) and len(written) == 13 + chapter6 + chapter7  # 02_sliding: 2
    assert not {p.name for p in written} & set(DRAWN_BY_DOT)
    assert all(p.read_bytes()[:8] == PNG for p in written if p.suffix == ".png")


NOTEBOOK_RUNNER = """
import sys, nbclient, nbformat
for src, dst in zip(sys.argv[1::2], sys.argv[2::2]):
    nb = nbformat.read(src, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, resources={"metadata": {"path": "notebooks"}}).execute()
    nbformat.write(nb, dst)
"""


@pytest.mark.slow
def test_notebooks_03_and_04_run_without_dot(tmp_path):
    names = ["03_copy_on_write.ipynb", "04_prefix_caching.ipynb"]
    args = [arg for name in names for arg in (f"notebooks/{name}", str(tmp_path / name))]  # never run in place
    done = run_without_dot(["-c", NOTEBOOK_RUNNER, *args], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = graphs.dot_missing_line(["Graphviz's layout"]) + graphs.FALLBACK
    for name in names:
        outputs = [o for cell in nbformat.read(tmp_path / name, as_version=4).cells for o in cell.get("outputs", [])]
        assert not [o for o in outputs if o["output_type"] == "error"] and "Traceback" not in json.dumps(outputs)
        shown = [o["data"] for o in outputs if o["output_type"] == "execute_result"]
        drawn = [d for d in shown if d.get("text/plain") == line]
        assert drawn and all("image/png" in d for d in drawn), f"{name} shows no drawing without dot"
        assert not any("image/svg+xml" in d for d in shown)
