"""The server's /metrics in Prometheus text with vLLM's metric names, and the prefix-cache hit rate in words.

Builds on: engine/async_engine.py (ServingStats, the latency observer).
Read with: chapters/08-online-serving.md (Metrics).

    vllm:num_requests_running         gauge     requests in the running batch
    vllm:num_requests_waiting         gauge     requests queued (preempted ones included)
    vllm:kv_cache_usage_perc          gauge     share of the KV pool held, 0..1 (as vLLM, despite the name)
    vllm:prefix_cache_queries_total   counter   prompt tokens looked up in the prefix cache
    vllm:prefix_cache_hits_total      counter   of those, tokens found cached
    vllm:num_preemptions_total        counter
    vllm:prompt_tokens_total          counter   prompt tokens of requests that produced a first token
    vllm:generation_tokens_total      counter
    vllm:request_success_total        counter   finished requests, by finished_reason
    vllm:time_to_first_token_seconds  histogram
    vllm:inter_token_latency_seconds  histogram
    vllm:e2e_request_latency_seconds  histogram

Every series carries `model_name`, as vLLM's do. vLLM: vllm/v1/metrics/loggers.py (PrometheusStatLogger).
"""

from __future__ import annotations

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class MetricsExporter:
    """One registry per server: gauges and counters read from the engine's stats at each scrape,
    histograms fed by the engine thread as each latency is measured."""

    def __init__(self, engine, model_name: str):
        from prometheus_client import CollectorRegistry, Histogram

        self.engine, self.model_name = engine, model_name
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.histograms = {
            "ttft": Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=self.registry),
            "itl": Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             labels, buckets=ITL_BUCKETS, registry=self.registry),
            "e2e": Histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=self.registry),
        }  # fmt: skip
        self.registry.register(_StatsCollector(self))
        engine.observe = self._observe

    def _observe(self, name: str, seconds: float) -> None:
        self.histograms[name].labels(self.model_name).observe(seconds)

    def render(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


class _StatsCollector:
    """The gauges and counters, as the engine thread last left them (read under its lock)."""

    def __init__(self, exporter: MetricsExporter):
        self.exporter = exporter

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        engine, name = self.exporter.engine, self.exporter.model_name
        with engine.lock:
            s = engine.stats
            values = dict(vars(s), finished=dict(s.finished))
        gauges = [
            ("vllm:num_requests_running", "Number of requests in model execution batches.", values["running"]),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", values["waiting"]),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", values["kv_usage"]),
        ]
        for metric, doc, value in gauges:
            family = GaugeMetricFamily(metric, doc, labels=["model_name"])
            family.add_metric([name], value)
            yield family
        counters = [
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             values["prefix_cache_queries"]),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             values["prefix_cache_hits"]),
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", values["preemptions"]),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", values["prompt_tokens"]),
            ("vllm:generation_tokens", "Number of generation tokens processed.", values["generation_tokens"]),
        ]  # fmt: skip
        for metric, doc, value in counters:
            family = CounterMetricFamily(metric, doc, labels=["model_name"])
            family.add_metric([name], value)
            yield family
        doc = "Count of successfully processed requests."
        success = CounterMetricFamily("vllm:request_success", doc, labels=["model_name", "finished_reason"])
        for reason in ("stop", "length", "abort"):
            success.add_metric([name, reason], values["finished"].get(reason, 0))
        yield success


def explain_hit_rate(engine, exporter: MetricsExporter | None = None) -> str:
    """Why the prefix-cache hit rate is what it is, in a few sentences a learner can act on."""
    llm_engine = engine.engine
    config = llm_engine.config
    with engine.lock:
        queries, hits = engine.stats.prefix_cache_queries, engine.stats.prefix_cache_hits
        usage, preemptions = engine.stats.kv_usage, engine.stats.preemptions
    lines = [f"prefix cache: {hits} of {queries} prompt tokens hit ({hits / queries:.0%})." if queries else
             "prefix cache: no prompt has been looked up yet."]  # fmt: skip
    bs = config.block_size
    if config.stage < 4 or not config.enable_prefix_caching:
        why = "stage below 4" if config.stage < 4 else "enable_prefix_caching=False"
        lines.append(f"Prefix caching is off here ({why}): every prompt token is computed. Serve at stage 4 or later.")
        return "\n".join(lines)
    lines.append(
        f"Only full blocks of {bs} tokens are cached, and only a run of them from the prompt's first token: two "
        f"prompts share a cached block only if their first {bs}, {2 * bs}, ... tokens are identical, token for token."
    )
    shared = getattr(engine, "longest_shared_prefix", None)
    if shared is not None and queries:
        if shared < bs:
            lines.append(
                f"The longest prefix any two prompts here share is {shared} tokens, shorter than one block ({bs}): "
                f"nothing can hit. Shared prefixes shorter than one block cannot be cached; put the common part "
                f"(system prompt, few-shot examples) first and make it at least {bs} tokens, or serve with a smaller "
                f"--block-size."
            )
        else:
            lines.append(f"The longest prefix two prompts here share is {shared} tokens ({shared // bs} full blocks).")
    lines.append(
        "A prompt's last token is always computed, even on a full hit (its logits are needed), so a prompt of "
        "exactly k blocks can hit at most k - 1 of them."
    )
    lines.append("Requests with different cache_salt never share blocks, by design (tenant isolation).")
    if preemptions or usage > 0.9:
        lines.append(
            f"The pool is under pressure ({usage:.0%} held, {preemptions} preemptions): cached blocks that nobody "
            "holds are evicted, least recently used first, before a later prompt could hit them."
        )
    return "\n".join(lines)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {sample name: value}: counters, gauges, histogram _sum and _count (buckets and
    per-reason counts left out), for notebooks and tests that read a running server's numbers."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels and "finished_reason" not in sample.labels:
                samples[sample.name] = sample.value
    return samples


def mean_between(before: dict[str, float], after: dict[str, float], histogram: str) -> float:
    """The mean of a histogram's observations made between two /metrics readings (its _sum / _count deltas)."""
    count = after[f"{histogram}_count"] - before[f"{histogram}_count"]
    return (after[f"{histogram}_sum"] - before[f"{histogram}_sum"]) / count if count else float("nan")
