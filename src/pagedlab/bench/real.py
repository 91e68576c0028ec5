"""Benchmarks: `pagedlab bench real`, a real chat model on a CPU, every system given the same KV bytes.

Builds on: bench/real_systems.py (the four systems, each sized to a KV budget), bench/real_profile.py (the decode
step against its matmuls), bench/rounds.py (turns and spread), bench/workloads.py (ShareGPT-like lengths).
Read with: chapters/97-architecture.md (Benchmarks), chapters/07-real-model.md (Measurements).

The vLLM paper's claim (its Fig. 12) is about memory: paging lets the same KV
memory hold more requests, so the batch is larger and a step, which reads every
weight once whatever the batch, yields more tokens. So every system here gets
the same KV budget in bytes and makes of it what its design allows:

    hf-generate          the largest static batch whose padded worst case fits: every row as long as the
                         stream's longest prompt plus its largest max_tokens (a contiguous cache per row)
    hf-generate-batch    transformers' own paged continuous batching, its cache sized to the budget
    pagedlab-static      stage 4: a pool of exactly the budget; a batch admitted by worst case, run to its end
    pagedlab-continuous  stage 5: the same pool; blocks on demand, a freed seat refilled the next step

    budget 64 MiB, 46,080 B a token (float32):  1,456 token slots
    hf-generate      | 332 | 332 | 332 | 332 |  4 rows padded to the worst case, most of it never written
    pagedlab         | 97 |120| 71 | 144 | 88 |115| 61 | 130 |101| 90 |...   whoever fits, as long as they are

SmolLM2-135M-Instruct serves one seeded stream of chat requests (a question about a passage of the bundled
corpus, rendered by its ChatML template), all queued at t=0, greedy, with answer lengths drawn from the
ShareGPT-like distribution of the throughput bench (scaled) and enforced with ignore_eos, so that every system
does the same work. Seats (`max_num_seqs`) are never the bound: memory is. The bench sweeps a few budgets
(the figure: tokens/s against KV budget, one line per system), taking turns at each; the targets are read at
the default budget. Then the step profile (bench/real_profile.py): one decode step at batch 8 and 32 beside its
matmuls alone.
The systems: bench/real_systems.py; tables, targets and figure: bench/real_report.py.
"""

from __future__ import annotations

import functools
import math
import random
import statistics

from pagedlab.bench.common import progress
from pagedlab.bench.real_systems import ENGINE_STAGES, hf_static_batch
from pagedlab.bench.rounds import round_robin, spread
from pagedlab.bench.runs import BenchRequest, Run, best_run, hf_generate_job, serve_engine
from pagedlab.bench.workloads import sample_requests

MODEL = "smollm2-135m-instruct"  # a registered name (model/registry.py): `pagedlab fetch smollm2` makes it
NUM_REQUESTS = 32  # enough that the queue outlasts the first batches: memory, not the stream, sets the batch
MIB = 2**20
KV_BUDGETS = (16 * MIB, 32 * MIB, 64 * MIB)  # the sweep, in bytes of K and V (any dtype)
DEFAULT_BUDGET = 32 * MIB  # binds: in float32 it holds 728 tokens, hf-generate's padded worst case 3 rows
LENGTH_SCALE = 0.1  # ShareGPT-like output lengths (mean 338) scaled to a CPU's patience: a mean of about 30
OUTPUT_CAP = 96  # and cut here, so that the longest request fits the smallest budget
PASSAGE_LINES = (1, 8)  # lines of the corpus quoted in a question: prompts of about 45 to 140 tokens
MAX_NUM_SEQS = 64  # seats: more than any budget here can hold, so memory is what binds
MAX_NUM_BATCHED_TOKENS = 2048  # tokens per step at most, for pagedlab and hf-generate-batch alike
BLOCK_SIZE = 16
REPEATS = 2  # rounds at the default budget (each system's best run is reported); the other budgets run once
TARGETS = {"hf-generate": 2.0, "hf-generate-batch": 1.3}  # pagedlab-continuous ÷ each, tokens/s, default budget
CONTINUOUS, STATIC, HF, HF_BATCH = "pagedlab-continuous", "pagedlab-static", "hf-generate", "hf-generate-batch"
SYSTEMS = (CONTINUOUS, STATIC, HF, HF_BATCH)
PROFILE = "step-profile"  # the rows of the step profile (bench/real_profile.py)
CHATML = (  # SmolLM2's template, for a folder whose tokenizer has none
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
)
QUESTIONS = (
    "Summarize this passage in one sentence:",
    "Who is speaking here, and to whom?",
    "Rewrite these lines in modern English:",
    "What is the mood of these lines?",
    "Continue this scene for a few lines:",
    "Explain what is happening here:",
)
CORPUS_CHARS = 200_000  # passages are cut from the corpus's first characters


def chat_prompt(tokenizer, question: str) -> list[int]:
    """The question as a one-turn conversation, through the model's chat template (else SmolLM2's ChatML)."""
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template"):
        messages = [{"role": "user", "content": question}]
        return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
    return tokenizer.encode(CHATML.format(q=question), add_special_tokens=False)


def answer_lengths(num_requests: int, seed: int, scale: float = LENGTH_SCALE, cap: int = OUTPUT_CAP) -> list[int]:
    """Seeded ShareGPT-like output lengths (bench/workloads.py: lognormal, mean 338, long tail), scaled, in 1..cap."""
    specs = sample_requests("sharegpt", num_requests, seed=seed)
    return [min(cap, max(1, round(s.output_len * scale))) for s in specs]


def make_stream(
    tokenizer, num_requests: int = NUM_REQUESTS, seed: int = 0, scale: float = LENGTH_SCALE, cap: int = OUTPUT_CAP
) -> list[BenchRequest]:
    """Seeded questions about passages of 1-8 corpus lines, each with its ShareGPT-like max_tokens."""
    from pagedlab.model.loader import corpus_path

    lines = [line for line in corpus_path().read_text(encoding="utf-8")[:CORPUS_CHARS].splitlines() if line]
    rng, stream = random.Random(f"real-{seed}"), []
    for max_tokens in answer_lengths(num_requests, seed, scale, cap):
        count = rng.randint(*PASSAGE_LINES)
        start = rng.randrange(len(lines) - count)
        question = f"{rng.choice(QUESTIONS)}\n\n" + "\n".join(lines[start : start + count])
        stream.append(BenchRequest(tuple(chat_prompt(tokenizer, question)), max_tokens))
    return stream


# --- rows -----------------------------------------------------------------------------------------------------------


def empty_row(system: str) -> dict:
    """Every field of every row, null where it does not apply (chapters/97-architecture.md, Benchmarks)."""
    keys = ("dtype", "kv_budget_bytes", "default_budget", "tokens_per_s", "tokens_per_s_median", "tokens_per_s_worst")
    keys += ("mean_running", "max_running", "tokens_per_step", "batch", "num_kv_blocks", "ttft_s", "ttft_p50_s")
    keys += ("ttft_p99_s",)
    keys += ("latency_s", "num_requests", "num_generated_tokens", "threads", "wall_s", "steps", "decode_step_ms")
    keys += ("matmul_step_ms", "attention_step_ms", "context_mean", "step_vs_matmul", "kv_read_mb", "weights_mb")
    keys += ("same_tokens_as_hf", "requests_differing_from_hf", "continuous_vs_this", "error", "runs")
    return {"system": system, **dict.fromkeys(keys)}


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks, as numpy's default."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    return ordered[low] + (ordered[min(low + 1, len(ordered) - 1)] - ordered[low]) * (pos - low)


def run_row(system: str, runs: list[Run], budget: int, dtype: str, batch: int | None) -> dict:
    """One flat row from a system's runs at one budget: its fastest run, and the spread of tokens/s."""
    row = empty_row(system) | {"dtype": dtype, "kv_budget_bytes": budget, "runs": len(runs), "batch": batch}
    row["default_budget"] = budget == DEFAULT_BUDGET
    best, good = best_run(system, runs), [r for r in runs if r.error is None]
    if best is None:
        return row | {"error": runs[0].error}
    tokens = sum(len(t) for t in best.token_ids)
    row |= spread([tokens / r.wall_s for r in good], "tokens_per_s")
    row |= {"num_requests": len(best.token_ids), "num_generated_tokens": tokens, "threads": best.threads}
    row |= {"wall_s": best.wall_s, "steps": best.steps, "num_kv_blocks": best.num_kv_blocks}
    if best.steps:
        row["tokens_per_step"] = tokens / best.steps  # a request's own tokens per step: the batch that counted
    row |= {"ttft_s": statistics.fmean(best.first_token_s), "latency_s": statistics.fmean(best.latency_s)}
    row |= {"ttft_p50_s": percentile(best.first_token_s, 50), "ttft_p99_s": percentile(best.first_token_s, 99)}
    if best.running:
        row |= {"mean_running": statistics.fmean(best.running), "max_running": max(best.running)}
    if best.decode_step_s is not None:
        row["decode_step_ms"] = 1000 * best.decode_step_s
    return row


def add_comparisons(rows: list[dict], token_ids: dict[tuple, list[list[int]]]) -> None:
    """Each row against hf-generate's tokens at its budget, and pagedlab-continuous's tokens/s ÷ each row's."""
    by = {(r["dtype"], r["kv_budget_bytes"], r["system"]): r for r in rows}
    for row in rows:
        dtype, budget, name = row["dtype"], row["kv_budget_bytes"], row["system"]
        ref, mine = token_ids.get((dtype, budget, HF)), token_ids.get((dtype, budget, name))
        if ref is not None and mine is not None:
            differing = sum(a != b for a, b in zip(mine, ref))
            row |= {"same_tokens_as_hf": differing == 0, "requests_differing_from_hf": differing}
        cont = by.get((dtype, budget, CONTINUOUS), {}).get("tokens_per_s")
        if cont and row["tokens_per_s"]:
            row["continuous_vs_this"] = cont / row["tokens_per_s"]


def real_rows(
    console,
    model: str = MODEL,
    num_requests: int = NUM_REQUESTS,
    kv_budgets: tuple[int, ...] = KV_BUDGETS,
    dtypes: tuple[str, ...] = ("float32",),
    seed: int = 0,
    repeats: int = REPEATS,
    length_scale: float = LENGTH_SCALE,
    output_cap: int = OUTPUT_CAP,
    profile_batches: tuple[int, ...] = (8, 32),
    profile_steps: int = 8,
    device: str = "cpu",
) -> list[dict]:
    """Every system at every budget and dtype, taking turns (the default budget for `repeats` rounds, the others
    once); then the step profile. Progress on the console."""
    from pagedlab.bench.real_profile import step_profile_rows

    rows, tokens = [], {}
    rounds = {b: repeats if b == DEFAULT_BUDGET or len(kv_budgets) == 1 else 1 for b in kv_budgets}
    total = len(dtypes) * (len(SYSTEMS) * sum(rounds.values()) + len(profile_batches))
    with progress(console, total, "real") as tick:
        for dtype in dtypes:
            systems = SystemSet(model, num_requests, seed, dtype, length_scale, output_cap, device)
            for budget in kv_budgets:
                new, made = systems.measure(console, budget, rounds[budget], tick)
                rows += new
                tokens |= made
            systems.close()
            profile = (profile_batches, profile_steps, tick, device)
            measured = step_profile_rows(console, model, dtype, systems.stream, *profile, system=CONTINUOUS,
                                         block_size=BLOCK_SIZE)  # fmt: skip
            rows += [empty_row(PROFILE) | row for row in measured]
    add_comparisons(rows, tokens)
    common = {"model": model, "block_size": BLOCK_SIZE, "seed": seed, "max_num_seqs": MAX_NUM_SEQS, "device": device}
    common |= {"length_scale": length_scale, "output_cap": output_cap, "repeats": repeats}
    return [row | common for row in rows]


class SystemSet:
    """The four systems for one dtype, loaded once and resized for each budget; the stream they all serve."""

    def __init__(self, model, num_requests, seed, dtype, length_scale, output_cap, device):
        from pagedlab.bench import real_systems as systems
        from pagedlab.config import kv_bytes_per_token
        from pagedlab.model.loader import load_model_config
        from pagedlab.model.tokenizer import Tokenizer

        self.folder, model_config = load_model_config(model)
        self.model, self.dtype, self.device = model, dtype, device
        self.per_token = kv_bytes_per_token(model_config, dtype)
        self.stream = make_stream(Tokenizer.from_folder(self.folder), num_requests, seed, length_scale, output_cap)
        self.llms: dict[str, object] = {}
        self.hf_generate = systems.load_hf(self.folder, dtype, device)
        self.hf_batch = systems.hf_batch_model(self.folder, dtype, device)

    def jobs(self, budget: int) -> tuple[dict, dict]:
        """system -> a call that serves the stream once at `budget`; system -> the batch it may run (or None)."""
        from pagedlab.bench import real_systems as systems

        blocks = budget // (BLOCK_SIZE * self.per_token)
        jobs, batches = {}, {}
        longest = max(len(r.prompt_token_ids) + r.max_tokens for r in self.stream)
        for name in ENGINE_STAGES:
            if blocks * BLOCK_SIZE < longest:  # the pool could never hold the longest request (a ValueError)
                jobs[name] = functools.partial(failed_run, f"{blocks} blocks hold no {longest}-token request")
                continue
            llm = systems.engine_llm(self.model, name, self.dtype, blocks, self.device, **ENGINE_ARGS)
            self.llms[name] = llm
            serve_engine(llm, self.stream[:2], ignore_eos=True)  # torch's first calls
            jobs[name] = functools.partial(serve_engine, llm, self.stream, ignore_eos=True)
        batches[HF] = rows = hf_static_batch(self.stream, budget, self.per_token, MAX_NUM_SEQS)
        jobs[HF] = hf_generate_job(None, self.stream, rows, ignore_eos=True, hf_model=self.hf_generate)
        pages = systems.hf_batch_pages(budget, self.per_token)
        jobs[HF_BATCH] = systems.hf_batch_job(self.hf_batch, self.stream, pages, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS)
        return jobs, batches

    def measure(self, console, budget: int, rounds: int, tick) -> tuple[list[dict], dict]:
        from pagedlab.config import format_bytes

        jobs, batches = self.jobs(budget)
        say = f"{self.dtype}, KV budget {format_bytes(budget)}"

        def announce(name, i):
            console.print(f"[dim]real: {say}, round {i} of {rounds}, {name} …")
            tick(f"{say}, {name}")

        runs = round_robin(jobs, rounds, announce)
        rows = [run_row(name, runs[name], budget, self.dtype, batches.get(name)) for name in SYSTEMS]
        fastest = {name: best_run(name, rs) for name, rs in runs.items()}
        tokens = {(self.dtype, budget, name): r.token_ids for name, r in fastest.items() if r is not None}
        return rows, tokens

    def close(self) -> None:
        self.llms.clear()


def failed_run(why: str) -> Run:
    """A run that could not happen at this budget: its row says why instead of a speed."""
    return Run([], [], [], math.nan, math.nan, None, error=why)


ENGINE_ARGS = {"block_size": BLOCK_SIZE, "max_num_seqs": MAX_NUM_SEQS, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}
