"""Chapter 8's notebook helpers: `pagedlab serve` in a background thread, and what /metrics says, as numbers.

Builds on: tools/serve.py (build_state, create_app), tools/serve_metrics.py.
Read with: notebooks/08_online_serving.ipynb, chapters/08-online-serving.md.
"""

from __future__ import annotations

import urllib.request


class BackgroundServer:
    """The real server (uvicorn, the FastAPI app, the engine thread) on a free port of 127.0.0.1."""

    def __init__(self, model: str = "tiny-shakespeare", chat_template: str | None = None, **engine_args):
        from pagedlab.tools import serve

        self.threaded = serve.ThreadedServer(serve.build_state(model, engine_args, chat_template=chat_template))
        self.state, self.port, self.url = self.threaded.state, self.threaded.port, self.threaded.url

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
        self.threaded.close()


def mean_between(before: dict[str, float], after: dict[str, float], histogram: str) -> float:
    """The mean of a histogram's observations made between two /metrics readings (its _sum / _count deltas)."""
    count = after[f"{histogram}_count"] - before[f"{histogram}_count"]
    return (after[f"{histogram}_sum"] - before[f"{histogram}_sum"]) / count if count else float("nan")
