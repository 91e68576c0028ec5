"""`pagedlab lab --html` and `pagedlab trace --lab/--from/--json`, without a browser: what the lab's folder holds,
that it is the same bytes on every build, and that the desktop commands round-trip the lab's traces."""

from __future__ import annotations

import json
import zipfile

import pytest

from pagedlab.lessons import lab_browser
from pagedlab.lessons.lab import KNOBS, LabOptions, run_lab
from pagedlab.stages import get_preset
from pagedlab.tools.cli import main
from pagedlab.tools.lab import build_lab, lab_description, lab_modules
from pagedlab.viz.page import page_template
from pagedlab.viz.trace import load
from tests.conftest import need_pyodide


def run_cli(*argv: str) -> int:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    return done.value.code


def test_the_shipped_modules_are_the_ones_the_lab_imports_and_none_needs_torch():
    shipped = {path.as_posix().rsplit("src/", 1)[-1] for path in lab_modules()}
    assert {
        "pagedlab/lessons/lab_browser.py",
        "pagedlab/engine/engine.py",
        "pagedlab/kv/prefix.py",
        "pagedlab/worker/token_source.py",
        "pagedlab/__init__.py",
        "pagedlab/lessons/__init__.py",
    } <= shipped
    torch_modules = {"pagedlab/attention/base.py", "pagedlab/model/loader.py", "pagedlab/worker/runner.py",
                     "pagedlab/model/tokenizer.py", "pagedlab/viz/palette.py", "pagedlab/llm.py"}  # fmt: skip
    assert not shipped & torch_modules


def test_the_lab_is_built_the_same_twice_and_without_pyodide_it_says_how_to_fetch_it(tmp_path, monkeypatch):
    need_pyodide()
    first, second = build_lab(tmp_path / "a"), build_lab(tmp_path / "b")
    for name in ("lab.html", "lab/pagedlab.zip", "lab/step_through.html", "lab/pyodide/pyodide.asm.wasm"):
        assert (first.parent / name).read_bytes() == (second.parent / name).read_bytes(), name
    with zipfile.ZipFile(first.parent / "lab" / "pagedlab.zip") as z:
        assert "pagedlab/lessons/lab.py" in z.namelist()
    monkeypatch.setenv("PAGEDLAB_HOME", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="^pyodide: not fetched yet; run `pagedlab fetch pyodide`"):
        build_lab(tmp_path / "c")


def test_the_page_knows_every_knob_and_what_each_stage_reads():
    described = lab_description()
    assert [k["name"] for k in described["knobs"]] == list(KNOBS)
    for stage, names in described["stage_only"].items():
        assert set(names) - {"eviction_policy"} == {k for k in KNOBS if k in get_preset(stage).uses}
    assert "long_prefill_token_threshold" not in described["stage_only"][4]


def test_trace_lab_writes_the_labs_trace_and_from_draws_it_again(tmp_path):
    assert run_cli("trace", "--lab", "stage=3&num_requests=6", "--json", str(tmp_path / "t.json")) == 0
    assert load(tmp_path / "t.json") == run_lab(LabOptions(stage=3, num_requests=6))
    assert run_cli("trace", "--from", str(tmp_path / "t.json"), "--html", str(tmp_path / "t.html")) == 0
    assert "num_requests" not in (tmp_path / "t.html").read_text()[:200]
    assert '"stage_name":"cow"' in (tmp_path / "t.html").read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["trace", "--lab", "stage=3"], "html: give --html PATH"),
        (["trace", "--lab", "stage=7", "--json", "x.json"], "stage: the lab runs stages 2-5"),
        (["trace", "--lab", "", "--compare", "stage=4", "--html", "x.html"], "compare: --lab runs"),
    ],
)
def test_a_bad_trace_command_is_one_line_naming_the_field(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli(*argv) == 2
    assert message in capsys.readouterr().err


# --- what the page calls, on the desktop ----------------------------------------------------------------


def test_the_page_calls_say_a_bad_knob_or_a_bad_file_as_an_error_not_a_traceback():
    lab_browser.set_template(page_template())
    assert json.loads(lab_browser.run("block_size=0")) == {"error": "block_size: expected 1 to 256, got 0"}
    assert json.loads(lab_browser.show("{")).get("error", "").startswith("trace: ")
    assert json.loads(lab_browser.show('{"version": 2}'))["error"].startswith("trace: ")
    done = json.loads(lab_browser.run("num_requests=3"))
    assert done["fragment"] == "num_requests=3" and json.loads(lab_browser.trace_text())["steps"][-1]["step"] == done[
        "steps"]  # fmt: skip
    assert json.loads(lab_browser.question("num_requests=3", done["steps"])) == {"none": "the run has ended"}


@pytest.mark.parametrize(
    "kind, text, guess",
    [
        ("int", " 7 ", 7),
        ("set", "3, 0_1", {"3", "0_1"}),
        ("set", "{'3', '5'}", {"3", "5"}),
        ("set", "set()", set()),
        ("set", "", set()),
        ("exact", "[4, 7]", [4, 7]),
        ("exact", "4 7", [4, 7]),
        ("exact", "(4, 7)", [4, 7]),
        ("exact", "four", "four"),
    ],
)
def test_a_learners_answer_is_read_as_the_questions_kind(kind, text, guess):
    assert lab_browser.parse_guess(kind, text) == guess


def test_pagedlab_lab_serves_the_page_on_127_0_0_1_until_stopped(tmp_path):
    """`pagedlab lab`: the folder built in a temporary place and served; the WebAssembly as application/wasm."""
    import signal
    import subprocess
    import sys
    import urllib.request

    need_pyodide()
    command = [sys.executable, "-c", "from pagedlab.tools.cli import main; main()", "lab", "--port", "0"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # "the lab: http://127.0.0.1:PORT/lab.html  (Ctrl-C to stop)"
        url = line.split()[2]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/lab.html"), line
        with urllib.request.urlopen(url, timeout=10) as page:
            assert b"pagedlab: the live lab" in page.read()
        with urllib.request.urlopen(url.replace("lab.html", "lab/pyodide/pyodide.asm.wasm"), timeout=10) as wasm:
            assert wasm.headers["Content-Type"] == "application/wasm"
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C: the temporary folder is removed on the way out
        server.wait(timeout=10)
    assert server.returncode == 130
