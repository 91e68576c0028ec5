"""Stage 6: the kernels run for chapter 6's figures: one decode step's launches recorded, and parity measured.

Builds on: attention/triton/decode.py (`paged_decode`, `use_v1`, the V1/V2/reduce kernels),
attention/triton/prefill.py, attention/triton/store.py, lessons/kernel_cases.py (random paged cases, the fp32
torch reference).
Read with: chapters/06-triton-kernel.md, viz/kernels.py (which draws what this module measures).

`launch_plan` records one decode step as the launcher sets it up: the case's block table and seq_lens, the
grids and constexprs of a dry launch of `paged_decode` (its kernels swapped for recorders, so nothing runs),
and use_v1's choice. `parity_rows` runs each kernel over the parametrizations of
tests/attention/test_triton_kernels.py (block sizes 1 and 16, heads 2/2 and 4/1, fp32 and fp16, bf16 for
store_kv) against the fp32 reference. `select_mode` is the rule the kernel bench shares: a GPU, else the
interpreter on a CPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass

import torch

from pagedlab.lessons.kernel_cases import HeadShape, PagedCase, make_case, reference

KERNEL_MODULES = ("pagedlab.attention.triton.decode", "pagedlab.attention.triton.prefill")


def select_mode(console) -> str | None:
    """'gpu', 'interpreter' (set here if needed), or None when Triton cannot run in this process (said why)."""
    if importlib.util.find_spec("triton") is None:
        console.print("kernel: triton is not installed (`pip install triton`, Linux only): nothing to measure")
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpreter"  # chosen by the caller (the test suite does), even where CUDA exists
    if torch.cuda.is_available():
        return "gpu"
    if any(m in sys.modules for m in KERNEL_MODULES):
        console.print(
            "kernel: no CUDA device, and pagedlab's Triton kernels were already imported without "
            "TRITON_INTERPRET=1; run again in a fresh process (or set TRITON_INTERPRET=1 first)"
        )
        return None
    os.environ["TRITON_INTERPRET"] = "1"  # before triton and the kernels are imported (below, lazily)
    console.print("kernel: no CUDA device: set TRITON_INTERPRET=1 before importing triton")
    return "interpreter"


DEMO_SHAPE = HeadShape(num_heads=4, num_kv_heads=2, head_dim=32, block_size=16, partition_size=16)  # notebook 06's


DEMO_SEQ_LENS = (37, 16, 5)  # ends mid-block, exactly one block, short: notebook 06's decode step


DECODE_KERNELS = ("paged_decode_v1_kernel", "paged_decode_v2_kernel", "paged_decode_reduce_kernel")


class KernelsUnavailable(RuntimeError):
    """Triton cannot run the kernels in this process (not installed, or imported compiled on a CPU)."""


class _Said:
    """A console that keeps what bench.kernel.select_mode says, so a refusal can be raised with its reason."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, *parts, **_) -> None:
        self.lines.append(" ".join(map(str, parts)))


def kernel_device() -> str:
    """'cuda', or 'cpu' with TRITON_INTERPRET=1 (set here if no kernel module is imported yet): the bench's rule."""
    said = _Said()
    mode = select_mode(said)
    if mode is None:
        raise KernelsUnavailable(said.lines[-1])
    return "cuda" if mode == "gpu" else "cpu"


def demo_case(device: str = "cpu") -> PagedCase:
    """Notebook 06's decode case: tables [4, 3, 6], [8, 2, 1], [9, 5, 7] into a pool of 10 blocks of 16."""
    return make_case(len(DEMO_SEQ_LENS), max(DEMO_SEQ_LENS), DEMO_SHAPE, torch.float32, device)


@dataclass(frozen=True)
class Launch:
    """One kernel launch, as the launcher made it."""

    kernel: str  # the @triton.jit function's name
    grid: tuple[int, ...]  # programs along program_id(0), (1), (2)
    constexprs: dict[str, int]  # its UPPER_CASE arguments: BLOCK_N, BLOCK_SIZE, PARTITION_SIZE, ...
    shapes: tuple[tuple[int, ...], ...]  # the shape of each tensor argument, in order (V2: its scratch first)


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **constexprs)` is written down, not run."""

    def __init__(self, name: str, log: list[Launch]) -> None:
        self.name, self.log = name, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs) -> None:
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
            self.log.append(Launch(self.name, tuple(grid), {k: v for k, v in kwargs.items() if k.isupper()}, shapes))

        return launch


def dry_launch(case: PagedCase, seq_lens: list[int], version: str, partition_size: int) -> list[Launch]:
    """The launches `paged_decode(version=...)` makes for one decode step of `case`: its own checks, grids and
    constexprs, with the kernels swapped for recorders (restored after), so no kernel time is spent."""
    kernel_device()  # TRITON_INTERPRET first where there is no GPU: the decode module is imported next
    from pagedlab.attention.triton import decode

    log: list[Launch] = []
    real = {name: getattr(decode, name) for name in DECODE_KERNELS}
    s, dev = case.shape, case.kv_cache.device
    q = torch.zeros(len(seq_lens), s.num_heads, s.head_dim, dtype=case.kv_cache.dtype, device=dev)  # [B, H, D]
    rows, lens = torch.arange(len(seq_lens), device=dev), torch.tensor(seq_lens, device=dev)
    kv = (case.k_cache, case.v_cache, case.block_table, lens, rows, rows)
    try:
        for name in DECODE_KERNELS:
            setattr(decode, name, _Recorder(name, log))
        decode.paged_decode(
            torch.empty_like(q), q, *kv, s.head_dim**-0.5,
            max_seq_len=max(seq_lens), partition_size=partition_size, version=version,
        )  # fmt: skip
    finally:
        for name, kernel in real.items():
            setattr(decode, name, kernel)
    return log


@dataclass(frozen=True)
class LaunchPlan:
    """One decode step of a case as paged_decode sets it up: every number viz.kernels.draw_decode_programs shows."""

    block_table: list[list[int]]  # [B][MB] the case's: logical -> physical block
    seq_lens: list[int]  # each request's context length
    num_blocks: int  # physical blocks in the pool, k_cache.shape[0]
    num_kv_heads: int  # KVH
    head_dim: int  # D
    picks_v1: bool  # use_v1(max(seq_lens), B, H, partition_size): what paged_decode runs when not told
    v1: Launch  # paged_decode_v1_kernel
    v2: Launch  # paged_decode_v2_kernel
    reduce: Launch  # paged_decode_reduce_kernel

    def const(self, name: str) -> int:
        """A constexpr of the launches: BLOCK_SIZE, BLOCK_N, QUERIES_PER_KV (V1's) or PARTITION_SIZE (V2's)."""
        return {**self.v1.constexprs, **self.v2.constexprs}[name]

    def active_parts(self, b: int) -> int:
        """V2 partitions that hold request b's context; the others return at once (start >= seq_len)."""
        return -(-self.seq_lens[b] // self.const("PARTITION_SIZE"))


def launch_plan(
    case: PagedCase | None = None, seq_lens: list[int] | None = None, partition_size: int | None = None
) -> LaunchPlan:
    """The plan of one decode step (default: notebook 06's case), both versions dry-launched."""
    case = demo_case() if case is None else case
    seq_lens = list(DEMO_SEQ_LENS if seq_lens is None else seq_lens)
    ps = partition_size or case.shape.partition_size
    (v1,) = dry_launch(case, seq_lens, "v1", ps)
    v2, reduce = dry_launch(case, seq_lens, "v2", ps)
    from pagedlab.attention.triton.decode import use_v1

    picks = use_v1(max(seq_lens), len(seq_lens), case.shape.num_heads, ps)
    k = case.k_cache  # [num_blocks, block_size, KVH, D]
    return LaunchPlan(case.block_table.tolist(), seq_lens, k.shape[0], k.shape[2], k.shape[3], picks, v1, v2, reduce)


PARITY_BLOCK_SIZES = (1, 16)


PARITY_HEADS = ((2, 2), (4, 1))  # (H, KVH): no GQA, and four query heads per KV head


PARITY_DTYPES = ("float32", "float16")


STORE_DTYPES = ("float32", "float16", "bfloat16")


TOL = {"float32": 2e-5, "float16": 2e-3}  # the tests' atol and rtol; store_kv must be exact (torch.equal): 0


PREFILL_SEQ_LENS, PREFILL_Q_LEN = (37, 21, 16), 16  # 16 new tokens after 21 cached, after 5, and a whole prompt
DECODE_SEQ_LENS = (37, 5, 16, 50)  # the tests': ends mid-block, short, exactly one block, several partitions


KERNELS = ("store_kv", "paged_decode v1", "paged_decode v2", "paged_prefill")  # the groups, in drawing order


def parity_cases(
    kernels=KERNELS, block_sizes=PARITY_BLOCK_SIZES, heads=PARITY_HEADS, dtypes=PARITY_DTYPES, store_dtypes=STORE_DTYPES
) -> list[tuple[str, int, tuple[int, int] | None, str]]:
    """(kernel, block_size, (H, KVH) or None for store_kv, dtype) of every case, in drawing order."""
    cases = []
    for kernel in kernels:
        if kernel == "store_kv":  # two KV heads, as the tests': a copy has no query heads
            cases += [(kernel, bs, None, d) for bs in block_sizes for d in store_dtypes]
        else:
            cases += [(kernel, bs, hk, d) for bs in block_sizes for hk in heads for d in dtypes]
    return cases


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU, Triton interpreter"


def _decode_err(version: str, shape: HeadShape, dtype: torch.dtype, device: str) -> float:
    from pagedlab.attention.triton.decode import paged_decode

    n, lens = len(DECODE_SEQ_LENS), list(DECODE_SEQ_LENS)
    case = make_case(n, max(lens), shape, dtype, device)
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(n, shape.num_heads, shape.head_dim, generator=g, device=device).to(dtype)  # [B, H, D]
    out, rows = torch.empty_like(q), torch.arange(n, device=device)
    kv = (case.k_cache, case.v_cache, case.block_table, torch.tensor(lens, device=device), rows, rows)
    ps = shape.partition_size
    paged_decode(out, q, *kv, shape.head_dim**-0.5, max_seq_len=max(lens), partition_size=ps, version=version)
    return (out.float() - reference(case, q, 1, lens)).abs().max().item()


def _prefill_err(shape: HeadShape, dtype: torch.dtype, device: str) -> float:
    from pagedlab.attention.triton.prefill import paged_prefill

    n, lens, q_len = len(PREFILL_SEQ_LENS), list(PREFILL_SEQ_LENS), PREFILL_Q_LEN
    case = make_case(n, max(lens), shape, dtype, device)
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(n * q_len, shape.num_heads, shape.head_dim, generator=g, device=device).to(dtype)  # [T, H, D]
    qsl = torch.arange(n + 1, device=device) * q_len  # query_start_loc
    out, rows = torch.empty_like(q), torch.arange(n, device=device)
    kv = (case.k_cache, case.v_cache, case.block_table, torch.tensor(lens, device=device), qsl, rows)
    paged_prefill(out, q, *kv, shape.head_dim**-0.5, max_query_len=q_len)
    return (out.float() - reference(case, q, q_len, lens)).abs().max().item()


def _store_err(block_size: int, dtype: torch.dtype, device: str) -> float:
    """store_kv against the torch index_copy_, the tests' case: 5 tokens (3 for blocks of 1) into 4 blocks."""
    from pagedlab.attention.reference import store_kv as torch_store_kv
    from pagedlab.attention.triton.store import store_kv

    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(2, 9, 2, 32, generator=g)  # [T, KVH, D] each
    slots = torch.randperm(4 * block_size, generator=g)[:5] if block_size > 1 else torch.tensor([3, 0, 2])
    k, v = k[: len(slots)], v[: len(slots)]
    got = [torch.zeros(4, block_size, 2, 32, dtype=dtype, device=device) for _ in range(2)]
    want = [torch.zeros(4, block_size, 2, 32, dtype=dtype) for _ in range(2)]
    store_kv(*got, k.to(device), v.to(device), slots.to(device))
    torch_store_kv(*want, k, v, slots)
    return max((a.cpu().float() - b.float()).abs().max().item() for a, b in zip(got, want))


def _case_err(kernel: str, bs: int, heads: tuple[int, int] | None, dtype: torch.dtype, device: str) -> float:
    if kernel == "store_kv":
        return _store_err(bs, dtype, device)
    shape = HeadShape(*heads, head_dim=32, block_size=bs, partition_size=16)  # V2 splits 50 tokens into 4
    if kernel == "paged_prefill":
        return _prefill_err(shape, dtype, device)
    return _decode_err(kernel.split()[1], shape, dtype, device)  # "paged_decode v1" -> "v1"


@torch.inference_mode()
def parity_rows(**subset) -> list[dict]:
    """Every case of parity_cases(**subset) run and checked, a row each: kernel, version, block_size, heads
    ('H/KVH'), dtype, max_abs_err (against the fp32 torch reference), tol (0 for store_kv: a copy must be exact)
    and device. Under the interpreter on a CPU, about a third of a second a case."""
    device, rows = kernel_device(), []
    for kernel, bs, heads, dtype in parity_cases(**subset):
        err = _case_err(kernel, bs, heads, getattr(torch, dtype), device)
        name, _, version = kernel.partition(" ")
        row = dict(kernel=name, version=version or None, block_size=bs, heads=heads and f"{heads[0]}/{heads[1]}")
        row.update(dtype=dtype, max_abs_err=err, tol=0.0 if heads is None else TOL[dtype], device=_device_name(device))
        rows.append(row)
    return rows
