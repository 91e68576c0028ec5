"""Benchmarks: `pagedlab bench traces`, real traffic through the real prefix cache: eviction policies vs the optimum.

Builds on: lessons/replay.py (a trace replayed through the stage-4 manager), lessons/traces.py (Mooncake's traces).
Read with: chapters/04-prefix-caching.md (Real traffic), chapters/97-architecture.md (Benchmarks).

Each configuration is one replay of a trace, block by block, no model:

    policies   lru fifo lfu slru min      x 8 pool sizes, the hash chain's index
    radix      lru fifo                   x 8 pool sizes, the radix tree's index (leaves first)
    tier       lru with a host tier as large as the pool      x 8 pool sizes
    infinite   a pool that never evicts: the ceiling (must equal the traces' README: 36.6 % and 64.0 %)

for each trace (conversation, synthetic). Nothing is timed, so the rows are the
same on every machine: the replays run in separate processes, two at a time.
Tables and figure: bench/traces_report.py.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from pagedlab.bench.common import progress, rough_duration
from pagedlab.errors import InvariantError
from pagedlab.kv.eviction import EVICTION_POLICIES
from pagedlab.lessons.replay import TRANSFER_COST, ReplayResult, replay
from pagedlab.lessons.traces import TRACE_BLOCK_SIZE, TRACES, infinite_ceiling, load_trace

POOL_SIZES = tuple(512 << k for k in range(8))  # 512 .. 65,536 blocks of 512 tokens: 262 K .. 33.6 M tokens
POLICIES = tuple(EVICTION_POLICIES)  # lru fifo lfu slru min
RADIX_POLICIES = ("lru", "fifo")  # the radix index too: where it must agree with the hash chain, and where not
TIER_POLICY = "lru"  # replayed again with a host tier of as many blocks as the pool (the same bytes again)
CPU_SECONDS = {"conversation": 1.7, "synthetic": 0.8}  # one replay on one quiet core of our 2-core CPU, roughly
JOBS = 2  # replays at once, each in its own process


@dataclass(frozen=True)
class Job:
    """One replay to run."""

    trace: str  # a name of TRACES
    policy: str  # a name of kv/eviction.py's EVICTION_POLICIES
    index: str = "hash-chain"
    pool_blocks: int | None = None  # None: infinite
    tier_blocks: int = 0
    concurrency: int = 1

    def label(self) -> str:
        tier = f" + tier {self.tier_blocks}" if self.tier_blocks else ""
        pool = "∞" if self.pool_blocks is None else self.pool_blocks
        return f"{self.trace} {self.policy} {self.index} {pool}{tier}"


def plan(traces=None, policies=None, pool_sizes=None, concurrency: int = 1) -> list[Job]:
    """The replays of a sweep, in the order the rows come out."""
    traces, policies, pool_sizes = _check(traces, policies, pool_sizes)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"--concurrency must be a positive integer, got {concurrency!r}")
    jobs = []
    for trace in traces:
        jobs.append(Job(trace, "infinite", concurrency=concurrency))
        for pool in pool_sizes:
            jobs += [Job(trace, p, "hash-chain", pool, 0, concurrency) for p in policies]
            jobs += [Job(trace, p, "radix", pool, 0, concurrency) for p in policies if p in RADIX_POLICIES]
            if TIER_POLICY in policies:
                jobs.append(Job(trace, TIER_POLICY, "hash-chain", pool, pool, concurrency))
    return jobs


def _check(traces, policies, pool_sizes) -> tuple[tuple, tuple, tuple]:
    traces = tuple(TRACES) if traces is None else tuple(traces)
    policies = POLICIES if policies is None else tuple(policies)
    pool_sizes = POOL_SIZES if pool_sizes is None else tuple(pool_sizes)
    for trace in traces:
        if trace not in TRACES:
            raise ValueError(f"--trace: {trace!r} is not one of {', '.join(TRACES)}")
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"--policies: {policy!r} is not one of {', '.join(POLICIES)}")
    for size in pool_sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"--pool-sizes: each must be a positive integer, got {size!r}")
    if not (traces and policies and pool_sizes):
        raise ValueError("--trace, --policies, --pool-sizes: none of them may be empty")
    return traces, tuple(dict.fromkeys(policies)), tuple(sorted(set(pool_sizes)))


def estimated_seconds(jobs: list[Job], workers: int) -> float:
    """Roughly how long on a quiet 2-core CPU: each replay's CPU time, shared among the workers, plus their start."""
    cpu = sum(CPU_SECONDS.get(j.trace, 1.0) for j in jobs)
    return cpu / workers + (3 * workers if workers > 1 else 0)


def start_line(options: dict) -> str:
    jobs = plan(options.get("traces"), options.get("policies"), options.get("pool_sizes"))
    workers = _workers(options.get("jobs"), len(jobs))
    return (
        f"traces: {len(jobs)} replays (every policy x {len({j.pool_blocks for j in jobs} - {None})} pool sizes, "
        f"the radix index, a host tier, the infinite ceiling) of {len({j.trace for j in jobs})} Mooncake trace(s), "
        f"{workers} at a time: {rough_duration(estimated_seconds(jobs, workers))} on a quiet 2-core CPU"
    )


def measure_traces(console, traces=None, policies=None, pool_sizes=None, concurrency: int = 1, jobs=None) -> list:
    """Every replay of the sweep (see plan), `jobs` at a time (default JOBS, at most the CPUs), as rows."""
    todo = plan(traces, policies, pool_sizes, concurrency)
    workers = _workers(jobs, len(todo))
    rows: list[dict | None] = [None] * len(todo)
    with progress(console, len(todo), "traces") as tick:
        if workers == 1:
            for i, job in enumerate(todo):
                tick(job.label())
                rows[i] = run_job(job)
        else:
            _run_parallel(todo, rows, workers, tick)
    _check_ceilings(rows)
    return rows


def _workers(jobs, num_jobs: int) -> int:
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"--jobs must be a positive integer, got {jobs!r}")
    wanted = min(JOBS, os.cpu_count() or 1) if jobs is None else jobs
    return max(1, min(wanted, num_jobs))


def _run_parallel(todo: list[Job], rows: list, workers: int, tick) -> None:
    # spawn, not fork: the bench process has torch loaded, and forking a process with threads risks a deadlock
    context = multiprocessing.get_context("spawn")
    order = sorted(range(len(todo)), key=lambda i: -CPU_SECONDS.get(todo[i].trace, 1.0))  # the longest first
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(run_job, todo[i]): i for i in order}
        try:
            for future in as_completed(futures):
                i = futures[future]
                tick(todo[i].label())
                rows[i] = future.result()
        except BaseException:  # Ctrl-C or a failed replay: stop the others too
            with contextlib.suppress(Exception):
                pool.shutdown(wait=False, cancel_futures=True)
            raise


def run_job(job: Job) -> dict:
    """One replay, as one row (in a worker process: the trace is loaded there once, and cached)."""
    result = replay(
        job.trace, job.policy, job.pool_blocks, index=job.index, tier_blocks=job.tier_blocks,
        concurrency=job.concurrency,
    )  # fmt: skip
    return row(result)


def row(r: ReplayResult) -> dict:
    """A replay's row: the fields chapters/97-architecture.md lists, and how they were counted."""
    return {
        "trace": r.trace,
        "policy": r.policy,
        "index": r.index,
        "pool_blocks": r.pool_blocks,
        "tier_blocks": r.tier_blocks,
        "hit_ratio": round(r.hit_ratio, 6),
        "dead_blocks_mean": round(r.dead_blocks_mean, 2),
        "refused": r.refused,
        "concurrency": r.concurrency,
        "block_size": TRACE_BLOCK_SIZE,
        "num_requests": len(r.hits),
        "prompt_blocks": r.prompt_blocks,
        "hit_blocks": sum(r.hits),
        "tier_hit_blocks": sum(r.tier_hits),
        "tier_hit_ratio": round(r.tier_hit_ratio, 6),
        "saved_ratio": round(r.saved_ratio, 6),  # tier hits count 1 - transfer_cost
        "transfer_cost": TRANSFER_COST,
        "evictions": sum(r.evictions),
    }


def _check_ceilings(rows: list[dict]) -> None:
    """The replay with a pool that never evicts must reproduce the README's count exactly."""
    for r in rows:
        if r["policy"] == "infinite":
            hits, blocks = infinite_ceiling(load_trace(r["trace"]))
            if (r["hit_blocks"], r["prompt_blocks"]) != (hits, blocks):
                raise InvariantError(f"{r['trace']}: the infinite pool hit {r['hit_blocks']} blocks, not {hits}")
