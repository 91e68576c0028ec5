"""Stage 7: the exercises of chapter 7 (a real model), and the runs that answer them.

Builds on: lessons/stage7.py (the chats, prompt_blocks, SmolLM2's config), config.py (kv_bytes_per_token),
llm.py (a stage-5 engine), viz/schedule.py (preemption_events), lessons/exercises/core.py.
Read with: chapters/07-real-model.md (Exercises, Solutions).

Exercises 7.1, 7.4 and 7.6 read SmolLM2 (`pagedlab fetch smollm2`); 7.2 is arithmetic on a model's shape.
"""

from __future__ import annotations

import functools

from pagedlab import viz
from pagedlab.config import kv_bytes_per_token
from pagedlab.lessons import stage7
from pagedlab.lessons.exercises.core import Exercise
from pagedlab.llm import LLM
from pagedlab.model.config import ModelConfig
from pagedlab.model.registry import SMOLLM2, is_fetched, model_dir
from pagedlab.model.tokenizer import Tokenizer
from pagedlab.sampling_params import SamplingParams

GIB = 1 << 30
BRIEF = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
LLAMA3_8B = ModelConfig(  # the shape of Llama-3-8B (its config.json); no weights are needed for arithmetic
    architecture="LlamaForCausalLM", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
)  # fmt: skip


def require_smollm2() -> None:
    if not is_fetched(SMOLLM2):
        raise stage7.ModelNotFetched("this exercise's check")


@functools.cache
def count_the_blocks() -> dict:
    require_smollm2()
    tokenizer = Tokenizer.from_folder(model_dir(SMOLLM2))
    text = tokenizer.apply_chat_template(BRIEF, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    blocks = stage7.prompt_blocks(tokenizer, ids, 16)
    return {"tokens": len(ids), "blocks": len(blocks), "block0_ends": blocks[0][-1]}


@functools.cache
def a_larger_model() -> dict:
    out = {}
    for name, shape in (("gqa", LLAMA3_8B), ("mha", stage7.as_mha(LLAMA3_8B))):
        per_token = kv_bytes_per_token(shape, "bfloat16")
        out[f"bytes_{name}"] = per_token
        out[f"requests_{name}"] = 16 * GIB // (2048 * per_token)
    return out


@functools.cache
def priority_on_a_tight_pool() -> list[tuple[int, str]]:
    require_smollm2()
    llm = LLM(stage7.STAGE7_MODEL, stage=5, record_trace=True, scheduling_policy="priority",
              **stage7.STAGE7_TIGHT_POOL)  # fmt: skip
    tokenizer, engine = llm.get_tokenizer(), llm.engine
    for i, chat in enumerate(stage7.stage7_chats()):
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompt = {"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)}
        bread = "bread" in chat[-1]["content"]
        engine.add_request(str(i), prompt, stage7.stage7_params(), priority=1 if bread else 0)
    while engine.has_unfinished_requests():
        engine.step()
    return [(step, rid) for step, rid in viz.preemption_events(engine.trace)]


@functools.cache
def one_system_prompt() -> dict:
    """100 chats of one 500-token system prompt and a short message each, admitted in one continuous step."""
    require_smollm2()
    engine = LLM(stage=5, block_size=16, num_kv_blocks=4000, max_num_seqs=100, max_num_batched_tokens=4096).engine
    shared = [3 + i % 40 for i in range(500)]  # token ids of the bundled model: the blocks do not care which
    for chat in range(100):
        own = [3 + chat % 40, 3 + chat // 40, 5, 6]
        engine.add_request(str(chat), shared + own, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    engine.step()
    kv = engine.kv_manager
    saved = kv.num_table_blocks() - kv.num_used_blocks
    per_token = kv_bytes_per_token(stage7.smollm2_config(), "float32")
    return {"blocks_saved": saved, "bytes_saved": saved * kv.block_size * per_token}


EXERCISES = [
    Exercise(
        "07.1",
        "Count the blocks",
        count_the_blocks,
        parts=("tokens", "blocks", "block0_ends"),
        form='{"tokens": n, "blocks": n, "block0_ends": "the text of block 0\'s last token"}',
        hints={
            "tokens": (
                "Render it with the tokenizer's apply_chat_template, then encode with no token added.",
                "Without a system message the template writes its own, a long one.",
            ),
            "blocks": ("cdiv(tokens, 16): a partly filled last block counts.",),
            "block0_ends": (
                "prompt_blocks(tokenizer, ids, 16)[0] lists block 0's tokens; BPE pieces keep their leading space.",
            ),
        },
        explain="Your short system message replaces the template's default one, which is longer.",
        code="lessons/stage7.py prompt_blocks, model/chat_template.py",
        needs="smollm2",
    ),
    Exercise(
        "07.2",
        "A larger model",
        a_larger_model,
        parts=("bytes_gqa", "bytes_mha", "requests_gqa", "requests_mha"),
        form='{"bytes_gqa": B per token, "bytes_mha": ..., "requests_gqa": n, "requests_mha": n}',
        hints={
            "": (
                "KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x bytes per element.",
                "Without GQA the model has a KV head per query head.",
                "A request of 2,048 tokens holds 2,048 times that; 16 GiB is 16 x 2^30 bytes.",
            ),
        },
        graded="the KV-size formula and what it means for batch size; any model card gives a new one",
        explain="Layers and KV heads enter the product alike; GQA divides by H / KVH at no cost in layers.",
        code="config.py kv_bytes_per_token, lessons/stage7.py kv_sizes",
    ),
    Exercise("07.3", "Why 32 and not 44?", solution=True),
    Exercise(
        "07.4",
        "Priority on a tight pool",
        priority_on_a_tight_pool,
        form="[(step, request id), ...]: every preemption, in order",
        hints={
            "": (
                "Under priority the victim is the least urgent running request (the largest number), ties by "
                "arrival: the newest of equals goes first.",
                "A preemption happens only when a running request needs a block and none is free: the steps "
                "depend on when each chat's blocks fill, as in the chapter's FCFS run.",
            ),
        },
        graded="the victim rule of each policy, on a real model's run; give another chat the low priority",
        explain="The policy picks who leaves, not when: the pool runs dry when it did under FCFS.",
        code="sched/queue.py PriorityQueue, sched/continuous.py _preempt_until_it_fits",
        needs="smollm2",
    ),
    Exercise("07.5", "Read vLLM", solution=True),
    Exercise(
        "07.6",
        "One system prompt, many users",
        one_system_prompt,
        parts=("blocks_saved", "bytes_saved"),
        form='{"blocks_saved": n, "bytes_saved": bytes}',
        hints={
            "blocks_saved": (
                "Only full blocks are shared, and only those wholly inside the common prefix.",
                "Every chat but the first finds them in the cache.",
            ),
            "bytes_saved": ("A block of SmolLM2 holds 16 tokens of 2 x layers x KV heads x head_dim x 4 bytes.",),
        },
        solution=True,
        graded="prefix sharing's saving by arithmetic, then the date question to explain; vary the prompt length",
        explain="Every chat after the first holds the system prompt's full blocks by reference; the block where the "
        "prompt ends and a chat's own message begins is that chat's alone.",
        code="kv/prefix.py get_computed_blocks, config.py kv_bytes_per_token",
        needs="smollm2",
    ),
]
