"""Runs one worked solution's code as a reader would (run as a script by tests/lessons/test_solutions_run.py).

    python solution_session.py STEPS.json RESULTS.json        (cwd: the session's folder)

STEPS.json is a list of {"action": "run" | "save" | "pytest", "name": str | None, "code": str}, in the order of the
chapter's blocks. "run" executes the block in one namespace shared by the solution's blocks (as one Python
session would), its printed output captured; "save" writes the block to `name` in the session's folder (on
sys.path, so a later block imports it); "pytest" saves it and runs `python -m pytest -q name` there. RESULTS.json
gets one {"output", "error"} per step, written after each step, so that a step that hangs still leaves the ones
before it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

PYTEST_TIMEOUT_S = 600


def run_step(step: dict, namespace: dict) -> dict:
    if step["action"] in ("save", "pytest"):
        Path(step["name"]).write_text(step["code"], encoding="utf-8")
    if step["action"] == "save":
        return {"output": "", "error": None}
    if step["action"] == "pytest":
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", step["name"]],
                              capture_output=True, text=True, timeout=PYTEST_TIMEOUT_S)  # fmt: skip
        return {"output": done.stdout[-4000:], "error": None if done.returncode == 0 else done.stderr[-2000:]}
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(step["code"], "<solution block>", "exec"), namespace)
    except BaseException:  # noqa: BLE001 -- the block's own failure is the result, reported to the test
        return {"output": printed.getvalue(), "error": traceback.format_exc()[-3000:]}
    return {"output": printed.getvalue(), "error": None}


def main(steps_file: str, results_file: str) -> None:
    sys.path.insert(0, os.getcwd())  # what the reader saved is importable, as from a notebook in that folder
    steps = json.loads(Path(steps_file).read_text(encoding="utf-8"))
    namespace: dict = {"__name__": "__main__"}
    results: list[dict] = []
    for step in steps:
        results.append(run_step(step, namespace))
        Path(results_file).write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
