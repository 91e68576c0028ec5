"""Benchmarks: the systems of `pagedlab bench real`, each serving the whole stream once per call.

Builds on: bench/runs.py (a stream's request, a run, serving on an engine and with `generate`), llm.py,
Hugging Face transformers 5.x.
Read with: chapters/97-architecture.md (Benchmarks), chapters/07-real-model.md.

pagedlab-continuous and pagedlab-static are one engine each, kept across runs
(its prefix cache emptied before each), both with the tiled torch attention.

hf-generate serves the stream in batches of max_num_seqs, in stream order,
each left-padded to its longest prompt and run until every row has met EOS or
the batch's largest max_tokens; a row's own output is cut at its max_tokens
and its first EOS:

    batch  | . . P P P | o o o o E x |   P prompt, . padding (masked), o output,
           | P P P P P | o o o o o o |   E its EOS, x computed for a request
           | . P P P P | o o x x x x |   that has ended: its max_tokens (2) came first

The pad token is SmolLM2's EOS (<|im_end|>, id 2), which every ChatML prompt
also holds: without an explicit attention_mask, transformers would mask those
prompt tokens too and silently change the outputs.

hf-generate-batch is the ContinuousBatchingManager behind `model.generate_batch`,
fed request by request so that each keeps its own max_new_tokens (`generate_batch`
takes one for all): its KV cache sized for the workload (else it claims a share
of the machine's memory), max_num_seqs requests and MAX_NUM_BATCHED_TOKENS per
step, as pagedlab gets; its other settings are its defaults. It runs the model in
a thread of its own, so a forward pre-hook sets that thread's torch threads too
(and counts its steps: one forward pass each).

matmul-roofline calls F.linear on the engine's own weights at batch max_num_seqs.
"""

from __future__ import annotations

import functools
import math
import time

from pagedlab.bench.runs import BenchRequest, Run, eos_ids, load_hf_model
from pagedlab.errors import InvariantError, check
from pagedlab.model.loader import resolve_model_path

ENGINE_STAGES = {"pagedlab-continuous": "continuous", "pagedlab-static": "prefix"}  # the engines, by system name
ROOFLINE_STEPS = 5  # decode steps of matmuls timed per round


def engine_llm(model: str, system: str, **engine_args):
    """A pagedlab LLM for a timed run, with the tiled torch attention at either stage (as bench/common.py's
    timing_llm does for the bundled model): static and continuous differ in their scheduler only."""
    from pagedlab.llm import LLM

    return LLM(model, stage=ENGINE_STAGES[system], attention_backend="tiled", **engine_args)


def hf_batch_job(model: str, stream: list[BenchRequest], max_num_seqs: int, max_batch_tokens: int):
    """serve_hf_batch on the whole stream as a call of no arguments (its own model instance, warmed up)."""
    import torch

    hf_model = load_hf_model(resolve_model_path(model))
    threads = torch.get_num_threads()
    seen: list[int] = []  # torch threads each forward of the generation thread ran with

    def same_threads(module, args):
        if torch.get_num_threads() != threads:  # a new thread starts from the process default, not ours
            torch.set_num_threads(threads)
        seen.append(torch.get_num_threads())

    hf_model.register_forward_pre_hook(same_threads)
    serve = functools.partial(serve_hf_batch, hf_model, max_num_seqs=max_num_seqs, max_batch_tokens=max_batch_tokens)
    serve(stream[:2], seen=seen)  # torch's first calls, and transformers' own warm-up
    return functools.partial(serve, stream, seen=seen)


def serve_hf_batch(hf_model, stream: list[BenchRequest], *, max_num_seqs, max_batch_tokens, seen) -> Run:
    """The stream through transformers' continuous batching, every request queued at once; a failure is the run's
    `error`, not an exception (the bench goes on without it)."""
    try:
        return _serve_hf_batch(hf_model, stream, max_num_seqs, max_batch_tokens, seen)
    except Exception as e:  # transformers' continuous batching on a CPU: report why, keep the other systems
        return Run([], [], [], math.nan, math.nan, None, None, error=f"{type(e).__name__}: {e}")


def _serve_hf_batch(hf_model, stream: list[BenchRequest], max_num_seqs: int, max_batch_tokens: int, seen) -> Run:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    eos = eos_ids(hf_model)
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in stream)
    cb = ContinuousBatchingConfig(max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_num_seqs, seed=0)
    cb.num_blocks = max_num_seqs * (-(-longest // cb.page_size) + 1)  # every seat its longest, and a page spare
    gen = GenerationConfig(max_new_tokens=max(r.max_tokens for r in stream), do_sample=False, eos_token_id=eos)
    gen.pad_token_id = eos[0]
    with hf_model.continuous_batching_context_manager(generation_config=gen, continuous_batching_config=cb) as cbm:
        seen.clear()
        start, cpu_start = time.perf_counter(), time.process_time()
        ids = [
            cbm.add_request(list(r.prompt_token_ids), max_new_tokens=r.max_tokens, record_timestamps=True)
            for r in stream
        ]
        done = {}
        while len(done) < len(ids):
            out = cbm.get_result(timeout=1)
            if out is not None and out.is_finished():
                done[out.request_id] = out
            check(out is not None or cbm.is_running(), "generate_batch: its generation thread stopped")
        wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    outs = [done[i] for i in ids]
    failed = [o.error for o in outs if o.error is not None]
    if failed:
        raise InvariantError(f"generate_batch: {len(failed)} requests failed, e.g. {failed[:1]}")
    first = [o.timestamps[0] - start for o in outs]
    latency = [o.timestamps[-1] - start for o in outs]
    threads = max(seen) if seen else None  # one forward pass per step: the hook saw every step
    return Run([list(o.generated_tokens) for o in outs], first, latency, wall_s, cpu_s, len(seen), threads)


def matmul_step_seconds(weights: list, batch: int, steps: int = ROOFLINE_STEPS) -> float:
    """The fastest of `steps` decode steps made of nothing but F.linear on every weight, at `batch` rows."""
    import torch
    import torch.nn.functional as F

    inputs = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=w.dtype) for w in weights}  # [B, in] per width
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            start = time.perf_counter()
            for w in weights:  # [out, in]: q, k, v, o, gate, up, down of each layer, then the LM head
                F.linear(inputs[w.shape[1]], w)
            times.append(time.perf_counter() - start)
    return min(times)


def linear_weights(module) -> list:
    """Every nn.Linear weight of a model, in module order (a tied LM head counts: it is a matmul all the same)."""
    from torch import nn

    return [m.weight for m in module.modules() if isinstance(m, nn.Linear)]
