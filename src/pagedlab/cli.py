"""The `pagedlab` command line: one sub-command per job.

Builds on: everything (the CLI only wires parts together).
Read with: README.md.
"""

from __future__ import annotations

import argparse
import sys
import time


def _cmd_generate(args: argparse.Namespace) -> int:
    from pagedlab import SamplingParams, load_model, oracle

    loaded = load_model(args.model)
    if loaded.tokenizer is None:
        raise SystemExit(f"{args.model}: no tokenizer.json, so text prompts cannot be encoded")
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    for prompt in args.prompts:
        ids = loaded.tokenizer.encode(prompt)
        start = time.perf_counter()
        out = oracle.generate(loaded.model, ids, params, loaded.config.eos_token_ids)
        seconds = time.perf_counter() - start
        rate = len(out.token_ids) / seconds
        print(f"--- {prompt!r} ({len(out.token_ids)} tokens, {out.finish_reason}, {rate:.1f} tok/s)")
        print(prompt + loaded.tokenizer.decode(out.token_ids))
    return 0


def _cmd_train_tiny(args: argparse.Namespace) -> int:
    from pagedlab.model.loader import bundled_model_path
    from pagedlab.train import TrainConfig, train_tiny

    out = args.out or bundled_model_path()
    tc = TrainConfig(steps=args.steps, seed=args.seed)
    summary = train_tiny(out, tc)
    print(
        f"saved to {out}: {summary['parameters']:,} parameters, val loss {summary['val_loss']:.3f}, "
        f"{summary['train_seconds']:.0f} s"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedlab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text from prompts with the bundled model")
    gen.add_argument("prompts", nargs="*", default=["ROMEO:"])
    gen.add_argument("--model", default="tiny-shakespeare", help="'tiny-shakespeare' or a Hugging Face folder")
    gen.add_argument("--max-tokens", type=int, default=200)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=_cmd_generate)

    tiny = sub.add_parser("train-tiny", help="retrain the bundled tiny-shakespeare model (a few minutes on CPU)")
    tiny.add_argument("--out", default=None, help="output folder (default: overwrite the bundled model)")
    tiny.add_argument("--steps", type=int, default=1000)
    tiny.add_argument("--seed", type=int, default=1337)
    tiny.set_defaults(func=_cmd_train_tiny)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(args.func(args))
    except ValueError as e:
        sys.exit(f"pagedlab {args.command}: {e}")
