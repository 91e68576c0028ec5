"""Benchmarks: timed runs taken in turns over repeats, and what is reported of them (best, median, worst).

Builds on: nothing (pure Python: jobs are plain callables, so a test can hand it fakes).
Read with: chapters/97-architecture.md (Benchmarks), chapters/05-continuous-batching.md (Measurements).

On a shared machine a burst of other work slows whatever runs at that moment. Run every
system once, then every system again, and so on, so that a slow spell costs one run of
each system rather than every run of one:

    round 1   static  continuous  continuous-recompute  continuous-swap  hf-generate
    round 2   static  continuous  continuous-recompute  continuous-swap  hf-generate
    round 3   static  continuous  ...

Other programs only ever add to a run's time, so each system's best run is the one least
disturbed and is what the bench reports; the median and the worst say how steady the
machine was. A ratio of two best runs compares two systems under the quietest conditions
each of them met.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def round_robin(
    jobs: dict[str, Callable[[], T]], repeats: int, announce: Callable[[str, int], None] | None = None
) -> dict[str, list[T]]:
    """Call every job once per round, in the order of `jobs`, for `repeats` rounds: name -> its results in order.

    `announce(name, round)` (rounds from 1) is called before each run, e.g. to print progress.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    results: dict[str, list[T]] = {name: [] for name in jobs}
    for i in range(1, repeats + 1):
        for name, job in jobs.items():
            if announce is not None:
                announce(name, i)
            results[name].append(job())
    return results


def spread(values: list[float], name: str) -> dict[str, float]:
    """`name` (the best: the largest, as for a speed), `name_median` and `name_worst` of one system's runs."""
    if not values:
        raise ValueError(f"{name}: no runs to report")
    return {name: max(values), f"{name}_median": statistics.median(values), f"{name}_worst": min(values)}
