"""Chapter 8's notebook helpers: `pagedlab serve` in a background thread, and what /metrics says, as numbers.

Builds on: tools/serve.py (build_state, create_app), tools/serve_metrics.py.
Read with: notebooks/08_online_serving.ipynb, chapters/08-online-serving.md.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request


class BackgroundServer:
    """The real server (uvicorn, the FastAPI app, the engine thread) on a free port of 127.0.0.1."""

    def __init__(self, model: str = "tiny-shakespeare", chat_template: str | None = None, **engine_args):
        import uvicorn

        from pagedlab.tools import serve

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.state = serve.build_state(model, engine_args, chat_template=chat_template)
        config = uvicorn.Config(serve.create_app(self.state), host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:  # bounded: the server binds in well under a second
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start within 60 s")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return response.read().decode()

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics by name: counters, gauges, histogram _sum and _count (buckets left out)."""
        from prometheus_client.parser import text_string_to_metric_families

        samples = {}
        for family in text_string_to_metric_families(self.get("/metrics")):
            for sample in family.samples:
                if "le" not in sample.labels and "finished_reason" not in sample.labels:
                    samples[sample.name] = sample.value
        return samples

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.state.engine.shutdown()


def mean_between(before: dict[str, float], after: dict[str, float], histogram: str) -> float:
    """The mean of a histogram's observations made between two /metrics readings (its _sum / _count deltas)."""
    count = after[f"{histogram}_count"] - before[f"{histogram}_count"]
    return (after[f"{histogram}_sum"] - before[f"{histogram}_sum"]) / count if count else float("nan")
