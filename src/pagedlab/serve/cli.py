"""Serving (apps): the `pagedlab serve` sub-command, its arguments and what it runs (tools/cli.py adds it).

Builds on: serve/server.py (build_state, serve), serve/live.py (--live, --explain-metrics).
Read with: chapters/08-online-serving.md.

Only the arguments load here: `pagedlab serve --help` and every other sub-command build this parser without
loading FastAPI, which the server's modules import when the command runs.
"""

from __future__ import annotations

import argparse
import sys

# `pagedlab serve` options passed to LLM(...) as engine settings.
SERVE_ENGINE_ARGS = (
    "stage", "block_size", "num_kv_blocks", "kv_cache_memory", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "long_prefill_token_threshold", "preemption_mode", "num_swap_blocks",
    "scheduling_policy", "attention_backend", "seed",
)  # fmt: skip


def add_command(sub) -> None:
    """`pagedlab serve`: the server's own options, then every engine setting it passes to LLM (hidden from help)."""
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


def _cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from pagedlab.serve.live import LiveView, explain_from  # here, not above: the server's modules load FastAPI
    from pagedlab.serve.server import build_state, serve

    if args.explain_metrics:
        print(explain_from(args.url or f"http://{args.host}:{args.port}"), end="")
        return 0
    engine_args = {name: getattr(args, name) for name in SERVE_ENGINE_ARGS if getattr(args, name) is not None}
    if args.no_prefix_caching:
        engine_args["enable_prefix_caching"] = False
    live = LiveView() if args.live else None
    if live is not None:
        engine_args.update(record_trace=True, max_trace_steps=64)
    state = build_state(args.model, engine_args, args.chat_template, live, max_body_bytes=args.max_body_bytes)
    print(
        f"serving {state.model_name} at http://{args.host}:{args.port}/v1 (stage {state.engine.engine.config.stage}, "
        f"max_model_len {state.max_model_len}); /metrics, /metrics/explain; Ctrl-C stops",
        file=sys.stderr,
    )
    if live is None:
        sig = serve(state, args.host, args.port)
    else:
        with live:
            sig = serve(state, args.host, args.port)
    if sig:
        print(f"stopped by {signal.Signals(sig).name}: requests in flight were aborted", file=sys.stderr)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value
