"""`make gpu-check` (scripts/gpu_check.py), dry-run on the CPU: its four steps run at toy sizes, each says how it
went, and what it writes is what a GPU run writes (a GPU run itself needs a lent machine)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def test_the_dry_run_walks_every_step_and_writes_the_results(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert [line for line in out.splitlines() if line.startswith("== ")] == [
        "== device", "== gpu tests", "== bench kernel", "== bench real"
    ]  # fmt: skip
    assert "gpu-check: 4 of 4 steps passed" in out
    assert "test_triton_kernels_gpu.py" in (tmp_path / "gpu-tests.txt").read_text()  # collected, not run, on a CPU
    kernel = json.loads((tmp_path / "kernel.json").read_text())
    assert kernel["bench"] == "kernel" and kernel["rows"]
    real = json.loads((tmp_path / "real.json").read_text())
    systems = {r["system"] for r in real["rows"]}
    assert real["bench"] == "real" and {"pagedlab-continuous", "hf-generate", "step-profile"} <= systems
    assert all(r["device"] == "cpu" for r in real["rows"])
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["model_type"] == "llama"
