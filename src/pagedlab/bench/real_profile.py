"""Benchmarks: the step profile of `pagedlab bench real`: one decode step at batch B beside its parts alone.

Builds on: bench/real_systems.py (the engine, the matmul-only step), bench/runs.py (a stream's request).
Read with: chapters/07-real-model.md (Measurements: where a decode step goes).

A decode step at batch B reads every weight once, whatever B (the matmuls: B token
vectors through 7 projections in each of 30 layers and the LM head), and every
running request's K and V once (the attention), and does a little more besides
(norms, RoPE, sampling, the runner's Python). On a CPU both reads come from memory:

    decode step  =  matmuls (weights_mb, once a step)  +  attention (kv_read_mb, grows with B x context)  +  the rest

so the step can approach its matmuls only while the KV it reads is small against the
weights. Each row, for one B, on the bench's own chat prompts:

    decode_step_ms     the fastest of `steps` engine steps that decode B requests (and prefill nothing)
    matmul_step_ms     the fastest of `steps` steps of the model's matmuls alone (F.linear on its weights, batch B)
    attention_step_ms  the fastest of `steps` runs of the attention alone, every layer, over the same contexts
    step_vs_matmul     decode_step_ms ÷ matmul_step_ms
"""

from __future__ import annotations

import statistics
import time

from pagedlab.bench.runs import BenchRequest

WARM_STEPS = 2  # decode steps run before the timed ones (torch's first calls at this shape)


def step_profile_rows(console, model, dtype, stream: list[BenchRequest], batches, steps, tick=None, device="cpu",
                      *, system: str, block_size: int) -> list[dict]:  # fmt: skip
    """A row per batch size: the decode step of `system`'s engine, its matmuls and its attention, each timed alone
    (bench/real.py adds the row's other fields)."""
    rows = []
    for batch in batches:
        console.print(f"[dim]real: {dtype}, step profile at batch {batch} …")
        if tick is not None:
            tick(f"{dtype}, step profile at batch {batch}")
        profile = profile_decode(model, system, dtype, stream, batch, steps, device, block_size)
        row = {"dtype": dtype, "batch": batch, "runs": steps} | profile
        rows.append(row | {"step_vs_matmul": row["decode_step_ms"] / row["matmul_step_ms"]})
    return rows


def profile_decode(
    model: str,
    system: str,
    dtype: str,
    stream: list[BenchRequest],
    batch: int,
    steps: int,
    device: str,
    block_size: int,
) -> dict:
    """Serve `batch` of the stream's prompts (cycled) until all decode, then time decode steps and their parts."""
    from pagedlab.bench.real_systems import engine_llm, linear_weights, matmul_step_seconds
    from pagedlab.config import kv_bytes_per_token
    from pagedlab.sampling_params import SamplingParams

    prompts = [stream[i % len(stream)].prompt_token_ids for i in range(batch)]
    longest = max(map(len, prompts)) + WARM_STEPS + steps + 2
    llm = engine_llm(model, system, dtype, batch * -(-longest // block_size), device, max_num_seqs=batch,
                     block_size=block_size, max_num_batched_tokens=sum(map(len, prompts)))  # fmt: skip
    engine = llm.engine
    params = SamplingParams(max_tokens=WARM_STEPS + steps + 3, temperature=0.0, ignore_eos=True)  # + the attention's
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": list(prompt)}, params)
    engine.step()  # every prompt in one step
    for _ in range(WARM_STEPS):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    decodes = [s for s in list(engine.trace)[-steps:] if not s.prefills and len(s.scheduled) == batch]
    per_token = kv_bytes_per_token(llm.loaded.config, dtype)
    context = statistics.fmean(sum(s.kv_used.values()) / batch for s in decodes)
    weights = linear_weights(llm.loaded.model)
    return {
        "decode_step_ms": 1000 * min(times),  # the fastest, as its parts: a busy machine only adds time
        "matmul_step_ms": 1000 * matmul_step_seconds(weights, batch, steps),
        "attention_step_ms": 1000 * attention_seconds(llm, prompts, steps),
        "context_mean": context,
        "kv_read_mb": batch * context * per_token / 1e6,
        "weights_mb": sum(w.numel() * w.element_size() for w in weights) / 1e6,
    }


def attention_seconds(llm, prompts, steps: int) -> float:
    """The fastest of `steps` runs of the engine's attention alone, every layer, over one more decode step's
    metadata (captured from the runner as it prepares that step; its K/V writes land in the same slots)."""
    import torch

    from pagedlab.bench.real_systems import synchronize

    runner = llm.engine.runner
    attention, captured = runner.attention, []
    prepare = attention.prepare
    attention.prepare = lambda meta: (captured.append(meta), prepare(meta))[-1]
    try:
        llm.engine.step()
    finally:
        del attention.prepare  # the class's own again
    meta, cfg = captured[-1], llm.loaded.config
    n, dtype = len(meta.seq_lens_cpu), attention.kv_cache.dtype
    device = attention.kv_cache.device
    q = torch.randn(n, cfg.num_attention_heads, cfg.head_dim, dtype=dtype, device=device)
    k = torch.randn(n, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype, device=device)
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            synchronize(device)
            start = time.perf_counter()
            attention.prepare(meta)
            for layer in range(cfg.num_hidden_layers):
                attention.forward(layer, q, k, k, meta)
            synchronize(device)
            times.append(time.perf_counter() - start)
    return min(times)
