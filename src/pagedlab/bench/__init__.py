"""Benchmarks: `pagedlab bench NAME [--json]`, the paper's tables and figures at our scale.

Builds on: bench/workloads.py (seeded request streams shared by every bench) and the bench modules.
Read with: chapters/97-architecture.md (Benchmarks).

A bench is a function `run_NAME(console, *, figure=True, **options) -> {"bench": NAME, "rows": [...]}`
registered in BENCHES. It prints its progress and its table (the paper's figures beside ours) on
`console`, which is stderr, so that with `--json` stdout carries exactly one JSON object. Each row is
flat, with the fields chapters/97-architecture.md (Benchmarks) lists for that bench (null where they do
not apply), fractions as 0-1
numbers and times in seconds. Adding a bench = one module + one entry in BENCHES (a long bench keeps its
tables and figure in a NAME_report.py beside it). A bench whose figure a chapter shows writes the rows
beside the figure in the same run (figures/NN_NAME.json: bench/common.py, bench/figures.py), and the
chapter quotes those rows (scripts/chapter_tables.py renders them, for the tests and the maintainers).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from pagedlab.bench.kernel import run_kernel
from pagedlab.bench.memory import run_memory
from pagedlab.bench.prefix import run_prefix
from pagedlab.bench.real import run_real
from pagedlab.bench.scheduler import run_scheduler
from pagedlab.bench.serve import run_serve
from pagedlab.bench.sharing import run_sharing
from pagedlab.bench.throughput import run_throughput
from pagedlab.errors import InvariantError

BENCHES: dict[str, Callable[..., dict]] = {
    "memory": run_memory,  # Figure 2: where KV memory goes, contiguous vs paged
    "prefix": run_prefix,  # §6.4: prefill computed and time to first token with a shared prefix, cached or not
    "sharing": run_sharing,  # Figure 15: KV blocks saved by sharing, parallel sampling and beam search
    "throughput": run_throughput,  # §6.2 at our scale: continuous vs static batching (and HF generate), CPU
    "scheduler": run_scheduler,  # microseconds per schedule() + update() as the running batch grows
    "kernel": run_kernel,  # stage-6 Triton kernels vs torch: parity on CPU (interpreter); latency, bandwidth on GPU
    "real": run_real,  # SmolLM2-135M-Instruct on CPU: pagedlab vs transformers' generate and generate_batch
    "serve": run_serve,  # Figure 12 at our scale: pagedlab serve under Poisson load, continuous vs static
}


def run_bench(name: str, as_json: bool = False, **options) -> dict:
    """Run bench `name` (tables on stderr); with `as_json`, also print its result to stdout as one JSON object."""
    from rich.console import Console

    if name not in BENCHES:
        raise ValueError(f"unknown bench {name!r}; known: {', '.join(sorted(BENCHES))}")
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)  # logs and CI: no 80-column squeeze
    result = BENCHES[name](console, **options)
    if result.get("bench") != name or not isinstance(result.get("rows"), list):
        raise InvariantError(f"bench {name} returned {result}")
    if as_json:
        json.dump(result, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
        sys.stdout.flush()
    return result
