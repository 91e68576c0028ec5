"""Benchmarks: what the timed benches share: a stream's request, one system's run of it, serving it on a pagedlab
engine or with Hugging Face's `generate` on static padded batches, and the pick of a system's best run.

Builds on: llm.py (generate, the engine's stats and trace), Hugging Face transformers (optional: the baselines
run only when it is installed).
Read with: chapters/97-architecture.md (Benchmarks).

`pagedlab bench throughput` (the bundled model, EOS ignored so that every system makes the stream's lengths)
and `pagedlab bench real` (SmolLM2, each request stopping at its EOS) serve a stream the same way:

    serve_engine(llm, stream)           every request queued at once; times since the queueing
    serve_hf_generate(model, stream)    batches of B in stream order, each left-padded to its longest prompt
                                        and run until its longest output ends:
        | . . P P P | o o o o o o |      P prompt, . left padding,
        | P P P P P | o o o x x x |      o a request's own output tokens,
        | . P P P P | o o o o x x |      x generated only because the batch runs on

Both return a Run; `best_run` takes the fastest of a system's runs, once they agree token for token.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from dataclasses import dataclass

from pagedlab.errors import InvariantError, check


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request of a bench's stream, with concrete prompt tokens."""

    prompt_token_ids: tuple[int, ...]  # the prompt as the model sees it (<bos>, or a chat template's rendering)
    max_tokens: int  # output tokens at most (the exact number where the bench ignores EOS), >= 1


@dataclass(frozen=True, slots=True)
class Run:
    """One system serving the whole stream once; times in seconds since the stream was queued."""

    token_ids: list[list[int]]  # each request's output tokens (EOS included when it came), in stream order
    first_token_s: list[float]  # per request: first token time - queue time
    latency_s: list[float]  # per request: last token time - queue time
    wall_s: float  # from queueing the stream to its last token
    cpu_s: float  # CPU time of this process meanwhile (all its threads)
    steps: int | None  # forward passes that produced tokens (None: the system does not say)
    threads: int | None = None  # torch threads of the thread that ran the model
    preemptions: int | None = None  # requests preempted (None: the system has no such notion)
    forward_share: float | None = None  # pagedlab: share of step time inside forward + sampling
    num_kv_blocks: int | None = None  # the KV pool it ran with (None: the system's own cache)
    decode_context: int | None = None  # context slots a decode attention padded to each step's longest would read
    decode_step_s: float | None = None  # median time of a step that decoded a full batch and prefilled nothing
    prefill_s: float | None = None  # time in steps that fed prompt tokens (hf-generate: each batch's first step)
    running: list[int] | None = None  # requests each step computed (hf-generate: its batch's rows, ended or not)
    error: str | None = None  # why the run failed (then the lists are empty)


def best_run(system: str, runs: list[Run]) -> Run | None:
    """The fastest of a system's runs that did not fail (None if all did). Identical runs must have made identical
    tokens in as many steps: a difference is a bug, never noise."""
    good = [r for r in runs if r.error is None]
    if any(r.token_ids != good[0].token_ids or r.steps != good[0].steps for r in good):
        raise InvariantError(f"{system}: tokens or steps changed between identical runs")
    return min(good, key=lambda r: r.wall_s) if good else None


# --- pagedlab ---------------------------------------------------------------------------------------------------


def serve_engine(llm, stream: list[BenchRequest], ignore_eos: bool = False) -> Run:
    """The whole stream on a pagedlab engine with an empty prefix cache (fresh, or reset), every request queued
    at once, greedy. The engine must record its trace (the step profile and the padded context come from it)."""
    import torch

    from pagedlab.sampling_params import SamplingParams

    if not llm.reset_prefix_cache():
        raise InvariantError("an engine between runs still holds blocks")
    params = [SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=ignore_eos) for r in stream]
    stats = llm.engine.stats
    before = (stats.num_steps, stats.step_seconds, stats.forward_seconds, stats.num_preemptions)
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate([{"prompt_token_ids": list(r.prompt_token_ids)} for r in stream], params, use_tqdm=False)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    after = (stats.num_steps, stats.step_seconds, stats.forward_seconds, stats.num_preemptions)
    steps, step_s, forward_s, preemptions = (now - then for now, then in zip(after, before))
    metrics = [o.metrics for o in outputs]
    trace = list(llm.engine.trace)[-steps:]
    decode_step_s, prefill_s = step_profile(trace, min(m["arrival_time"] for m in metrics), llm.engine.config)
    return Run(
        [list(o.outputs[0].token_ids) for o in outputs],
        [m["first_token_time"] - m["arrival_time"] for m in metrics],
        [m["finished_time"] - m["arrival_time"] for m in metrics],
        wall_s, cpu_s, steps, torch.get_num_threads(), preemptions, forward_s / step_s,
        llm.engine.config.num_kv_blocks, padded_decode_context(trace), decode_step_s, prefill_s,
        [len(step.scheduled) for step in trace],
    )  # fmt: skip


def step_profile(trace: list, queued_at: float, config) -> tuple[float | None, float]:
    """(the median time of a step that decoded max_num_seqs requests and prefilled none, the time of the steps
    that fed prompt tokens), from a run's trace: a step lasts from the end of the one before (the first: from
    the queueing)."""
    ends = [step.time for step in trace]
    durations = [end - start for start, end in zip([queued_at, *ends], ends)]
    full = [d for step, d in zip(trace, durations) if not step.prefills and len(step.scheduled) == config.max_num_seqs]
    prefill_s = sum(d for step, d in zip(trace, durations) if step.prefills)
    return (statistics.median(full) if full else None), prefill_s


def padded_decode_context(trace) -> int:
    """Context slots a decode attention that padded every row of a step to its longest context would read."""
    total = 0
    for step in trace:
        num_decodes = sum(1 for n in step.scheduled.values() if n == 1)
        total += num_decodes * max(step.kv_used[r] for r in step.scheduled)
    return total


# --- Hugging Face generate ----------------------------------------------------------------------------------------


def hf_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def load_hf_model(folder, dtype: str = "float32", device: str = "cpu"):
    """A model folder as transformers' AutoModelForCausalLM in `dtype` on `device`, eval, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # its "Loading weights" bar would interleave with the bench's own lines
    try:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    finally:
        logging.enable_progress_bar()


def eos_ids(hf_model) -> list[int]:
    eos = hf_model.generation_config.eos_token_id
    eos = hf_model.config.eos_token_id if eos is None else eos
    return [eos] if isinstance(eos, int) else list(eos)


def hf_generate_job(folder, stream: list[BenchRequest], batch_size: int, ignore_eos: bool = False, hf_model=None):
    """serve_hf_generate on the whole stream as a call of no arguments (the model loaded from `folder` unless
    given, warmed up). A batch of 0 rows cannot run: every call returns a Run that says so."""
    if batch_size < 1:
        return functools.partial(Run, [], [], [], math.nan, math.nan, None, error="no batch fits: 0 rows")
    hf_model = hf_model if hf_model is not None else load_hf_model(folder)
    serve_hf_generate(hf_model, stream[:2], min(2, batch_size), ignore_eos)  # torch's first calls
    return functools.partial(serve_hf_generate, hf_model, stream, batch_size, ignore_eos)


def serve_hf_generate(hf_model, stream: list[BenchRequest], batch_size: int, ignore_eos: bool = False) -> Run:
    """Static padded batches of `batch_size` in stream order; a request's first token and its last are the ends of
    its batch's first generate step and of the step that produced its last own token. Its own KV cache is
    contiguous per row, so its decode reads every row's padded context (`decode_context` counts those slots)."""
    import torch

    eos = eos_ids(hf_model)
    start, cpu_start = time.perf_counter(), time.process_time()
    tokens, first, latency, steps, prefill_s, decode_s, context, running = [], [], [], 0, 0.0, [], 0, []
    for i in range(0, len(stream), batch_size):
        batch, batch_start = stream[i : i + batch_size], time.perf_counter()
        prompts, longest = [r.prompt_token_ids for r in batch], max(r.max_tokens for r in batch)
        rows, step_times = generate_padded(hf_model, prompts, longest, None if ignore_eos else eos, eos[0])
        width, n = max(len(p) for p in prompts), len(step_times)
        context += len(batch) * ((n - 1) * width + (n - 1) * n // 2)  # every row, padded, until the longest ends
        for row, r in zip(rows.tolist(), batch):
            tokens.append(own_output(row, r.max_tokens, [] if ignore_eos else eos))
            first.append(step_times[0] - start)
            latency.append(step_times[len(tokens[-1]) - 1] - start)
        steps += n
        running += [len(batch)] * n  # every row is computed at every step of its batch, ended or not
        prefill_s += step_times[0] - batch_start  # the prompts, and every row's first token
        if len(batch) == batch_size:  # a full batch: every row is computed at every step, ended or not
            decode_s += [end - begin for begin, end in zip(step_times, step_times[1:])]
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    decode_step_s = statistics.median(decode_s) if decode_s else None
    return Run(tokens, first, latency, wall_s, cpu_s, steps, torch.get_num_threads(), decode_context=context,
               decode_step_s=decode_step_s, prefill_s=prefill_s, running=running)  # fmt: skip


def own_output(row: list[int], max_tokens: int, eos: list[int]) -> list[int]:
    """A padded row's own tokens: up to its max_tokens, and up to and including its first EOS (if any counts)."""
    row = row[:max_tokens]
    ends = [i for i, t in enumerate(row) if t in eos]
    return row[: ends[0] + 1] if ends else row


def generate_padded(model, prompts: list[list[int]], max_new_tokens: int, eos_token_id=None, pad_token_id: int = 0):
    """Greedy `generate` on one left-padded batch: (new token ids [B, N], the end time of each of the N steps).

    eos_token_id None runs every row the full length; a pad under mask 0 is never read, whatever its id.
    """
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):
        """Never stops generation (EOS or the length does); notes when each step ends."""

        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    width = max(len(p) for p in prompts)
    pad = [width - len(p) for p in prompts]
    ids = torch.tensor([[pad_token_id] * n + list(p) for n, p in zip(pad, prompts)], device=model.device)  # [B, P]
    mask = torch.tensor([[0] * n + [1] * (width - n) for n in pad], device=model.device)  # [B, P]: 0 = padding
    clock = StepClock()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=eos_token_id, pad_token_id=pad_token_id, stopping_criteria=StoppingCriteriaList([clock]),
        )  # fmt: skip
    check(out.shape[1] == width + len(clock.times), "generate: a step without its clock")
    check(eos_token_id is not None or len(clock.times) == max_new_tokens, "generate stopped early")
    return out[:, width:], clock.times
