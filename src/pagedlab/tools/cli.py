"""The `pagedlab` command line: one sub-command per job.

Builds on: everything (the CLI only wires parts together; tools/demo.py draws the live view).
Read with: README.md.
"""

from __future__ import annotations

import argparse
import sys
import time


def _cmd_demo(args: argparse.Namespace) -> int:
    from pagedlab.tools.demo import DemoOptions, run_demo

    opts = DemoOptions(
        stage=args.stage,
        model=args.model,
        num_requests=args.num_requests,
        max_tokens=args.max_tokens,
        max_num_seqs=args.max_num_seqs,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        temperature=args.temperature,
        seed=args.seed,
        live=args.live,
        delay=args.delay,
        figures_dir=None if args.no_figures else args.figures_dir,
    )
    run_demo(opts)
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


def _cmd_describe(args: argparse.Namespace) -> int:
    from pagedlab.config import parse_stage
    from pagedlab.stages import default_stage, describe

    print(describe(default_stage() if args.stage is None else parse_stage(args.stage)))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from pagedlab.bench import run_bench

    run_bench(args.name, as_json=args.json, figure=not args.no_figure)
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    try:
        from pagedlab.lessons import make_figures
    except ImportError as e:
        raise SystemExit(f"pagedlab figures: not available yet ({e})") from e
    for path in make_figures(args.out):
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


def _add_demo(sub) -> None:
    demo = sub.add_parser("demo", help="the bundled model through a stage, drawn live: queues, blocks, KV use")
    demo.add_argument("--stage", default=None, help="number or name (default: continuous)")
    demo.add_argument("--model", default="tiny-shakespeare", help="'tiny-shakespeare' or a Hugging Face folder")
    demo.add_argument("--num-requests", type=int, default=8)
    demo.add_argument("--max-tokens", type=int, default=32)
    demo.add_argument("--max-num-seqs", type=int, default=4, help="requests running at once (small: queues show)")
    demo.add_argument("--block-size", type=int, default=16)
    demo.add_argument("--num-kv-blocks", type=int, default=None, help="KV pool size (default: sized by the engine)")
    demo.add_argument("--temperature", type=float, default=0.8)
    demo.add_argument("--seed", type=int, default=0, help="request i samples with seed + i")
    demo.add_argument("--delay", type=float, default=0.05, help="seconds per live frame")
    demo.add_argument("--no-live", dest="live", action="store_false", help="one log line per step instead")
    demo.add_argument("--no-figures", action="store_true", help="skip the figures at the end")
    demo.add_argument("--figures-dir", default="figures")
    demo.set_defaults(func=_cmd_demo)


def _add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="generate text from prompts with the engine of a stage")
    gen.add_argument("prompts", nargs="*", default=["ROMEO:"])
    gen.add_argument("--model", default="tiny-shakespeare", help="'tiny-shakespeare' or a Hugging Face folder")
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

    from pagedlab.tools import assignment

    if args.action == "make":
        out = assignment.make(args.stage, args.out, with_solutions=args.with_solutions)
        tasks = json.loads((out / "assignment.json").read_text())["tasks"]
        print(f"wrote {out}: stage {args.stage}, {len(tasks)} tasks (see {out / 'HANDOUT.md'})")
        return 0
    result = assignment.grade(args.dir, extra_tests=args.extra_tests)
    assignment.print_grades(result)
    if args.json:
        print(json.dumps({"score": result["score"], "max_score": result["max_score"], "tests": result["tests"]}))
    return 0 if result["score"] == result["max_score"] else 1


def _add_assignment(sub) -> None:
    a = sub.add_parser("assignment", help="course assignments: make a student copy of a stage, or grade one")
    actions = a.add_subparsers(dest="action", required=True)
    make = actions.add_parser("make", help="write a student workspace with stage N's heart removed")
    make.add_argument("stage", help="stage number or name")
    make.add_argument("--out", required=True, help="new or empty folder")
    make.add_argument("--with-solutions", action="store_true", help="a teacher's copy: nothing removed")
    grade = actions.add_parser("grade", help="run the stage's tests on a workspace and score them")
    grade.add_argument("dir", help="a folder written by `assignment make`")
    grade.add_argument("--json", action="store_true", help="print Gradescope's results.json to stdout")
    grade.add_argument("--extra-tests", default=None, help="a folder of hidden tests to run as well")
    a.set_defaults(func=_cmd_assignment)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_generate(sub)

    desc = sub.add_parser("describe", help="print a stage's wiring: KV manager, scheduler, attention")
    desc.add_argument("--stage", default=None, help="number or name (default: continuous)")
    desc.set_defaults(func=_cmd_describe)

    bench = sub.add_parser("bench", help="the paper's measurements at our scale: memory, sharing, prefix, ...")
    bench.add_argument("name", help="which bench, e.g. memory")
    bench.add_argument("--json", action="store_true", help="stdout: exactly one JSON object; tables go to stderr")
    bench.add_argument("--no-figure", action="store_true", help="do not write the bench's figure under figures/")
    bench.set_defaults(func=_cmd_bench)

    figs = sub.add_parser("figures", help="regenerate the figures")
    figs.add_argument("--out", default="figures", help="output folder")
    figs.set_defaults(func=_cmd_figures)

    _add_assignment(sub)
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
