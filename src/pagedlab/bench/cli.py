"""Benchmarks (apps): the `pagedlab bench NAME` sub-command, its arguments and what it runs (tools/cli.py adds it).

Builds on: bench/__init__.py (BENCHES, run_bench).
Read with: chapters/97-architecture.md (Benchmarks).

Its help lists every bench in BENCHES with how long it takes; a bench-specific option given to a bench
that does not take it is refused by run_bench, in one line.
"""

from __future__ import annotations

import argparse

from pagedlab.bench import BENCHES, run_bench
from pagedlab.config import DTYPES, parse_bytes


def add_command(sub) -> None:
    """`pagedlab bench`: its help lists every bench and how long it takes."""
    figured = ", ".join(b.name for b in BENCHES.values() if b.figure)
    bench = sub.add_parser(
        "bench",
        help="the paper's measurements at our scale: memory, sharing, prefix, throughput, ... (seconds to minutes)",
        description="The vLLM paper's measurements at our scale. Roughly, on a quiet 2-core CPU:\n"
        + "".join(f"  {b.name:<11} {b.duration}\n" for b in BENCHES.values())
        + f"A busy machine takes longer. {figured} also write their figure,\n"
        "figures/NN_NAME.png, and the rows it was drawn from, figures/NN_NAME.json; the chapters quote\n"
        "the committed ones (`git checkout figures/` restores them).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("name", metavar="NAME", help="which bench: " + ", ".join(BENCHES))
    bench.add_argument("--json", action="store_true", help="stdout: exactly one JSON object; tables go to stderr")
    bench.add_argument("--no-figure", action="store_true", help="write neither the figure nor its JSON")
    rounds = {b.name: b.repeats for b in BENCHES.values() if b.repeats}
    repeats_help = ", ".join(rounds) + ": rounds of runs (default " + ", ".join(map(str, rounds.values())) + ")"
    bench.add_argument("--repeats", type=int, default=None, help=repeats_help)
    bench.add_argument("--threads", type=int, default=1, help="torch threads while it measures (default 1)")
    bench.add_argument(
        "--kv-budget",
        default=None,
        metavar="BYTES",
        help="real: give every system this many bytes of KV cache (e.g. 64MiB) instead of sweeping the default budgets",
    )
    bench.add_argument("--dtype", default=None, help="real: float32 (default), bfloat16, or both as "
                       "'float32,bfloat16'; kernel: only these of its dtypes")  # fmt: skip
    bench.add_argument("--device", default=None, help="real: cpu (default) or cuda (every system on the GPU)")
    bench.add_argument(
        "--peer",
        default=None,
        choices=["vllm"],
        help="scheduler: time vLLM 0.33.0's Scheduler beside ours (after `pagedlab fetch vllm`)",
    )
    bench.add_argument("--layouts", action="store_true", help="memory: also a hybrid model's KV bytes for the same "
                       "requests, every layer full vs vLLM's KV cache groups vs every layer sliding")  # fmt: skip
    _add_trace_arguments(bench)
    bench.add_argument("--url", default=None, help="serve: load this OpenAI-compatible server instead, e.g. a real "
                       "vLLM at http://HOST:8000/v1 (no figure is written)")  # fmt: skip
    bench.add_argument("--model", default=None, help="serve --url: the model to ask for (default: the first listed)")
    bench.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    options = {} if args.repeats is None else {"repeats": args.repeats}
    if args.kv_budget is not None:
        options["kv_budgets"] = (parse_bytes(args.kv_budget, "--kv-budget"),)
    if args.dtype is not None:
        options["dtypes"] = tuple(d.strip() for d in args.dtype.split(","))
        bad = [d for d in options["dtypes"] if d not in DTYPES]
        if bad or not options["dtypes"]:
            raise ValueError(f"--dtype: {args.dtype!r}: each of a comma list must be one of {tuple(DTYPES)}")
    if args.device is not None:
        options["device"] = args.device
    if args.peer is not None:
        options["peer"] = args.peer
    if args.layouts:
        options["layouts"] = True
    options.update(_trace_options(args))
    if args.url is not None or args.model is not None:
        if args.name != "serve":
            raise ValueError(f"--url: only the serve bench loads another server, not {args.name}")
        options |= {"url": args.url, "model": args.model}
    figure = not args.no_figure and args.url is None  # the committed figure is pagedlab's own servers'
    run_bench(args.name, as_json=args.json, figure=figure, threads=args.threads, **options)
    return 0


def _trace_options(args: argparse.Namespace) -> dict:
    """`bench traces`'s own options (a comma list each); run_bench refuses them for any other bench."""
    given = {
        "traces": args.trace and [args.trace],
        "policies": args.policies and args.policies.split(","),
        "pool_sizes": args.pool_sizes and [_count(s, "--pool-sizes") for s in args.pool_sizes.split(",")],
        "concurrency": args.concurrency,
        "jobs": args.jobs,
    }
    return {k: v for k, v in given.items() if v is not None}


def _count(text: str, flag: str) -> int:
    try:
        return int(text.strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"{flag}: {text!r} is not a whole number (a comma list, e.g. 1024,4096)") from None


def _add_trace_arguments(bench: argparse.ArgumentParser) -> None:
    """The options of `pagedlab bench traces` (chapters/04-prefix-caching.md, Real traffic)."""
    bench.add_argument("--trace", default=None, help="traces: conversation or synthetic (default: both)")
    bench.add_argument("--policies", default=None, help="traces: a comma list of lru,fifo,lfu,slru,min (default: all)")
    bench.add_argument(
        "--pool-sizes", default=None, help="traces: pool sizes in blocks of 512 tokens, a comma list (default: 512 "
        "to 65536, doubling)"
    )  # fmt: skip
    bench.add_argument("--concurrency", type=int, default=None, help="traces: requests in flight at most (default 1)")
    bench.add_argument("--jobs", type=int, default=None, help="traces: replays at once, one process each (default 2)")
