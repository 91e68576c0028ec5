"""Stage 6 end to end: the engine on Triton kernels (interpreter on a CPU) equals the oracle; fallback rules."""

from __future__ import annotations

import os

import pytest

from pagedlab import LLM, SamplingParams, load_model, oracle
from tests.conftest import need_triton
from tests.equivalence import assert_matches_oracle

pytestmark = [pytest.mark.stage6, pytest.mark.numerics]

PROMPTS = [[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 32, 3, 8, 4], [2, 7, 18, 28, 18, 28, 4, 5], [44, 2, 44, 2, 44]]


@pytest.mark.task("decode-tile")
@pytest.mark.task("prefill-tile")
@pytest.mark.task("store")
@pytest.mark.parametrize(
    "cfg",
    [
        {"block_size": 16},
        {"block_size": 4, "long_prefill_token_threshold": 6, "num_kv_blocks": 12},  # chunks, preemption, hits
    ],
)
def test_engine_on_triton_kernels_equals_the_oracle(tiny_model_dir, cfg):
    need_triton()
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"  # the interpreter runs on the CPU
    llm = LLM(
        model=str(tiny_model_dir), stage=6, max_num_seqs=3, max_model_len=64, debug_checks=True, device=device, **cfg
    )
    assert llm.engine.attention_backend == "triton"
    llm.engine.runner.attention.partition_size = 16  # contexts past 16 tokens take V2
    prompts = PROMPTS + [PROMPTS[0][:12] + [30]]  # shares full blocks with the first prompt
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    model = load_model(tiny_model_dir, device=device).model
    for prompt, out in zip(prompts, outs):
        expected = oracle.greedy(model, prompt, 8, eos_token_ids=(1,), max_model_len=64)
        assert_matches_oracle(out.outputs[0].token_ids, expected, label=str(prompt))
    assert llm.engine.runner.attention.versions_run == {"v1", "v2"}
    assert llm.engine.kv_manager.num_used_blocks == 0


def test_without_cuda_or_the_interpreter_stage_6_falls_back_to_torch(tiny_model_dir, monkeypatch):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("only meaningful where the interpreter is how Triton runs")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.warns(UserWarning, match="using the torch attention backend"):
        llm = LLM(model=str(tiny_model_dir), stage=6, max_model_len=64)
    assert llm.engine.attention_backend == "torch"
    with pytest.raises(ValueError, match="attention_backend: 'triton' needs Triton and a CUDA device"):
        LLM(model=str(tiny_model_dir), stage=6, max_model_len=64, attention_backend="triton")


def test_torch_backend_can_be_chosen_at_stage_6(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), stage="kernel", max_model_len=64, attention_backend="torch")
    assert llm.engine.attention_backend == "torch"
    out = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4
