"""bfloat16 on a CPU: our decoder against transformers in bfloat16, and every stage against the bfloat16 oracle.

The tolerance. bfloat16 keeps 8 bits of mantissa, so each rounding is off by up to 2**-9 of its value, and two
implementations that add or multiply in a different order (a fused RMSNorm, another attention, another matmul
blocking) round differently. How far apart may they be? As far as bfloat16 itself is from float32: transformers'
own bfloat16 logits differ from its float32 ones by `own_error` (0.28 to 0.45 on these tiny models, whose logits
reach 6 to 8.5). Ours must be no farther from transformers' bfloat16 than that (measured: 0.13 to 0.27), and a greedy
token may differ only where transformers' bfloat16 top two were closer than twice it (a near tie in bfloat16).
"""

import pytest
import torch

from pagedlab import LLM, SamplingParams, load_model, oracle
from pagedlab.stages import STAGES
from tests.model.hf_models import KINDS, save_hf_model
from tests.model.test_hf_parity import PROMPT, _bounds, _no_cache

pytestmark = pytest.mark.numerics  # floats torch computed: run again on its other CPU kernels

transformers = pytest.importorskip("transformers")

LONG_PROMPT = PROMPT * 3  # 36 tokens: past every sliding window of 8


@pytest.fixture(scope="module", params=sorted(KINDS))
def models(request, tmp_path_factory):
    """(transformers float32, transformers bfloat16, ours bfloat16, the folder) for one kind."""
    folder = tmp_path_factory.mktemp(f"bf16-{request.param}")
    hf32 = save_hf_model(request.param, folder)
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    return hf32, hf16, load_model(folder, dtype=torch.bfloat16), folder


def hf_logits(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()  # [T, V]


def own_error(hf32, hf16, tokens) -> float:
    """How far transformers' bfloat16 logits are from its float32 ones: bfloat16's own error on this input."""
    return (hf_logits(hf16, tokens) - hf_logits(hf32, tokens)).abs().max().item()


def test_logits_within_bfloat16s_own_error_of_transformers_bfloat16(models):
    hf32, hf16, ours, _ = models
    with torch.no_grad():
        ids = torch.tensor(LONG_PROMPT)
        hidden = ours.model(ids, torch.arange(len(ids)), _no_cache(ours), _bounds(len(ids)))
        got = ours.model.compute_logits(hidden)
    assert ours.model.lm_head.weight.dtype == torch.bfloat16 and hidden.dtype == torch.bfloat16
    expected, tolerance = hf_logits(hf16, LONG_PROMPT), own_error(hf32, hf16, LONG_PROMPT)
    assert 0.05 < tolerance < 1.0, tolerance  # bfloat16 is visibly coarser than float32, and not broken
    assert (got - expected).abs().max().item() <= tolerance


def test_engine_greedy_tokens_equal_transformers_bfloat16_but_at_near_ties(models):
    hf32, hf16, _, folder = models
    tolerance = 2 * own_error(hf32, hf16, LONG_PROMPT)
    with torch.no_grad():
        out = hf16.generate(torch.tensor([LONG_PROMPT]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                            pad_token_id=0, output_scores=True, return_dict_in_generate=True)  # fmt: skip
    expected = out.sequences[0, len(LONG_PROMPT) :].tolist()
    llm = LLM(str(folder), stage="continuous", dtype="bfloat16", block_size=4, num_kv_blocks=32)
    got = llm.generate([LONG_PROMPT], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), use_tqdm=False)
    got = got[0].outputs[0].token_ids
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            top2 = out.scores[i][0].float().topk(2).values
            assert top2[0] - top2[1] < tolerance, f"output {i}: {a} vs {b}, gap {top2[0] - top2[1]:.3f}"
            break  # after a near tie the two continue from different tokens


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_stage_runs_in_bfloat16_and_equals_the_bfloat16_oracle(stage):
    """The bundled model in bfloat16, at every stage: each equals the bfloat16 oracle (no cache at all), but where
    the oracle's top two logits are within bfloat16's reach of each other."""
    llm = LLM(stage=stage, dtype="bfloat16", block_size=4, num_kv_blocks=96, max_num_seqs=3, max_model_len=32)
    prompts = ["ROMEO:", "JULIET: O Romeo", "KING HENRY: Once more"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    model, fp32 = llm.loaded.model, load_model().model
    assert next(model.parameters()).dtype == torch.bfloat16
    for out in outs:
        ref = oracle.greedy(model, out.prompt_token_ids, max_tokens=8)
        tokens = out.prompt_token_ids + ref.token_ids
        tolerance = 2 * (oracle.last_logits(model, [tokens]) - oracle.last_logits(fp32, [tokens])).abs().max().item()
        for i, (a, b) in enumerate(zip(out.outputs[0].token_ids, ref.token_ids)):
            if a != b:
                assert ref.top2_gaps[i] < tolerance, f"stage {stage}, output {i}: gap {ref.top2_gaps[i]:.3f}"
                break
