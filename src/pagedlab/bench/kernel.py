"""Benchmarks: `pagedlab bench kernel`, the stage-6 Triton kernels against the torch reference.

Builds on: lessons/kernel_cases.py (the paged cases and each impl as a call over one), attention/triton/decode.py,
attention/triton/prefill.py, attention/tiled.py (the torch path).
Read with: chapters/97-architecture.md (Benchmarks), chapters/06-triton-kernel.md.

One decode step of B requests, each with a context of L tokens in a paged cache with shuffled block tables:

    impl            what runs
    torch           TiledPagedAttention.forward (stage 5, the fallback): gather every decode's tiles, batched softmax
    triton-v1       paged_decode(version="v1"): one program per (request, head) walks its block table
    triton-v2       paged_decode(version="v2"): one program per (request, head, partition), then a reduce
    sdpa            torch's scaled_dot_product_attention over contiguous K/V: no paging at all
    triton-prefill  paged_prefill: a chunk of new queries at the end of each context (compute-bound)

A decode step must read every key and value of the context once, so its useful traffic is
bytes = 2 * B * L * KVH * D * element size (q and out add 2 * B * H * D * element size). Achieved GB/s =
bytes / latency, and its share of the device's peak says how close a kernel comes to the memory wall. The
same bytes are used for every impl: the torch path moves several times more (the gather writes a copy,
then reads it back in fp32), and that is exactly what its lower share shows.

On a GPU: latencies are triton.testing.do_bench medians; the peak comes from PEAK_GBPS by device name, or
from `python -m pagedlab.bench.kernel --peak-gbps N` (or PAGEDLAB_PEAK_GBPS=N for `pagedlab bench kernel`).
On a CPU, or wherever TRITON_INTERPRET=1, the kernels run in Triton's interpreter (every program in Python,
one after another): the times mean nothing, so it is a parity run on tiny shapes, with latency_us and
bandwidth_share null and the wall time of each call in `call_s`.
"""

from __future__ import annotations

import os
import time

import torch

from pagedlab.bench.tables import Column, Table, cell, left
from pagedlab.lessons.kernel_cases import HeadShape, PagedCase, decode_impls, make_case, prefill_impl, reference
from pagedlab.lessons.kernels import select_mode

GPU_BATCHES = (1, 8, 64)
GPU_CONTEXTS = (512, 1024, 4096)
DTYPES = ("float16", "bfloat16", "float32")
PREFILL_CHUNK = 512  # new tokens per request in the prefill rows (at most the context)
CPU_BATCHES, CPU_CONTEXTS, CPU_PREFILL_CHUNK = (2,), (37,), 16  # 37 ends mid-block: the masks matter
IMPLS = ("torch", "triton-v1", "triton-v2", "sdpa", "triton-prefill")  # the order of each configuration's rows
# Vendor spec sheets, GB/s; the first name contained in torch.cuda.get_device_name() wins (order matters).
# fmt: off
PEAK_GBPS = (
    ("GH200", 4000), ("H200", 4800), ("H100 PCIe", 2000), ("H100 NVL", 3900), ("H100", 3350),
    ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555),
    ("L40S", 864), ("L40", 864), ("L4", 300), ("RTX 4090", 1008), ("A10G", 600), ("T4", 320),
)
# fmt: on
GPU_SHAPE = HeadShape(32, 8, 128, 16, 512)  # Llama-3-8B's attention, vLLM's defaults
CPU_SHAPE = HeadShape(4, 2, 32, 16, 16)  # the bundled model's heads; partitions of 16 split a context of 37


def peak_gbps_for(device_name: str) -> float | None:
    """The spec-sheet bandwidth of a device by name, or None if it is not in PEAK_GBPS."""
    name = device_name.lower()
    return next((float(gbps) for key, gbps in PEAK_GBPS if key.lower() in name), None)


def measure(fn, want: torch.Tensor, mode: str) -> dict:
    """One call (checked against `want`), then on a GPU the do_bench median; never raises."""
    try:
        start = time.perf_counter()
        got = fn()
        if mode == "gpu":
            torch.cuda.synchronize()
        call_s = time.perf_counter() - start
        err = (got.float() - want).abs().max().item()
        latency_us = None
        if mode == "gpu":
            import triton.testing

            latency_us = triton.testing.do_bench(fn, return_mode="median") * 1000
        return {"latency_us": latency_us, "max_abs_err": err, "call_s": call_s, "error": None}
    except Exception as e:  # an OOM or a kernel failure must not lose the other rows
        if mode == "gpu":
            torch.cuda.empty_cache()
        return failed(e)


def kernel_rows(mode: str, batches, context_lens, dtypes, shape: HeadShape, chunk: int, peak: float | None) -> list:
    """Every (batch, context, dtype): one decode step through each impl, plus one prefill chunk."""
    device = "cuda" if mode == "gpu" else "cpu"
    rows = []
    for batch in batches:
        for ctx in context_lens:
            for name in dtypes:
                common = dict(batch=batch, context_len=ctx, dtype=name, mode=mode, peak_gbps=peak, **vars(shape))
                rows += safe_config_rows(shape, getattr(torch, name), device, min(chunk, ctx), common)
    return rows


def safe_config_rows(shape: HeadShape, dtype: torch.dtype, device: str, chunk: int, common: dict) -> list[dict]:
    """config_rows, or one error row per impl when building the case itself fails (e.g. out of memory)."""
    try:
        case = make_case(common["batch"], common["context_len"], shape, dtype, device)
        return config_rows(case, chunk, common)
    except Exception as e:
        if device == "cuda":
            torch.cuda.empty_cache()
        return [make_row(i, failed(e), 0, common, q_len=None, launcher_picks=None, tflops=None) for i in IMPLS]


def failed(e: Exception) -> dict:
    return {"latency_us": None, "max_abs_err": None, "call_s": None, "error": f"{type(e).__name__}: {e}"[:300]}


@torch.inference_mode()
def config_rows(case: PagedCase, chunk: int, common: dict) -> list[dict]:
    """The rows of one (batch, context, dtype): decode through every impl, then one prefill chunk of `chunk`."""
    from pagedlab.attention.triton.decode import use_v1

    s, batch, ctx, mode = case.shape, common["batch"], common["context_len"], common["mode"]
    dtype = case.kv_cache.dtype
    g = torch.Generator(device=case.kv_cache.device).manual_seed(1)
    q = torch.randn(batch, s.num_heads, s.head_dim, generator=g, device=g.device).to(dtype)  # [B, H, D]
    qp = torch.randn(batch * chunk, s.num_heads, s.head_dim, generator=g, device=g.device).to(dtype)
    elem = case.kv_cache.element_size()
    kv_bytes = 2 * batch * ctx * s.num_kv_heads * s.head_dim * elem  # every K and V of the context, once
    q_out_bytes = 2 * batch * s.num_heads * s.head_dim * elem
    picks = "v1" if use_v1(ctx, batch, s.num_heads, s.partition_size) else "v2"
    want, rows = reference(case, q, 1), []
    for impl, fn in decode_impls(case, q).items():
        m = measure(fn, want, mode)
        rows.append(make_row(impl, m, kv_bytes + q_out_bytes, common, q_len=1, launcher_picks=picks, tflops=None))
    m = measure(prefill_impl(case, qp, chunk), reference(case, qp, chunk), mode)
    keys_seen = chunk * (ctx - chunk) + chunk * (chunk + 1) // 2  # causal: query i sees ctx - chunk + i + 1 keys
    flops = 4 * batch * s.num_heads * s.head_dim * keys_seen  # QK^T and PV, 2 flops per multiply-add
    tflops = flops / (m["latency_us"] * 1e-6) / 1e12 if m["latency_us"] else None
    rows.append(make_row("triton-prefill", m, kv_bytes, common, q_len=chunk, launcher_picks=None, tflops=tflops))
    return rows


def make_row(impl: str, m: dict, nbytes: int, common: dict, **extra) -> dict:
    """A flat row, the fields of chapters/97-architecture.md first; bandwidth_share only for decode (prefill is
    compute-bound)."""
    gbps = nbytes / (m["latency_us"] * 1e-6) / 1e9 if m["latency_us"] else None
    peak = common["peak_gbps"]
    share = gbps / peak if gbps and peak and impl != "triton-prefill" else None
    row = {"impl": impl, "batch": common["batch"], "context_len": common["context_len"], "dtype": common["dtype"]}
    row.update(latency_us=m["latency_us"], bandwidth_share=share, max_abs_err=m["max_abs_err"], gbps=gbps)
    row.update(bytes=nbytes, call_s=m["call_s"], interpreted=common["mode"] == "interpreter", error=m["error"])
    row.update({k: v for k, v in common.items() if k not in row and k != "mode"}, **extra)
    return row


def headline(rows: list[dict]) -> str:
    """The chapter's number: bandwidth share of V1 and V2 at the largest batch and context, in fp16."""
    big = [r for r in rows if r["dtype"] == "float16" and r["impl"] in ("triton-v1", "triton-v2", "torch", "sdpa")]
    if not big:
        return "kernel: no float16 rows"
    top = max((r["batch"], r["context_len"]) for r in big)
    at = {r["impl"]: r["bandwidth_share"] for r in big if (r["batch"], r["context_len"]) == top}
    shares = ", ".join(f"{k} {'-' if v is None else format(v, '.0%')}" for k, v in at.items())
    return f"kernel: bandwidth share at batch {top[0]}, context {top[1]}, fp16: {shares}"


def measure_kernel(console, peak_gbps: float | None = None, batches=None, context_lens=None, dtypes=DTYPES,
                   prefill_chunk: int | None = None) -> list[dict]:  # fmt: skip
    """Every impl over the shapes of this machine's mode (a GPU: latency and bandwidth; the interpreter: parity);
    no rows where Triton cannot run (select_mode says why)."""
    mode = select_mode(console)
    if mode is None:
        return []
    gpu = mode == "gpu"
    device = torch.cuda.get_device_name() if gpu else "CPU, Triton interpreter"
    peak = peak_gbps or float(os.environ.get("PAGEDLAB_PEAK_GBPS", 0)) or (peak_gbps_for(device) if gpu else None)
    if gpu:
        console.print(f"kernel: {device}, peak {peak or 'unknown (pass --peak-gbps)'} GB/s; do_bench medians")
    else:
        console.print(
            "kernel: [bold]parity only[/bold]. Under the interpreter every program runs in Python, one after "
            "another: its times say nothing about a GPU, so latency_us and bandwidth_share are null and `call s` "
            "is the interpreter's wall time."
        )
    rows = kernel_rows(
        mode,
        batches or (GPU_BATCHES if gpu else CPU_BATCHES),
        context_lens or (GPU_CONTEXTS if gpu else CPU_CONTEXTS),
        dtypes,
        GPU_SHAPE if gpu else CPU_SHAPE,
        prefill_chunk or (PREFILL_CHUNK if gpu else CPU_PREFILL_CHUNK),
        peak,
    )
    return [r | {"device": device} for r in rows]


def _title(rows: list[dict]) -> str:
    r0 = rows[0] if rows else {}
    shape = f"H={r0.get('num_heads')}, KVH={r0.get('num_kv_heads')}, D={r0.get('head_dim')}"
    return f"Paged attention on {r0.get('device')} ({shape}, block {r0.get('block_size')}); error vs fp32 torch"


TABLES = {
    "impls": Table(
        (
            left("impl", lambda r: r["impl"]),
            Column("batch", lambda r: str(r["batch"])),
            Column("context", lambda r: str(r["context_len"])),
            Column("q_len", lambda r: str(r["q_len"])),
            Column("dtype", lambda r: r["dtype"]),
            Column("latency µs", lambda r: cell(r["latency_us"], "{:.1f}")),
            Column("GB/s", lambda r: cell(r["gbps"], "{:.0f}")),
            Column("share of peak", lambda r: cell(r["bandwidth_share"], "{:.1%}")),
            Column("max |err|", lambda r: r["error"] or cell(r["max_abs_err"], "{:.1e}")),
            Column("call s", lambda r: cell(r["call_s"], "{:.3f}")),
        ),
        title=_title,
    ),
}


def tables(rows: list[dict]) -> dict[str, Table]:
    return TABLES


def report(console, rows: list[dict]) -> None:
    if not rows:
        return
    console.print(TABLES["impls"].rich(rows))
    if not rows[0]["interpreted"]:
        console.print(headline(rows))
