"""The test environment itself: CI must really have what the stage-6 tests need."""

import importlib.util
import os

import pytest


@pytest.mark.skipif(os.environ.get("PAGEDLAB_REQUIRE_TRITON") != "1", reason="only enforced in CI")
def test_triton_is_installed_in_ci():
    assert importlib.util.find_spec("triton") is not None, "PAGEDLAB_REQUIRE_TRITON=1 but triton is not installed"


def test_bookkeeping_never_imports_torch():
    """kv/ and sched/ are pure Python so they are tested in milliseconds (chapters/97-architecture.md, Layout)."""
    import pathlib

    import pagedlab

    root = pathlib.Path(pagedlab.__file__).parent
    for folder in ("kv", "sched"):
        for path in (root / folder).glob("*.py"):
            text = path.read_text()
            assert "import torch" not in text and "from torch" not in text, f"{path} imports torch"
