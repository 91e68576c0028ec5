"""Benchmarks: `pagedlab bench throughput`, continuous vs static batching on the bundled model.

Builds on: llm.py (stage 4 `prefix`: static batching; stage 5 `continuous`), bench/workloads.py, bench/runs.py
(serving a stream; Hugging Face transformers when it is installed, the `hf-generate` baseline).
Read with: chapters/97-architecture.md (Benchmarks), chapters/05-continuous-batching.md.

One seeded ShareGPT-like stream, every request queued at t=0, greedy, output
lengths enforced with ignore_eos. Each system serves the whole stream:

    static                stage 4: admit a batch by its worst case, run it until its longest request ends
    continuous            stage 5: the batch is re-formed every step; a freed seat is refilled at once
    continuous-recompute  stage 5 on a quarter of the pool: it preempts, and recomputes its victims
    hf-generate           transformers' `generate` on left-padded batches of max_num_seqs, in stream order

    static      | A A A A A A A A |           B's and C's seats stay empty
                | B B B . . . . . |           until A, the batch's longest, ends
                | C C C C C . . . |
    continuous  | A A A A A A A A |
                | B B B D D D D D |           D takes B's seat the step after B ends
                | C C C C C E E E |

The systems take turns, REPEATS rounds of one run each (bench/rounds.py), and
each row reports its system's fastest run: tokens/s (output tokens ÷ wall time),
requests/s, normalized latency (mean over requests of (finished - arrival) ÷
output length), time to first token, preemptions, the steps taken, the share of
step time inside the model; then the spread over runs (`tokens_per_s_median`,
`_worst`) and the same per second of the process's CPU time (on a shared
machine, wall time also counts the other programs; CPU time does not).

Continuous batching takes fewer steps and, because it allocates KV blocks as
tokens arrive instead of reserving each request's final length, it runs more
requests at once in the same memory: the pool is sized as in the paper's
regime, where KV memory rather than max_num_seqs bounds the batch
(`POOL_FILL`). On a CPU a step's cost still grows with the tokens it computes,
so the gain is smaller than the `steps` ratio, which is what a step of fixed
cost (a GPU reading its weights) would gain. The `context_padding` field says
how much a decode attention padded to each batch's longest context would read
beyond what the decodes need; the torch reference does not pay it (it reads
each context in tiles of block_size, at most block_size - 1 slots past its
end), which is why it is reported rather than paid: it is what the tiles save.

Lengths are the paper's ShareGPT shape (max_model_len 2048) scaled by 1/4 so
that the bench runs in about two minutes on two CPU cores; torch runs on one thread.
Serving a stream: bench/runs.py. Tables and figure: bench/throughput_report.py; latency by priority class:
bench/priority.py.
"""

from __future__ import annotations

import functools
import random
import statistics
from dataclasses import dataclass, field

from pagedlab.bench.common import corpus_token_ids, progress, timing_llm
from pagedlab.bench.rounds import round_robin, spread
from pagedlab.bench.runs import BenchRequest, Run, best_run, hf_available, hf_generate_job, serve_engine
from pagedlab.bench.workloads import sample_requests
from pagedlab.errors import InvariantError

WORKLOAD = "sharegpt"
NUM_REQUESTS = 128  # long enough that the end of the stream (a few requests left running alone) weighs little
LENGTH_SCALE = 0.25  # prompt and output lengths x 1/4: prompt mean ~40, output mean ~100 tokens
PAPER_MAX_MODEL_LEN = 2048  # lengths are drawn clipped as the paper's, then scaled
MAX_NUM_SEQS = 32
BLOCK_SIZE = 16  # vLLM's default
SMALL_POOL_SHARE = 1 / 4  # the preempting systems' share of the pool (a third never ran dry on the default stream)
TORCH_THREADS = 1  # the machine's cores are shared with other work: one thread keeps timings comparable
CORPUS_CHARS = 200_000  # prompts are cut from the corpus's first characters
TARGET_SPEEDUP = 2.0  # what continuous batching should gain over static here (tokens/s)
REPEATS = 2  # rounds of one run per system (bench/rounds.py); each system's best run is reported
PAPER = (
    "paper (Kwon et al. 2023, A100 GPUs): vLLM improves throughput 2-4x over FasterTransformer and Orca "
    "at the same latency; those baselines differ from ours (static batching in the same engine)"
)


@dataclass(frozen=True)
class EngineSystem:
    """A pagedlab engine configuration that serves the stream: one row of the bench."""

    name: str  # the row's `system`
    stage: str  # LLM(stage=...)
    pool_share: float = 1.0  # share of the bench's num_kv_blocks it gets (< 1: small enough to preempt)
    engine_args: dict = field(default_factory=dict)  # further EngineConfig overrides, e.g. preemption_mode


# static and continuous share one pool; the two preempting systems get a quarter of it (swap: a CPU
# swap pool as large as that quarter, the config's default).
ENGINE_SYSTEMS = (
    EngineSystem("static", "prefix"),
    EngineSystem("continuous", "continuous"),
    EngineSystem("continuous-recompute", "continuous", SMALL_POOL_SHARE, {"preemption_mode": "recompute"}),
    EngineSystem("continuous-swap", "continuous", SMALL_POOL_SHARE, {"preemption_mode": "swap"}),  # CPU pool = GPU pool
)
HF_SYSTEM = "hf-generate"


def make_stream(tokenizer, num_requests: int = NUM_REQUESTS, length_scale: float = LENGTH_SCALE, seed: int = 0):
    """Seeded ShareGPT-like lengths, scaled by `length_scale`, with prompts cut from the corpus after a <bos>."""
    specs = sample_requests(WORKLOAD, num_requests, seed=seed, max_model_len=PAPER_MAX_MODEL_LEN)
    corpus = corpus_token_ids(tokenizer, CORPUS_CHARS)  # <bos> first
    rng, stream = random.Random(f"throughput-{seed}"), []
    for spec in specs:
        prompt_len, output_len = (max(1, round(n * length_scale)) for n in (spec.prompt_len, spec.output_len))
        start = rng.randrange(1, len(corpus) - prompt_len)
        stream.append(BenchRequest((corpus[0], *corpus[start : start + prompt_len - 1]), output_len))
    return stream


POOL_FILL = 0.5  # the KV pool holds this share of what max_num_seqs average requests finally need


def pool_blocks(stream: list[BenchRequest], max_num_seqs: int, block_size: int, fill: float = POOL_FILL) -> int:
    """The paper's regime: KV memory, not max_num_seqs, bounds the batch.

    Static admission must reserve each request's final length up front, so it admits about
    max_num_seqs x fill requests; continuous batching allocates as tokens arrive and runs more at once,
    preempting when the pool runs dry. The pool always holds at least the longest request.
    """
    mean = sum(-(-(len(r.prompt_token_ids) + r.max_tokens) // block_size) for r in stream) / len(stream)
    return max(_blocks_of_longest(stream, block_size), int(max_num_seqs * mean * fill))


def _blocks_of_longest(stream: list[BenchRequest], block_size: int) -> int:
    return -(-max(len(r.prompt_token_ids) + r.max_tokens for r in stream) // block_size)


def serve_fresh(system: EngineSystem, stream: list[BenchRequest], num_kv_blocks: int, **engine_args) -> Run:
    """The stream on a fresh engine of `system` (an empty prefix cache), every request queued at once."""
    args = {"num_kv_blocks": num_kv_blocks, "record_trace": True, **engine_args, **system.engine_args}
    return serve_engine(timing_llm(system.stage, **args), stream, ignore_eos=True)


def needed_context(stream: list[BenchRequest]) -> int:
    """Context slots the stream's decodes need: feeding back output token j (1 .. o - 1) of a p-token prompt
    reads p + j slots (the first output token comes with the prefill)."""
    return sum((r.max_tokens - 1) * len(r.prompt_token_ids) + (r.max_tokens - 1) * r.max_tokens // 2 for r in stream)


def throughput_row(system: str, stream: list[BenchRequest], runs: list[Run], **extras) -> dict:
    """One flat row of the bench's JSON from a system's runs (the row fields of chapters/97-architecture.md first,
    then extras): times from its fastest run, CPU time from its least, tokens/s best, median and worst."""
    served, out_lens = best_run(system, runs), [r.max_tokens for r in stream]
    got = [len(t) for t in served.token_ids]
    if got != out_lens:
        raise InvariantError(f"{system}: output lengths {got} differ from the stream's {out_lens}")
    output_tokens = sum(out_lens)
    row = {"system": system, "workload": WORKLOAD, "num_requests": len(stream), "num_kv_blocks": served.num_kv_blocks}
    row |= {"tokens_per_s": output_tokens / served.wall_s, "requests_per_s": len(stream) / served.wall_s}
    row["normalized_latency_s"] = statistics.fmean(lat / n for lat, n in zip(served.latency_s, out_lens))
    row |= {"ttft_s": statistics.fmean(served.first_token_s), "preemptions": served.preemptions}
    row |= {"total_s": served.wall_s, "latency_s": statistics.fmean(served.latency_s), "steps": served.steps}
    row |= {"output_tokens": output_tokens, "prompt_tokens": sum(len(r.prompt_token_ids) for r in stream)}
    row |= {"tokens_per_step": output_tokens / served.steps, "forward_share": served.forward_share}
    row |= spread([output_tokens / run.wall_s for run in runs], "tokens_per_s")
    row |= spread([output_tokens / run.cpu_s for run in runs], "tokens_per_cpu_s")
    row |= {"cpu_s": min(run.cpu_s for run in runs), "runs": len(runs)}
    needed = needed_context(stream)
    row["context_padding"] = served.decode_context / needed if needed else None
    return row | extras


def add_comparisons(rows: list[dict], served: dict[str, Run]) -> None:
    """Each row's tokens/s ÷ static's and ÷ hf-generate's, and how many of its requests match static's tokens."""
    by = {r["system"]: r for r in rows}
    for row in rows:
        for key, base in (("speedup_vs_static", "static"), ("speedup_vs_hf", HF_SYSTEM)):
            row[key] = row["tokens_per_s"] / by[base]["tokens_per_s"] if base in by else None
        ref = served.get("static")
        same = None if ref is None else [a == b for a, b in zip(served[row["system"]].token_ids, ref.token_ids)]
        row["same_tokens_as_static"] = None if same is None else sum(same) / len(same)


def throughput_rows(
    console,
    num_requests: int = NUM_REQUESTS,
    length_scale: float = LENGTH_SCALE,
    max_num_seqs: int = MAX_NUM_SEQS,
    block_size: int = BLOCK_SIZE,
    seed: int = 0,
    systems: tuple[str, ...] | None = None,
    repeats: int = REPEATS,
) -> list[dict]:
    """Every system (all of ENGINE_SYSTEMS, and hf-generate when transformers is installed) on one seeded stream.

    The systems take turns, `repeats` rounds of one run each (bench/rounds.py), every run on a fresh engine.
    """
    jobs, extras, stream, config = system_jobs(num_requests, length_scale, max_num_seqs, block_size, seed, systems)
    with progress(console, repeats * len(jobs), "throughput") as tick:

        def announce(name, i):
            console.print(f"[dim]throughput: round {i} of {repeats}, {name} …[/dim]")
            tick(f"round {i}, {name}")

        runs = round_robin(jobs, repeats, announce)
    rows = [throughput_row(name, stream, system_runs, **extras[name]) for name, system_runs in runs.items()]
    add_comparisons(rows, {name: best_run(name, system_runs) for name, system_runs in runs.items()})
    common = {**config, "length_scale": length_scale, "torch_threads": TORCH_THREADS, "seed": seed, "repeats": repeats}
    return [row | common for row in rows]


def system_jobs(
    num_requests: int, length_scale: float, max_num_seqs: int, block_size: int, seed: int, systems: tuple | None
) -> tuple[dict, dict, list[BenchRequest], dict]:
    """(name -> a call that serves the whole stream once, name -> the row's extra fields, the stream, the config),
    the systems in ENGINE_SYSTEMS order, then hf-generate; torch warmed up."""
    from pagedlab.llm import LLM
    from pagedlab.model.loader import bundled_model_path
    from pagedlab.stages import parse_stage

    wanted = systems or (*(s.name for s in ENGINE_SYSTEMS), HF_SYSTEM)
    warm_up = LLM(stage="continuous", max_num_seqs=max_num_seqs, block_size=block_size)
    stream = make_stream(warm_up.get_tokenizer(), num_requests, length_scale, seed)
    warm_up.generate([list(r.prompt_token_ids) for r in stream[:2]], use_tqdm=False)  # torch's first calls
    blocks, longest = pool_blocks(stream, max_num_seqs, block_size), _blocks_of_longest(stream, block_size)
    config = {"max_num_seqs": max_num_seqs, "block_size": block_size}
    jobs, extras = {}, {}
    for system in (s for s in ENGINE_SYSTEMS if s.name in wanted):
        pool = max(longest, int(blocks * system.pool_share))
        jobs[system.name] = functools.partial(serve_fresh, system, stream, pool, **config)
        mode = system.engine_args.get("preemption_mode")
        extras[system.name] = {"stage": parse_stage(system.stage), "preemption_mode": mode}
    if HF_SYSTEM in wanted and hf_available():
        jobs[HF_SYSTEM] = hf_generate_job(bundled_model_path(), stream, max_num_seqs, ignore_eos=True)
        extras[HF_SYSTEM] = {"stage": None, "preemption_mode": None}
    return jobs, extras, stream, config
