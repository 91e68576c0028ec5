"""Benchmarks: `pagedlab bench real`, a real chat model on a CPU, pagedlab against Hugging Face transformers.

Builds on: bench/real_systems.py (the five systems: pagedlab's stage 4 `prefix` and stage 5 `continuous`,
transformers', the roofline), bench/rounds.py (turns and spread), model/registry.py (the model's name).
Read with: chapters/97-architecture.md (Benchmarks), chapters/07-real-model.md.

SmolLM2-135M-Instruct (30 layers, 135M parameters, float32) serves one seeded
stream of chat requests: a question about a passage of the bundled corpus,
rendered by the model's ChatML template, each with its own max_tokens, all
queued at t=0, greedy, stopping at <|im_end|>. Five systems, one torch thread:

    pagedlab-continuous  stage 5: a seat freed by a finished request is refilled the next step
    pagedlab-static      stage 4: a batch of max_num_seqs runs until its longest request ends
    hf-generate          transformers' `generate` on left-padded batches of max_num_seqs, in stream order
    hf-generate-batch    transformers' own continuous batching (the manager behind `generate_batch`)
    matmul-roofline      one decode step's matmuls alone, at batch max_num_seqs: this CPU's limit

The roofline times, in the same run, the model's own weights in F.linear at batch
B = max_num_seqs: 7 projections x 30 layers and the LM head, nothing else.
B / that step time is the most tokens/s any system could decode at that batch
here; attention, norms, sampling and Python only add to a real step.

    seat  | A A A A A A . . |   static: A's seat idles until the batch's longest ends
    seat  | A A A A A A D D |   continuous: D takes A's seat the step after A ends

Every system must produce the same tokens as hf-generate (`same_tokens_as_hf`),
or the comparison would be of different work. The systems take turns,
REPEATS rounds (bench/rounds.py); each row reports its best run and the spread.
The systems: bench/real_systems.py; tables, targets and figure: bench/real_report.py.
"""

from __future__ import annotations

import functools
import random
import statistics

from pagedlab.bench.real_systems import ENGINE_STAGES, ROOFLINE_STEPS
from pagedlab.bench.rounds import round_robin, spread
from pagedlab.bench.runs import BenchRequest, Run, best_run, hf_generate_job, serve_engine

MODEL = "smollm2-135m-instruct"  # a registered name (model/registry.py): `pagedlab fetch smollm2` makes it
NUM_REQUESTS = 24  # three static batches of MAX_NUM_SEQS
MAX_NUM_SEQS = 8  # seats, and the batch of hf-generate and of the roofline
OUTPUT_LENS = (16, 64)  # max_tokens drawn uniformly in this range, both ends included
PASSAGE_LINES = (1, 8)  # lines of the corpus quoted in a question: prompts of about 45 to 140 tokens
MAX_NUM_BATCHED_TOKENS = 2048  # tokens per step at most, for pagedlab and hf-generate-batch alike
BLOCK_SIZE = 16
TORCH_THREADS = 1  # the machine's cores are shared with other work: one thread keeps timings comparable
REPEATS = 2  # rounds of one run per system; each system's best run is reported
TARGETS = {"hf-generate": 2.0, "hf-generate-batch": 3.0, "matmul-roofline": 0.5}  # continuous ÷ each, tokens/s
CONTINUOUS, STATIC, HF, HF_BATCH, ROOFLINE = (
    "pagedlab-continuous",
    "pagedlab-static",
    "hf-generate",
    "hf-generate-batch",
    "matmul-roofline",
)
SYSTEMS = (CONTINUOUS, STATIC, HF, HF_BATCH, ROOFLINE)
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


def make_stream(
    tokenizer, num_requests: int = NUM_REQUESTS, output_lens: tuple[int, int] = OUTPUT_LENS, seed: int = 0
) -> list[BenchRequest]:
    """Seeded questions about passages of 1-8 corpus lines, and max_tokens drawn in `output_lens`."""
    from pagedlab.model.loader import corpus_path

    lines = [line for line in corpus_path().read_text(encoding="utf-8")[:CORPUS_CHARS].splitlines() if line]
    rng, stream = random.Random(f"real-{seed}"), []
    for _ in range(num_requests):
        count = rng.randint(*PASSAGE_LINES)
        start = rng.randrange(len(lines) - count)
        question = f"{rng.choice(QUESTIONS)}\n\n" + "\n".join(lines[start : start + count])
        stream.append(BenchRequest(tuple(chat_prompt(tokenizer, question)), rng.randint(*output_lens)))
    return stream


def pool_blocks(stream: list[BenchRequest], max_num_seqs: int, block_size: int = BLOCK_SIZE) -> int:
    """max_num_seqs of the stream's longest request: memory never binds, so only the schedulers differ."""
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in stream)
    return max_num_seqs * -(-longest // block_size)


def run_row(system: str, runs: list[Run], batch: int) -> dict:
    """One flat row from a system's runs: its fastest run, and the spread of tokens/s over all of them."""
    best, good = best_run(system, runs), [r for r in runs if r.error is None]
    if best is None:
        return empty_row(system, batch) | {"error": runs[0].error, "runs": len(runs)}
    tokens = sum(len(t) for t in best.token_ids)
    row = empty_row(system, batch) | {"num_requests": len(best.token_ids), "threads": best.threads}
    row |= spread([tokens / r.wall_s for r in good], "tokens_per_s")
    row |= {"ttft_s": statistics.fmean(best.first_token_s), "latency_s": statistics.fmean(best.latency_s)}
    row |= {"num_generated_tokens": tokens, "wall_s": best.wall_s, "cpu_s": min(r.cpu_s for r in good)}
    row |= {"steps": best.steps, "forward_share": best.forward_share, "prefill_s": best.prefill_s, "runs": len(runs)}
    if best.steps:
        row |= {"step_ms": 1000 * best.wall_s / best.steps, "seat_use": tokens / (best.steps * batch)}
    if best.decode_step_s is not None:
        row["decode_step_ms"] = 1000 * best.decode_step_s
    return row


def roofline_row(step_seconds: list[float], batch: int, threads: int) -> dict:
    """The roofline's row: B tokens per fastest matmul step (the best round; median and worst beside it)."""
    row = empty_row(ROOFLINE, batch) | spread([batch / s for s in step_seconds], "tokens_per_s")
    fastest = 1000 * min(step_seconds)
    return row | {"threads": threads, "step_ms": fastest, "decode_step_ms": fastest, "runs": len(step_seconds)}


def empty_row(system: str, batch: int) -> dict:
    """Every field of every row, null where it does not apply (chapters/97-architecture.md, Benchmarks)."""
    keys = ("tokens_per_s", "ttft_s", "num_requests", "threads", "tokens_per_s_median", "tokens_per_s_worst")
    keys += ("latency_s", "num_generated_tokens", "wall_s", "cpu_s", "steps", "step_ms", "seat_use")
    keys += ("decode_step_ms", "prefill_s")
    keys += ("forward_share", "same_tokens_as_hf", "requests_differing_from_hf", "ratio_vs_hf_generate")
    keys += ("continuous_vs_this", "error", "runs")
    return {"system": system, **dict.fromkeys(keys), "batch": batch}


def add_comparisons(rows: list[dict], token_ids: dict[str, list[list[int]]]) -> None:
    """Each row against hf-generate's tokens and tokens/s, and pagedlab-continuous's tokens/s ÷ each row's."""
    by, ref = {r["system"]: r for r in rows}, token_ids.get(HF)
    for row in rows:
        name, tps = row["system"], row["tokens_per_s"]
        if ref is not None and name in token_ids:
            differing = sum(a != b for a, b in zip(token_ids[name], ref))
            row |= {"same_tokens_as_hf": differing == 0, "requests_differing_from_hf": differing}
        if tps and by.get(HF, {}).get("tokens_per_s"):
            row["ratio_vs_hf_generate"] = tps / by[HF]["tokens_per_s"]
        if tps and by.get(CONTINUOUS, {}).get("tokens_per_s"):
            row["continuous_vs_this"] = by[CONTINUOUS]["tokens_per_s"] / tps


def real_rows(
    console,
    model: str = MODEL,
    num_requests: int = NUM_REQUESTS,
    max_num_seqs: int = MAX_NUM_SEQS,
    output_lens: tuple[int, int] = OUTPUT_LENS,
    seed: int = 0,
    repeats: int = REPEATS,
    roofline_steps: int = ROOFLINE_STEPS,
) -> list[dict]:
    """Every system on one seeded stream, taking turns for `repeats` rounds (bench/rounds.py)."""
    import torch

    jobs, stream = system_jobs(model, num_requests, max_num_seqs, output_lens, seed, roofline_steps)
    announce = lambda name, i: console.print(f"[dim]real: round {i} of {repeats}, {name} …[/dim]")
    runs = round_robin(jobs, repeats, announce)
    rows = [run_row(name, runs[name], max_num_seqs) for name in SYSTEMS if name != ROOFLINE]
    rows.append(roofline_row(runs[ROOFLINE], max_num_seqs, torch.get_num_threads()))
    fastest = {name: min(rs, key=lambda r: r.wall_s) for name, rs in runs.items() if generated(rs)}
    add_comparisons(rows, {name: run.token_ids for name, run in fastest.items()})
    common = {"model": model, "max_num_seqs": max_num_seqs, "block_size": BLOCK_SIZE, "seed": seed}
    common |= {"prompt_tokens": sum(len(r.prompt_token_ids) for r in stream), "repeats": repeats}
    common |= {"max_tokens": sum(r.max_tokens for r in stream), "output_lens": list(output_lens)}
    return [row | common for row in rows]


def generated(runs: list) -> bool:
    """Whether all of a system's runs made tokens (the roofline's runs are step times; a failed run has an error)."""
    return all(isinstance(r, Run) and r.error is None for r in runs)


def system_jobs(model, num_requests, max_num_seqs, output_lens, seed, roofline_steps) -> tuple[dict, list]:
    """(system -> a call of no arguments that serves the stream once, the stream); every model loaded, warmed up."""
    from pagedlab.bench import real_systems as systems
    from pagedlab.model.loader import resolve_model_path
    from pagedlab.model.tokenizer import Tokenizer

    stream = make_stream(Tokenizer.from_folder(resolve_model_path(model)), num_requests, output_lens, seed)
    args = {"max_num_seqs": max_num_seqs, "block_size": BLOCK_SIZE, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS}
    args |= {"num_kv_blocks": pool_blocks(stream, max_num_seqs), "record_trace": True}  # the trace: step_profile
    jobs = {}
    for name in ENGINE_STAGES:
        llm = systems.engine_llm(model, name, **args)
        serve_engine(llm, stream[:2])  # torch's first calls
        jobs[name] = functools.partial(serve_engine, llm, stream)
    jobs[HF] = hf_generate_job(resolve_model_path(model), stream, max_num_seqs)
    jobs[HF_BATCH] = systems.hf_batch_job(model, stream, max_num_seqs, MAX_NUM_BATCHED_TOKENS)
    weights = systems.linear_weights(llm.loaded.model)  # the last engine's: the same model
    jobs[ROOFLINE] = functools.partial(systems.matmul_step_seconds, weights, max_num_seqs, roofline_steps)
    return jobs, stream
