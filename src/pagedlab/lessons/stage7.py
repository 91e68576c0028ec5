"""Foundation (chapter 7, a real model served at stage 5): KV bytes per token with and without GQA, a shared
system prompt, a second turn, and preemption on a realistic pool, drawn from greedy runs of SmolLM2.

Builds on: lessons/common.py (the savers), lessons/stage5.py (the stage the runs use), model/registry.py (where the
fetched model lives), viz/ (block tables, schedules).
Read with: chapters/07-real-model.md.

Every run here serves SmolLM2-135M-Instruct (`pagedlab fetch smollm2`) at stage 5, greedy: four chats of a cooking
school that share one system prompt, 24 answer tokens at most. Two pools:

    STAGE7_POOL         kv_cache_memory="64MiB": 91 blocks of 16, room to spare (the prefix cache keeps everything)
    STAGE7_TIGHT_POOL   num_kv_blocks=10: the four chats need 14 blocks at their longest, so two are preempted

Without the fetched model these figures cannot be drawn: they raise ModelNotFetched before drawing anything, and
make_figures names every figure it skipped in one line.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from pagedlab import viz
from pagedlab.config import kv_bytes_per_token
from pagedlab.engine.stats import StepTrace
from pagedlab.lessons.common import _save
from pagedlab.llm import LLM
from pagedlab.model.config import ModelConfig
from pagedlab.model.registry import SMOLLM2, is_fetched, model_dir
from pagedlab.outputs import RequestOutput
from pagedlab.sampling_params import SamplingParams
from pagedlab.stages import config_for_model

STAGE7_MODEL = SMOLLM2.name  # "smollm2-135m-instruct"
STAGE7_SYSTEM = (
    "You are the assistant of a cooking school. Answer every question in two or three plain sentences, "
    "without lists or headings."
)
STAGE7_QUESTIONS = (
    "How long should I boil an egg?",
    "What is a roux?",
    "Why does bread rise?",
    "How do I keep pasta from sticking?",
)
STAGE7_FOLLOW_UP = "And a soft-boiled one?"  # the second turn of the first chat
STAGE7_MAX_TOKENS = 24
STAGE7_POOL = dict(kv_cache_memory="64MiB")  # blocks of 16 (the default, as vLLM's)
STAGE7_TIGHT_POOL = dict(num_kv_blocks=10)
STAGE7_BUDGET = "64MiB"  # the byte budget the GQA figure compares pools in


class ModelNotFetched(Exception):
    """A figure that needs SmolLM2 was asked for before `pagedlab fetch smollm2`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        super().__init__(skipped_line([self.path]))


def skipped_line(paths) -> str:
    """The one line make_figures prints for every figure skipped for want of the model."""
    names = ", ".join(str(p) for p in paths)
    return f"{STAGE7_MODEL} is not fetched: skipped {names}; `pagedlab fetch {SMOLLM2.alias}` fetches it (93 MB)"


def require_model(path: Path) -> None:
    if not is_fetched(SMOLLM2):
        raise ModelNotFetched(path)


def stage7_chats() -> list[list[dict]]:
    """The four conversations: the shared system prompt, then one question each."""
    return [[{"role": "system", "content": STAGE7_SYSTEM}, {"role": "user", "content": q}] for q in STAGE7_QUESTIONS]


def stage7_params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=STAGE7_MAX_TOKENS)


def follow_up(chat: list[dict], answer: RequestOutput) -> list[dict]:
    """The conversation with the model's answer appended and the next question asked."""
    said = {"role": "assistant", "content": answer.outputs[0].text}
    return chat + [said, {"role": "user", "content": STAGE7_FOLLOW_UP}]


# --- the prompt as tokens in blocks ---------------------------------------------------------------------------------


def token_pieces(tokenizer, token_ids: list[int]) -> list[str]:
    """Each token's text, special tokens by name (decode leaves them out): ['<|im_start|>', 'system', '\\n', ...]."""
    special = {tokenizer.token_to_id(t): t for t in tokenizer.special_tokens.values()}
    return [special.get(i) or tokenizer.decode([i]) for i in token_ids]


def prompt_blocks(tokenizer, token_ids: list[int], block_size: int) -> list[list[str]]:
    """The prompt's token texts cut into the blocks the KV cache will hold them in."""
    pieces = token_pieces(tokenizer, token_ids)
    return [pieces[i : i + block_size] for i in range(0, len(pieces), block_size)]


# --- KV bytes per token: GQA vs the same model with a KV head per query head ----------------------------------------


def smollm2_config() -> ModelConfig:
    return ModelConfig.from_file(model_dir(SMOLLM2) / "config.json")


def as_mha(mc: ModelConfig) -> ModelConfig:
    """The same model with as many KV heads as query heads (multi-head attention, no grouping)."""
    from dataclasses import replace

    return replace(mc, num_key_value_heads=mc.num_attention_heads)


@dataclass(frozen=True)
class KVSize:
    """One model shape's KV cost, and what a byte budget holds of it."""

    label: str  # e.g. "GQA: 3 KV heads"
    num_kv_heads: int  # KVH
    bytes_per_token: dict[str, int]  # dtype -> 2 x layers x KVH x D x bytes
    num_kv_blocks: int  # blocks of 16 that STAGE7_BUDGET holds, in float32 (EngineConfig's own sizing)


def kv_sizes(mc: ModelConfig) -> list[KVSize]:
    """SmolLM2 as it is (grouped-query attention) and as multi-head attention, side by side."""
    out = []
    for label, shape in (("GQA", mc), ("MHA", as_mha(mc))):
        per_dtype = {dtype: kv_bytes_per_token(shape, dtype) for dtype in ("float32", "bfloat16")}
        blocks = config_for_model(5, shape, kv_cache_memory=STAGE7_BUDGET).num_kv_blocks
        heads = shape.num_key_value_heads
        out.append(KVSize(f"{label}: {heads} KV heads", heads, per_dtype, blocks))
    return out


def fig_07_kv_per_token(out_dir: Path) -> Path:
    path = out_dir / "07_kv_per_token.png"
    require_model(path)
    mc = smollm2_config()
    sizes = kv_sizes(mc)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    labels = [s.label for s in sizes]
    for offset, dtype, colour in ((-0.2, "float32", viz.USED), (0.2, "bfloat16", viz.RESERVED)):
        values = [s.bytes_per_token[dtype] for s in sizes]
        bars = left.bar([i + offset for i in range(len(sizes))], values, width=0.4, color=colour, label=dtype)
        left.bar_label(bars, [f"{v:,} B" for v in values], fontsize=8)
    left.set_xticks(range(len(sizes)), labels)
    left.set(ylabel="KV bytes per token", ylim=(0, 1.25 * sizes[-1].bytes_per_token["float32"]))
    left.set_title(f"2 x {mc.num_hidden_layers} layers x KV heads x {mc.head_dim} x bytes", fontsize=10)
    left.legend(fontsize=8, loc="upper left")
    tokens = [s.num_kv_blocks * 16 for s in sizes]
    bars = right.bar(range(len(sizes)), tokens, width=0.5, color=viz.USED)
    right.bar_label(bars, [f"{s.num_kv_blocks} blocks\n{t:,} tokens" for s, t in zip(sizes, tokens)], fontsize=8)
    right.set_xticks(range(len(sizes)), labels)
    right.set(ylabel="tokens of KV", ylim=(0, 1.3 * max(tokens)))
    right.set_title(f"what a {STAGE7_BUDGET.replace('MiB', ' MiB')} pool holds (float32, blocks of 16)", fontsize=10)
    fig.suptitle(f"SmolLM2-135M: {mc.num_attention_heads} query heads share {mc.num_key_value_heads} KV heads")
    fig.tight_layout()
    return _save(fig, path)


# --- a batch of chats, then a second turn, on a roomy pool -----------------------------------------------------------


@dataclass(frozen=True)
class ChatRun:
    """The four chats answered at once, then the first chat's second turn, on one engine."""

    outputs: list[RequestOutput]  # the four answers, in chat order
    second: RequestOutput  # the first chat's second turn
    batch_trace: list[StepTrace]  # the steps of the four chats
    second_trace: list[StepTrace]  # the steps of the second turn
    num_kv_blocks: int  # the pool
    block_size: int  # tokens per block
    cached: set[int]  # blocks carrying a block hash when the second turn arrived (the four chats' full blocks)


@functools.cache
def chat_run() -> ChatRun:
    """stage7_chats() with STAGE7_POOL, greedy, all four in one llm.chat call; then follow_up() of the first."""
    llm = LLM(STAGE7_MODEL, stage=5, record_trace=True, **STAGE7_POOL)
    outputs = llm.chat(stage7_chats(), stage7_params(), use_tqdm=False)
    batch_steps, cached = len(llm.engine.trace), viz.cached_block_ids(llm.engine.kv_manager.pool)
    second = llm.chat(follow_up(stage7_chats()[0], outputs[0]), stage7_params(), use_tqdm=False)[0]
    trace, cfg = list(llm.engine.trace), llm.engine.config
    return ChatRun(outputs, second, trace[:batch_steps], trace[batch_steps:], cfg.num_kv_blocks, cfg.block_size, cached)


def fig_07_shared_prefix(out_dir: Path) -> Path:
    path = out_dir / "07_shared_prefix.png"
    require_model(path)
    run = chat_run()
    first = run.batch_trace[0]  # every chat is admitted in step 1: its blocks, and which of them were hits
    hits = viz.prefix_hit_blocks(run.batch_trace, run.block_size)
    fig = viz.plot_block_tables(first, run.num_kv_blocks, run.block_size, arrows_for=[], pool_columns=16, hits=hits)
    return _save(fig, path)


def fig_07_second_turn(out_dir: Path) -> Path:
    path = out_dir / "07_second_turn.png"
    require_model(path)
    run = chat_run()
    first = run.second_trace[0]
    hits = viz.prefix_hit_blocks(run.second_trace, run.block_size)
    fig = viz.plot_block_tables(
        first, run.num_kv_blocks, run.block_size, arrows_for=[], pool_columns=16, hits=hits, cached=run.cached
    )
    return _save(fig, path)


# --- the same chats on a pool too small for all of them --------------------------------------------------------------


@dataclass(frozen=True)
class TightRun:
    """The four chats on STAGE7_TIGHT_POOL."""

    outputs: list[RequestOutput]  # the same tokens as ChatRun.outputs: preemption changes when, not what
    trace: list[StepTrace]  # every step
    num_kv_blocks: int  # the pool
    block_size: int  # tokens per block


@functools.cache
def tight_run() -> TightRun:
    llm = LLM(STAGE7_MODEL, stage=5, record_trace=True, **STAGE7_TIGHT_POOL)
    outputs = llm.chat(stage7_chats(), stage7_params(), use_tqdm=False)
    cfg = llm.engine.config
    return TightRun(outputs, list(llm.engine.trace), cfg.num_kv_blocks, cfg.block_size)


def resumed_with(trace: list[StepTrace]) -> dict[tuple[str, int], int]:
    """(request id, step) -> tokens that already had K/V when the request was admitted again after a preemption:
    the prefix cache's share of its recompute."""
    out, preempted = {}, set()
    for before, step in zip(trace, trace[1:]):
        preempted |= set(step.preempted)
        for rid in step.running:
            if rid in preempted and rid not in before.running and rid in step.scheduled:
                out[(rid, step.step)] = step.kv_used[rid] - step.scheduled[rid]
                preempted.discard(rid)
    return out


def fig_07_preemption(out_dir: Path) -> Path:
    path = out_dir / "07_preemption.png"
    require_model(path)
    run = tight_run()
    lens = viz.prompt_lens_of(run.outputs)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    viz.plot_schedule_gantt(run.trace, lens, ax=top, title=f"Four chats in {run.num_kv_blocks} blocks of 16")
    _plot_blocks_held(bottom, run.trace, run.num_kv_blocks)
    top.set_xlabel("")
    fig.tight_layout()
    return _save(fig, path)


def _plot_blocks_held(ax, trace: list[StepTrace], num_kv_blocks: int) -> None:
    """Physical blocks held per step (a block shared by four chats counts once), and the steps that preempted."""
    steps = [step.step for step in trace]
    ax.fill_between(steps, 0, [step.num_used_blocks for step in trace], step="mid", color=viz.USED, label="held")
    ax.axhline(num_kv_blocks, color="black", linewidth=1, linestyle="--", label=f"capacity ({num_kv_blocks} blocks)")
    preempted = sorted({step for step, _ in viz.preemption_events(trace)})
    ax.vlines(preempted, 0, num_kv_blocks, color=viz.PREEMPTED, linewidth=1.5, label="a preemption")
    ax.set(xlabel="engine step", ylabel="KV blocks held", ylim=(0, 1.35 * num_kv_blocks))
    ax.legend(loc="upper left", ncols=3, fontsize=8, frameon=False)
