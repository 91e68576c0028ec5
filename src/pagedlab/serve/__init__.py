"""Serving (apps): `pagedlab serve`, an OpenAI-compatible server around one engine loop, and its views.

Builds on: engine/async_engine.py (the engine in its own thread).
Read with: chapters/08-online-serving.md.

    server.py    the FastAPI app, its routes, ThreadedServer (a notebook's or a test's), serve() (the command)
    protocol.py  OpenAI's request and response shapes, every field checked at the door
    prompts.py   prompts rendered and tokenized before they are queued, in pools of threads of their own
    metrics.py   /metrics in Prometheus text with vLLM's names, /metrics/explain, and reading them back
    live.py      `--live`: the engine's steps in the terminal; `--explain-metrics`: ask a running server
"""

from pagedlab.serve.live import LiveView, explain_from
from pagedlab.serve.metrics import mean_between, parse_metrics
from pagedlab.serve.server import ServerState, ThreadedServer, build_state, create_app, serve

__all__ = ["LiveView", "ServerState", "ThreadedServer", "build_state", "create_app", "explain_from", "mean_between",
           "parse_metrics", "serve"]  # fmt: skip
