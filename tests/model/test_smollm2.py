"""The real model: SmolLM2-135M-Instruct (fetched by `pagedlab fetch smollm2`) equals transformers.

Slow (a 135 M-parameter model on CPU), but `make test` and CI fetch the model and run these
(PAGEDLAB_REQUIRE_SMOLLM2=1 turns a missing model into a failure instead of a skip).
"""

import os
import subprocess
import sys

import pytest
import torch

from pagedlab import LLM, SamplingParams
from tests.conftest import need_smollm2, need_triton

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
]
CHATS = [[{"role": "user", "content": q}] for q in QUESTIONS]
MAX_TOKENS = 24
STAGE6_TOKENS = 3  # Triton's interpreter runs every kernel program in Python: about a second per step here


@pytest.fixture(scope="module")
def folder():
    return need_smollm2()


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (
        AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(),
        AutoTokenizer.from_pretrained(folder),
    )


@pytest.fixture(scope="module")
def reference(hf):
    """transformers' greedy answers (one prompt at a time: no padding), up to and including <|im_end|>."""
    model, tok = hf
    answers = []
    for chat in CHATS:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=False)
        # An explicit mask: without one, transformers masks the prompt's <|im_end|> tokens (pad id == eos id).
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False)
        answers.append(out[0, ids.shape[1] :].tolist())
    return answers


def test_tokenizer_and_chat_template_equal_transformers(folder, hf):
    _, theirs = hf
    ours = LLM("smollm2-135m-instruct", stage=2, max_model_len=256).get_tokenizer()
    for text in QUESTIONS + ["naïve café 12345 🙂", "<|im_start|>user\nhi<|im_end|>\n", "  tabs\tand\n\nlines"]:
        assert ours.encode(text) == theirs(text)["input_ids"], text
    turns = CHATS[0] + [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]
    for chat in [CHATS[0], [{"role": "system", "content": "Be brief."}] + CHATS[1], turns]:
        for gen in (True, False):
            mine = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert mine == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)


@pytest.mark.numerics
@pytest.mark.parametrize("stage", [2, 5])
def test_greedy_chat_answers_equal_transformers(reference, stage):
    llm = LLM("smollm2-135m-instruct", stage=stage, max_model_len=512)
    outs = llm.chat(CHATS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == reference
    assert outs[0].outputs[0].text.startswith("The capital of France is Paris")


def test_greedy_chat_answers_equal_transformers_with_the_triton_kernels(reference):
    need_triton()
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1")
    llm = LLM("smollm2-135m-instruct", stage=6, max_model_len=512)
    assert llm.engine.attention_backend == "triton"
    outs = llm.chat(CHATS, SamplingParams(temperature=0, max_tokens=STAGE6_TOKENS), use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == [r[:STAGE6_TOKENS] for r in reference]


def test_pagedlab_chat_answers_paris_and_reuses_the_first_turn(folder):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = "from pagedlab.tools.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", cli, "chat", "What is the capital of France?", "And of Italy?", "--max-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    answers = [line for line in lines if line.startswith("bot> ")]
    assert "Paris" in answers[0] and "Rome" in answers[1]
    hits = [line.strip() for line in lines if line.strip().startswith("prefix cache:")]
    assert hits[0].startswith("prefix cache: 0 of ") and hits[1].endswith("from turn 1)")
