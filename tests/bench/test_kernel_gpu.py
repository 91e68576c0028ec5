"""`pagedlab bench kernel` on a GPU: the compiled kernels, timed and checked against torch.

Not a stage6 test: in CI (no GPU) it skips, and a skipped stage6 test fails there (tests/conftest.py).
Run it on a CUDA machine with TRITON_INTERPRET unset: `pytest -q -m gpu`.
"""

import io
import os

import pytest
import torch

from pagedlab.bench.kernel import IMPLS, measure_kernel
from tests.conftest import need_triton

pytestmark = pytest.mark.gpu


def test_gpu_run_times_every_impl():
    need_triton()
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("needs a CUDA device, and TRITON_INTERPRET unset (compiled kernels)")
    from rich.console import Console

    rows = measure_kernel(Console(file=io.StringIO()), batches=(2,), context_lens=(600,), dtypes=("float16",))
    assert [r["impl"] for r in rows] == list(IMPLS)
    for r in rows:
        assert r["error"] is None and r["latency_us"] > 0 and r["max_abs_err"] < 2e-3, r
        assert not r["interpreted"] and r["gbps"] > 0
