"""Course: a Gradescope autograder for one stage, and the results format Gradescope reads.

Builds on: course/regions.py (the reference tree); the autograder runs course/grading.py.
Read with: chapters/98-assignments.md (Gradescope).

`pagedlab assignment gradescope N --out DIR` writes setup.sh (installs the
reference), run_autograder (grades /autograder/submission with the stage fixed)
and autograder.zip, ready to upload.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pagedlab.course import regions
from pagedlab.stages import parse_stage

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu).
# The teacher's pagedlab (the reference the grader splices submissions into) is in source/pagedlab.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
# bubblewrap: the sandbox student code runs in (where the container refuses it, grading still runs, and every
# report says in one line that it ran without isolation).
apt-get install -y -qq bubblewrap >/dev/null || true
python3 -m venv /autograder/venv
# The CPU wheel of torch (Gradescope's graders have no GPU: stage 6's GPU-only tests report "blocked").
/autograder/venv/bin/pip install -q --index-url https://download.pytorch.org/whl/cpu "torch>=2.4" \\
    || /autograder/venv/bin/pip install -q "torch>=2.4"
# Editable: the grader assembles its trees from this source checkout (src/, tests/).
/autograder/venv/bin/pip install -q -e "/autograder/source/pagedlab[dev]"
"""


RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission; the student's files are in /autograder/submission
# (their workspace, or a zip of it). The stage is fixed here, by the teacher.
set -uo pipefail
cd /autograder/source/pagedlab
mkdir -p /autograder/results
/autograder/venv/bin/pagedlab assignment grade /autograder/submission --stage {stage} \\
    --json /autograder/results/results.json
exit 0  # the score is in results.json; a non-zero exit would only add Gradescope's own error
"""


def write_gradescope(stage: int | str, out: str | Path) -> list[Path]:
    """An autograder for Gradescope: setup.sh, run_autograder, the reference in pagedlab/, and autograder.zip."""
    number, out, root = parse_stage(stage), Path(out), regions.repo_root()
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} exists and is not empty")
    if not regions.stage_regions(root, number):
        raise ValueError(f"stage: stage {number} has no tasks")
    out.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".hypothesis", "*.pyc")
    for part in ("src", "chapters"):
        shutil.copytree(root / part, out / "pagedlab" / part, ignore=ignore)
    regions.copy_tests(root, out / "pagedlab" / "tests")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, out / "pagedlab" / name)
    (out / "setup.sh").write_text(SETUP_SH)
    (out / "run_autograder").write_text(RUN_AUTOGRADER.format(stage=number))
    for script in ("setup.sh", "run_autograder"):
        (out / script).chmod(0o755)
    with tempfile.TemporaryDirectory() as tmp:  # not inside `out` while it is being zipped
        archive = Path(shutil.make_archive(str(Path(tmp) / "autograder"), "zip", root_dir=out))
        shutil.move(archive, out / "autograder.zip")
    return [out / "setup.sh", out / "run_autograder", out / "pagedlab", out / "autograder.zip"]


def gradescope_json(result: dict) -> dict:
    """Only Gradescope's keys (its results.json)."""
    keys = ("score", "execution_time", "output", "visibility", "stdout_visibility", "tests")
    return {k: result[k] for k in keys if k in result}
