"""Shared test set-up: offline Hugging Face, a deterministic hypothesis profile, tiny model builders."""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from hypothesis import settings  # noqa: E402

# No hidden timing in tests: no deadline, and a fixed number of examples.
settings.register_profile("pagedlab", deadline=None, max_examples=60, derandomize=True, print_blob=True)
settings.load_profile("pagedlab")


import pytest  # noqa: E402
import torch  # noqa: E402

# Triton kernels run on the CPU through Triton's interpreter; it must be chosen before Triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REQUIRE_TRITON = os.environ.get("PAGEDLAB_REQUIRE_TRITON") == "1"
REQUIRE_GPU = os.environ.get("PAGEDLAB_REQUIRE_GPU") == "1"


def need_triton():
    """Import triton, or skip the test; under PAGEDLAB_REQUIRE_TRITON=1 (CI) a missing triton fails it."""
    try:
        import triton
    except ImportError as e:
        if REQUIRE_TRITON:
            pytest.fail(f"PAGEDLAB_REQUIRE_TRITON=1 but triton cannot be imported: {e}")
        pytest.skip(f"triton is not installed: {e}")
    return triton


REQUIRE_SMOLLM2 = os.environ.get("PAGEDLAB_REQUIRE_SMOLLM2") == "1"


def need_smollm2():
    """The fetched SmolLM2 folder, or skip; under PAGEDLAB_REQUIRE_SMOLLM2=1 (CI, `make test`) a missing one fails."""
    from pagedlab.model import registry

    if not registry.is_fetched(registry.SMOLLM2):
        if REQUIRE_SMOLLM2:
            pytest.fail("PAGEDLAB_REQUIRE_SMOLLM2=1 but SmolLM2 is not fetched (pagedlab fetch smollm2)")
        pytest.skip("SmolLM2 is not fetched (pagedlab fetch smollm2)")
    return registry.model_dir(registry.SMOLLM2)


def need_vllm() -> None:
    """Skip without `pagedlab fetch vllm`; under PAGEDLAB_REQUIRE_VLLM=1 (CI, `make test`) a missing one fails."""
    from pagedlab.lessons import vllm_peer

    problem = vllm_peer.fetched_problem()
    if problem is not None:
        if os.environ.get("PAGEDLAB_REQUIRE_VLLM") == "1":
            pytest.fail(f"PAGEDLAB_REQUIRE_VLLM=1 but vLLM is not fetched: {problem} (run `pagedlab fetch vllm`)")
        pytest.skip(f"vLLM {vllm_peer.VLLM.version} is not fetched ({problem}): `pagedlab fetch vllm`")


def need_pyodide() -> None:
    """Skip without `pagedlab fetch pyodide`; under PAGEDLAB_REQUIRE_PYODIDE=1 (CI, `make test`) a missing one fails."""
    from pagedlab.tools.fetch_pyodide import PYODIDE, fetched_problem

    problem = fetched_problem()
    if problem is not None:
        if os.environ.get("PAGEDLAB_REQUIRE_PYODIDE") == "1":
            pytest.fail(f"PAGEDLAB_REQUIRE_PYODIDE=1 but Pyodide is not fetched: {problem} (`pagedlab fetch pyodide`)")
        pytest.skip(f"Pyodide {PYODIDE.version} is not fetched ({problem}): `pagedlab fetch pyodide`")


REQUIRE_DOT = os.environ.get("PAGEDLAB_REQUIRE_DOT") == "1"


def need_dot():
    """Skip the test without graphviz's `dot` on PATH; under PAGEDLAB_REQUIRE_DOT=1 (CI) a missing dot fails it."""
    from pagedlab.viz.graphs import dot_available

    if not dot_available():
        if REQUIRE_DOT:
            pytest.fail("PAGEDLAB_REQUIRE_DOT=1 but graphviz's `dot` is not on PATH")
        pytest.skip("graphviz's `dot` is not on PATH (apt-get install graphviz)")


def triton_marker() -> str:
    """The marker of the stage whose preferred backend is Triton's (stage 6's)."""
    from pagedlab.stages import STAGES

    return next(p.marker for p in STAGES.values() if p.backends[0] == "triton")


def pytest_configure(config):
    """One marker per stage, from its preset (stages.py): the grader runs `-m stageN`."""
    from pagedlab.stages import STAGES

    for preset in STAGES.values():
        config.addinivalue_line("markers", f"{preset.marker}: stage {preset.number} ({preset.name}), {preset.question}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skipped stage-6 (Triton) test is a failure (chapters/97-architecture.md, Tests and CI)."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_TRITON and report.skipped and item.get_closest_marker(triton_marker()) is not None:
        report.outcome = "failed"
        report.longrepr = f"PAGEDLAB_REQUIRE_TRITON=1: stage-6 test {item.nodeid} was skipped"
    if REQUIRE_GPU and report.skipped and item.get_closest_marker("gpu") is not None:
        report.outcome = "failed"  # `make gpu-check` on a lent GPU: nothing may skip
        report.longrepr = f"PAGEDLAB_REQUIRE_GPU=1: GPU test {item.nodeid} was skipped"


@pytest.fixture(autouse=True)
def _close_figures():
    """Every pyplot figure a test opened is closed after it (pyplot keeps them all, and warns past 20)."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture(scope="session")
def random_model():
    """A tiny random Llama built without transformers: 2 layers, GQA, 50 tokens, weights N(0, 0.25)."""
    from pagedlab.model.config import ModelConfig
    from pagedlab.model.llama import CausalLM

    cfg = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 50,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "head_dim": 16,  # >= 16: Triton's tl.dot tiles need it (stage 6 runs this model too)
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
            "eos_token_id": 1,
        }
    )
    torch.manual_seed(0)
    model = CausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.25)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, random_model):
    """The random 2-layer model as a Hugging Face folder (no tokenizer: token-id prompts only)."""
    import json
    from dataclasses import asdict

    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny-llama")
    cfg = asdict(random_model.config)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "eos_token_id": 1,
        "rms_norm_eps": cfg["rms_norm_eps"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in random_model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    return folder
