"""Benchmarks: the systems of `pagedlab bench real`, each sized to one KV budget in bytes, serving the stream once
per call.

Builds on: bench/runs.py (a stream's request, a run, serving on an engine and with `generate`), llm.py,
Hugging Face transformers 5.x.
Read with: chapters/97-architecture.md (Benchmarks), chapters/07-real-model.md.

What each system makes of B bytes of KV (46,080 B a token for SmolLM2 in float32, half in bfloat16):

    pagedlab-continuous, pagedlab-static   a pool of B // (block_size x bytes a token) blocks: exactly the budget
                                           (stage 5 and stage 4, both with the tiled torch attention)
    hf-generate                            rows = B // (padded worst case x bytes a token), where the padded worst
                                           case is the stream's longest prompt plus its largest max_tokens: a row
                                           of `generate` holds a contiguous cache as long as its batch's longest
    hf-generate-batch                      transformers' paged cache of B // (page_size x bytes a token) pages

hf-generate serves the stream in batches of that many rows, in stream order, each left-padded to its longest
prompt and run until its longest max_tokens (EOS is ignored by every system here, so that all do the same work):

    batch  | . . P P P | o o o o o o |   P prompt, . padding (masked), o output,
           | P P P P P | o o o o x x |   x computed for a request whose max_tokens has come
           | . P P P P | o o x x x x |

The pad token is SmolLM2's EOS (<|im_end|>, id 2), which every ChatML prompt
also holds: without an explicit attention_mask, transformers would mask those
prompt tokens too and silently change the outputs.

hf-generate-batch is the ContinuousBatchingManager behind `model.generate_batch`,
fed request by request so that each keeps its own max_new_tokens (`generate_batch`
takes one for all), with max_num_seqs requests and MAX_NUM_BATCHED_TOKENS per
step, as pagedlab gets; its other settings are its defaults. It runs the model in
a thread of its own, so a forward pre-hook sets that thread's torch threads too
and counts its steps and the requests in each.
"""

from __future__ import annotations

import functools
import math
import time

from pagedlab.bench.runs import BenchRequest, Run, eos_ids, load_hf_model
from pagedlab.errors import InvariantError, check

ENGINE_STAGES = {"pagedlab-continuous": "continuous", "pagedlab-static": "prefix"}  # the engines, by system name
ROOFLINE_STEPS = 5  # decode steps of matmuls timed per round
HF_PAGE_SIZE = 16  # tokens a page of its cache holds: pagedlab's block, not its default 256, so no system wastes more


def engine_llm(model: str, system: str, dtype: str, num_kv_blocks: int, device: str = "cpu", **engine_args):
    """A pagedlab LLM for a timed run, with the tiled torch attention at either stage (as bench/common.py's
    timing_llm does for the bundled model): static and continuous differ in their scheduler only. It records
    its trace (the step profile and the running counts come from it)."""
    from pagedlab.llm import LLM

    stage = ENGINE_STAGES[system]
    return LLM(model, stage=stage, attention_backend="tiled", dtype=dtype, num_kv_blocks=num_kv_blocks,
               device=device, record_trace=True, **engine_args)  # fmt: skip


def hf_static_batch(stream: list[BenchRequest], budget: int, bytes_per_token: int, seats: int) -> int:
    """The rows of hf-generate: the largest batch whose padded worst case (the longest prompt plus the largest
    max_tokens, in every row) fits the budget, at most `seats` (as every system); 0 if not even one row fits."""
    worst = max(len(r.prompt_token_ids) for r in stream) + max(r.max_tokens for r in stream)
    return min(seats, budget // (worst * bytes_per_token))


def hf_batch_pages(budget: int, bytes_per_token: int, page_size: int = HF_PAGE_SIZE) -> int:
    """The pages of transformers' continuous-batching cache that the budget holds."""
    return budget // (page_size * bytes_per_token)


def load_hf(folder, dtype: str, device: str = "cpu"):
    """transformers' model for hf-generate, warmed up by its first job."""
    return load_hf_model(folder, dtype, device)


def hf_batch_model(folder, dtype: str, device: str = "cpu"):
    """transformers' model for hf-generate-batch, its own instance, with the pre-hook that keeps its generation
    thread on our torch threads and notes each step's requests (`model.cb_steps`)."""
    import torch

    hf_model = load_hf_model(folder, dtype, device)
    threads = torch.get_num_threads()
    hf_model.cb_steps = []  # per forward: (torch threads, requests in the step)

    def same_threads(module, args, kwargs):
        if torch.get_num_threads() != threads:  # a new thread starts from the process default, not ours
            torch.set_num_threads(threads)
        cu = kwargs.get("cu_seq_lens_q")
        hf_model.cb_steps.append((torch.get_num_threads(), None if cu is None else len(cu) - 1))

    hf_model.register_forward_pre_hook(same_threads, with_kwargs=True)
    return hf_model


def hf_batch_job(hf_model, stream: list[BenchRequest], pages: int, max_num_seqs: int, max_batch_tokens: int):
    """serve_hf_batch on the whole stream with a cache of `pages` pages, as a call of no arguments (warmed up)."""
    serve = functools.partial(
        serve_hf_batch, hf_model, pages=pages, max_num_seqs=max_num_seqs, max_batch_tokens=max_batch_tokens
    )
    serve(stream[:2])  # torch's first calls, and transformers' own warm-up
    return functools.partial(serve, stream)


def serve_hf_batch(hf_model, stream: list[BenchRequest], *, pages, max_num_seqs, max_batch_tokens) -> Run:
    """The stream through transformers' continuous batching, every request queued at once; a failure is the run's
    `error`, not an exception (the bench goes on without it)."""
    if pages < 1:
        return Run([], [], [], math.nan, math.nan, None, None, error="no page of its cache fits the budget")
    try:
        return _serve_hf_batch(hf_model, stream, pages, max_num_seqs, max_batch_tokens)
    except Exception as e:  # transformers' continuous batching on a CPU: report why, keep the other systems
        return Run([], [], [], math.nan, math.nan, None, None, error=f"{type(e).__name__}: {e}")


def _serve_hf_batch(hf_model, stream: list[BenchRequest], pages: int, max_num_seqs: int, max_batch_tokens: int):
    from transformers import ContinuousBatchingConfig, GenerationConfig

    eos = eos_ids(hf_model)
    cb = ContinuousBatchingConfig(max_batch_tokens=max_batch_tokens, max_requests_per_batch=max_num_seqs, seed=0)
    cb.page_size, cb.num_blocks = HF_PAGE_SIZE, pages
    gen = GenerationConfig(max_new_tokens=max(r.max_tokens for r in stream), do_sample=False, eos_token_id=-1)
    gen.pad_token_id = eos[0]  # EOS -1 (its "disabled"): every request runs to its max_tokens, as elsewhere
    seen = hf_model.cb_steps
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
    threads = max(t for t, _ in seen) if seen else None  # one forward pass per step: the hook saw every step
    running = [n for _, n in seen if n is not None] or None
    tokens = [list(o.generated_tokens) for o in outs]
    return Run(tokens, first, latency, wall_s, cpu_s, len(seen), threads, running=running)


def matmul_step_seconds(weights: list, batch: int, steps: int = ROOFLINE_STEPS) -> float:
    """The fastest of `steps` decode steps made of nothing but F.linear on every weight, at `batch` rows."""
    import torch
    import torch.nn.functional as F

    inputs = {w.shape[1]: torch.randn(batch, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}  # [B, in]
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            synchronize(weights[0].device)
            start = time.perf_counter()
            for w in weights:  # [out, in]: q, k, v, o, gate, up, down of each layer, then the LM head
                F.linear(inputs[w.shape[1]], w)
            synchronize(weights[0].device)
            times.append(time.perf_counter() - start)
    return min(times)


def synchronize(device) -> None:
    """Wait for a GPU's queued work (a CPU's is done when the call returns): a timer must not stop early."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def linear_weights(module) -> list:
    """Every nn.Linear weight of a model, in module order (a tied LM head counts: it is a matmul all the same)."""
    from torch import nn

    return [m.weight for m in module.modules() if isinstance(m, nn.Linear)]
