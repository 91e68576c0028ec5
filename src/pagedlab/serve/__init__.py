"""Serving (apps): `pagedlab serve`, an OpenAI-compatible server around one engine loop, and its views.

Builds on: engine/async_engine.py (the engine in its own thread).
Read with: chapters/08-online-serving.md.

    server.py    the FastAPI app, its routes, ThreadedServer (a notebook's or a test's), serve() (the command)
    protocol.py  OpenAI's request and response shapes, every field checked at the door
    prompts.py   prompts rendered and tokenized before they are queued, in pools of threads of their own
    metrics.py   /metrics in Prometheus text with vLLM's names, /metrics/explain, and reading them back
    live.py      `--live`: the engine's steps in the terminal; `--explain-metrics`: ask a running server
    cli.py       the `pagedlab serve` sub-command: its arguments, and what it runs

The names below are loaded when first asked for (`serve.ThreadedServer`): the server's modules import FastAPI,
which the command line's other sub-commands, and `pagedlab serve --help`, never need.
"""

import importlib

_WHERE = {"LiveView": "live", "explain_from": "live", "mean_between": "metrics", "parse_metrics": "metrics",
          "ServerState": "server", "ThreadedServer": "server", "build_state": "server", "create_app": "server",
          "serve": "server"}  # fmt: skip
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'pagedlab.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pagedlab.serve.{_WHERE[name]}"), name)
