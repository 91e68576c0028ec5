"""Benchmarks: `pagedlab bench serve`, a bounded load test of `pagedlab serve` on 127.0.0.1, continuous vs static.

Builds on: serve/server.py (the server, in a thread of this process), the `openai` client (streaming),
bench/workloads.py (an Alpaca-like stream: short prompts and outputs), bench/rounds.py (taking turns).
Read with: chapters/08-online-serving.md (Measurements), the paper's Figure 12 (normalized latency vs rate).

Requests arrive as a Poisson process at each rate (seeded: the same arrival times and lengths for
both systems), each streamed by its own asyncio task through the real client:

    send --- first chunk ------ chunk -- chunk -- ... -- last chunk
         TTFT              ITL       ITL                 e2e = last - send;  normalized = e2e / output tokens

    static      stage 4: a batch is admitted when the previous one has finished; arrivals wait for it
    continuous  stage 5: every step re-forms the batch; an arrival is admitted at the next step

With `--url URL` (`pagedlab bench serve --url http://HOST:8000/v1`) the same load goes to any server that speaks
the OpenAI API instead, a real vLLM on a GPU machine included (`vllm serve MODEL`): one system, "url", no figure.
The prompts travel as token ids and every request asks for ignore_eos, both vLLM's own API.

The server keeps one engine loop; the client measures what a user sees. Both systems use the
tiled torch decode (bench/common.py: timing_llm), so the schedulers differ and nothing else.
Each (system, rate) cell runs REPEATS times in turns and reports its run with the lowest
normalized latency (other programs only ever add time); at the highest rate static batching's
queue grows without bound while continuous batching keeps up, the paper's Figure 12.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from pagedlab.bench.common import corpus_token_ids, progress, timing_llm
from pagedlab.bench.rounds import round_robin
from pagedlab.bench.workloads import sample_requests


class Remote:
    """A server somewhere else that speaks the OpenAI API: its base URL (ending in /v1) and the model to ask for."""

    def __init__(self, base_url: str, model: str | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected http://HOST:PORT/v1, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        """The first model the server lists (GET /v1/models), as vLLM's own benchmark client does."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.base_url}/models", timeout=30) as answer:
            models = json.load(answer).get("data") or []
        if not models:
            raise ValueError(f"url: {self.base_url}/models lists no model")
        return models[0]["id"]

    def close(self) -> None:
        pass


SYSTEMS = {"static": 4, "continuous": 5}
RATES = (2.0, 8.0, 32.0)  # requests per second
NUM_REQUESTS = 24
REPEATS = 2
ENGINE = {"block_size": 16, "max_num_seqs": 8, "max_model_len": 512, "num_kv_blocks": 128}
PAPER = "the paper (Figure 12): vLLM sustains 1.7-2.7x Orca's request rate, 2-4x FasterTransformer's, at equal latency"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _server(stage: int):
    """The benchmarked server: `pagedlab serve`'s app in a thread, the bundled model at one stage."""
    from pagedlab import serve

    llm = timing_llm(stage, **ENGINE)
    server = serve.ThreadedServer(serve.build_state("tiny-shakespeare", {}, llm=llm))
    server.base_url, server.model = f"{server.url}/v1", "tiny-shakespeare"
    return server


def _workload(num_requests: int, rate: float, seed: int = 0) -> list[tuple[float, list[int], int]]:
    """(send time offset, prompt token ids, output length) per request: Poisson arrivals at `rate`."""
    rng = random.Random(f"serve-{seed}-{rate}")
    corpus = corpus_token_ids(num_chars=20_000)
    t, out = 0.0, []
    for i, spec in enumerate(sample_requests("alpaca", num_requests, seed=seed, max_model_len=ENGINE["max_model_len"])):
        start = (i * 97) % (len(corpus) - spec.prompt_len)
        out.append((t, corpus[start : start + spec.prompt_len], spec.output_len))
        t += rng.expovariate(rate)
    return out


async def _one(client, model: str, offset: float, prompt: list[int], output_len: int, t0: float) -> dict:
    await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
    sent = time.perf_counter()
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=output_len, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    times = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
    return {"sent": sent, "times": times, "output_len": output_len}


async def _load(target, workload) -> tuple[list[dict], float]:
    import openai

    client = openai.AsyncOpenAI(base_url=target.base_url, api_key="none", max_retries=0, timeout=600)
    try:
        t0 = time.perf_counter() + 0.05
        sends = (_one(client, target.model, *w, t0) for w in workload)
        runs = await asyncio.wait_for(asyncio.gather(*sends), timeout=600)
        return runs, time.perf_counter() - t0
    finally:
        await client.close()


def serve_run(server, system: str, rate: float, num_requests: int) -> dict:
    """One load test against a running server (one with base_url and model): the row of (system, rate)."""
    runs, wall = asyncio.run(_load(server, _workload(num_requests, rate)))
    ttft = [r["times"][0] - r["sent"] for r in runs if r["times"]]
    itl = [b - a for r in runs for a, b in zip(r["times"], r["times"][1:])]
    normalized = [(r["times"][-1] - r["sent"]) / r["output_len"] for r in runs if r["times"]]
    tokens = sum(r["output_len"] for r in runs)
    return {
        "system": system,
        "request_rate": rate,
        "num_requests": num_requests,
        "tokens_per_s": tokens / wall,
        "requests_per_s": num_requests / wall,
        "normalized_latency_s": statistics.fmean(normalized),
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p90_s": percentile(ttft, 0.9),
        "ttft_p99_s": percentile(ttft, 0.99),
        "itl_p50_s": percentile(itl, 0.5),
        "itl_p90_s": percentile(itl, 0.9),
        "itl_p99_s": percentile(itl, 0.99),
        "wall_s": wall,
    }


def serve_rows(
    console,
    rates=RATES,
    num_requests: int = NUM_REQUESTS,
    repeats: int = REPEATS,
    url: str | None = None,
    model: str | None = None,
) -> list[dict]:
    """Rows per (system, rate): pagedlab's two servers on 127.0.0.1, or the one at `url` (system "url")."""
    if url is None and model is not None:
        raise ValueError("model: names the model of the server at --url; pagedlab's own serve the bundled one")
    servers = {"url": Remote(url, model)} if url else {name: _server(stage) for name, stage in SYSTEMS.items()}
    try:
        jobs = {
            f"{name}@{rate:g}": (lambda n=name, r=rate: serve_run(servers[n], n, r, num_requests))
            for rate in rates
            for name in servers
        }
        with progress(console, repeats * len(jobs), "serve") as tick:

            def announce(job, i):
                console.print(f"[dim]round {i}: {job}[/dim]")
                tick(f"round {i}, {job}")

            results = round_robin(jobs, repeats, announce)
    finally:
        for server in servers.values():
            server.close()
    rows = []
    for runs in results.values():
        best = min(runs, key=lambda r: r["normalized_latency_s"])
        rows.append(dict(best, runs=len(runs)))
    return rows
