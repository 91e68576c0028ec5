"""`pagedlab bench kernel`: the CPU parity run (Triton's interpreter), its JSON rows, and the fallbacks.

On a CPU the bench runs every kernel on tiny shapes under TRITON_INTERPRET=1 (conftest.py sets it before
Triton is imported) and reports only errors: latencies and bandwidth shares are null. No timing thresholds.
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
import torch

from pagedlab import bench
from pagedlab.bench.kernel import CPU_SHAPE, measure_kernel, peak_gbps_for
from tests.conftest import need_triton

pytestmark = pytest.mark.stage6

ROW_FIELDS = ("impl", "batch", "context_len", "dtype", "latency_us", "bandwidth_share", "max_abs_err")
IMPLS = {"torch", "triton-v1", "triton-v2", "triton-prefill", "sdpa"}
# fp16: output rounding (half an ulp near 1). bf16: the interpreter truncates fp32 -> bf16 on store: a whole ulp.
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@pytest.fixture(scope="module")
def cpu_rows():
    """The default CPU run: two requests of 37 tokens (ends mid-block), every impl, every dtype."""
    need_triton()
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the parity-only run needs the interpreter (conftest sets it where there is no CUDA)")
    return measure_kernel(quiet_console())


def quiet_console():
    from rich.console import Console

    return Console(file=io.StringIO(), width=120)


def test_cpu_run_has_every_field_and_null_timings(cpu_rows):
    need_triton()
    assert {r["impl"] for r in cpu_rows} == IMPLS
    assert {r["dtype"] for r in cpu_rows} == set(TOL)
    assert len(cpu_rows) == len(IMPLS) * len(TOL)  # one batch, one context
    for r in cpu_rows:
        assert set(ROW_FIELDS) <= r.keys()
        assert r["error"] is None, r
        assert r["latency_us"] is None and r["bandwidth_share"] is None and r["gbps"] is None
        assert r["interpreted"] and r["call_s"] > 0
        assert (r["batch"], r["context_len"], r["num_heads"], r["head_dim"]) == (2, 37, CPU_SHAPE.num_heads, 32)
        assert r["q_len"] == (16 if r["impl"] == "triton-prefill" else 1)


def test_cpu_run_matches_the_fp32_reference(cpu_rows):
    need_triton()
    for r in cpu_rows:
        assert r["max_abs_err"] < TOL[r["dtype"]], r
    # Partitions of 16 split a context of 37 into 3, and 2 requests x 4 heads are few: the launcher picks V2.
    assert {r["launcher_picks"] for r in cpu_rows if r["impl"] != "triton-prefill"} == {"v2"}


def test_json_stdout_is_one_object():
    need_triton()  # tiny shapes: quick under the interpreter and on a GPU alike
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        result = bench.run_bench("kernel", as_json=True, batches=(2,), context_lens=(37,), dtypes=("float32",))
    assert json.loads(stdout.getvalue()) == result and stdout.getvalue().count("\n") == 1
    assert result["bench"] == "kernel" and len(result["rows"]) == len(IMPLS)
    assert all(set(ROW_FIELDS) <= row.keys() for row in result["rows"])


def test_without_triton_the_bench_says_so_and_returns_no_rows(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    console = quiet_console()
    assert measure_kernel(console) == []
    assert "triton is not installed" in console.file.getvalue()


def test_peak_bandwidth_by_device_name():
    assert peak_gbps_for("NVIDIA H200") == 4800
    assert peak_gbps_for("NVIDIA H100 80GB HBM3") == 3350
    assert peak_gbps_for("NVIDIA H100 PCIe") == 2000
    assert peak_gbps_for("NVIDIA A100-SXM4-80GB") == 2039
    assert peak_gbps_for("NVIDIA L4") == 300 and peak_gbps_for("NVIDIA L40S") == 864
    assert peak_gbps_for("NVIDIA GeForce RTX 4090") == 1008
    assert peak_gbps_for("Some Future GPU") is None


@pytest.mark.slow
def test_the_bench_sets_the_interpreter_itself_in_a_fresh_process():
    need_triton()
    if torch.cuda.is_available():
        pytest.skip("with CUDA the interpreter is not used")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import io, json; from rich.console import Console; from pagedlab.bench.kernel import measure_kernel; "
        "c = Console(file=io.StringIO()); r = {'rows': measure_kernel(c, dtypes=('float32',))}; "
        "print(json.dumps([c.file.getvalue(), len(r['rows'])]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    log, num_rows = json.loads(out.stdout.splitlines()[-1])
    assert "set TRITON_INTERPRET=1 before importing triton" in log and num_rows == len(IMPLS)


def test_a_configuration_that_fails_becomes_error_rows(monkeypatch):
    need_triton()
    import pagedlab.bench.kernel as kernel

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(kernel, "make_case", out_of_memory)
    rows = measure_kernel(quiet_console(), batches=(2,), context_lens=(37,), dtypes=("float32",))
    assert [r["impl"] for r in rows] == list(kernel.IMPLS)
    assert all(r["error"].startswith("RuntimeError: out of memory") and r["max_abs_err"] is None for r in rows)
    json.dumps(rows, allow_nan=False)
