"""Serving: what `pagedlab serve --live` draws, and `--explain-metrics` asks a running server.

Builds on: serve/server.py (the engine the server runs), viz/terminal.py (the demo's frame), engine/events.py.
Read with: chapters/08-online-serving.md (Watching it: --live).
"""

from __future__ import annotations

import time

from pagedlab.engine.async_engine import AsyncEngine


class LiveView:
    """`pagedlab serve --live`: the demo's frame (queues, pool, requests, what changed), redrawn from the
    server's own engine after its steps, at most `fps` times a second."""

    def __init__(self, console=None, fps: float = 4.0):
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.min_interval, self.last = 1.0 / fps, 0.0

    def __call__(self, engine: AsyncEngine) -> None:  # the engine thread, after each step
        now = time.monotonic()
        if now - self.last < self.min_interval:
            return
        self.last = now
        self.live.update(self.frame(engine), refresh=True)

    def frame(self, engine: AsyncEngine):
        from rich.console import Group
        from rich.text import Text

        from pagedlab.engine.events import step_events
        from pagedlab.viz.terminal import changes, pool_line, queue_line, request_table

        trace, config = list(engine.engine.trace), engine.engine.config
        if not trace:
            return Text("waiting for the first request")
        with engine.lock:
            prompts, texts, stats = dict(engine.prompts), dict(engine.texts), engine.stats
            done = sum(stats.finished.values())
        t = trace[-1]
        header = Text(f"step {t.step} · serving at stage {config.stage} ({config.stage_name}) · {done} finished")
        header.stylize("bold")
        body = [header, queue_line(t, config), pool_line(t, config), request_table(t, prompts, texts)]
        return Group(*body, changes(step_events(trace, len(trace) - 1, config)))

    def __enter__(self):
        self.live.start()
        return self

    def __exit__(self, *exc):
        self.live.stop()


def explain_from(url: str) -> str:
    """`pagedlab serve --explain-metrics`: ask a running server why its hit rate is what it is."""
    import urllib.request

    with urllib.request.urlopen(url.rstrip("/") + "/metrics/explain", timeout=10) as response:
        return response.read().decode()
