"""`pagedlab serve` driven by the real `openai` client on 127.0.0.1: streaming equals the full answer, many
clients at once, a client that leaves mid-stream frees its request, /metrics is Prometheus text with vLLM's
names, bad requests are 400 and disturb nobody, SIGTERM stops it cleanly. Every loop is bounded."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pagedlab import SamplingParams, serve
from tests.conftest import need_smollm2

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
ENGINE = {"stage": 5, "block_size": 4, "num_kv_blocks": 256, "max_num_seqs": 8, "scheduling_policy": "priority"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, seconds: float = 20.0, every: float = 0.05):
    """Poll `predicate` until it returns something true, at most `seconds`; return it (or fail)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"not true within {seconds} s: {predicate}")


def get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode() or "ok"
    except OSError:
        return ""


class Server(serve.ThreadedServer):
    """A pagedlab server in a thread of this process (serve/server.py), with a real openai client."""

    def __init__(self, model: str = "tiny-shakespeare", chat_template: str | None = CHAT_TEMPLATE, **engine):
        super().__init__(serve.build_state(model, engine or ENGINE, chat_template=chat_template))
        wait_until(lambda: get(self.url + "/health"))
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def idle(server: Server) -> bool:
    m = server.metrics()
    return m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0


def test_models_and_health(server):
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["tiny-shakespeare"]
    assert get(server.url + "/health") == "ok"


def test_streamed_text_equals_the_full_completion(server):
    args = dict(model="tiny-shakespeare", prompt="ROMEO:", max_tokens=24, temperature=0)
    full = server.client.completions.create(**args)
    chunks = list(server.client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text and len(text) > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 24
    assert full.usage.prompt_tokens == 7 and full.usage.total_tokens == 31


def test_chat_streams_what_it_answers_whole(server):
    args = dict(model="tiny-shakespeare", messages=[{"role": "user", "content": "Speak."}], max_tokens=16,
                temperature=0)  # fmt: skip
    full = server.client.chat.completions.create(**args)
    chunks = list(server.client.chat.completions.create(**args, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == full.choices[0].message.content and full.choices[0].message.role == "assistant"
    assert full.object == "chat.completion" and chunks[-1].choices[0].finish_reason == "length"


def test_n_completions_come_back_as_choices(server):
    out = server.client.completions.create(model="tiny-shakespeare", prompt="JULIET:", max_tokens=8, n=3,
                                           temperature=1.0, seed=3)  # fmt: skip
    assert [c.index for c in out.choices] == [0, 1, 2] and out.usage.completion_tokens == 24


def test_sixteen_concurrent_streaming_clients_all_complete(server):
    async def one(client, i):
        stream = await client.completions.create(model="tiny-shakespeare", prompt=f"KING {i}:", max_tokens=20,
                                                 temperature=0, stream=True)  # fmt: skip
        text, reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(16))), timeout=120)
        finally:
            await client.close()

    results = asyncio.run(main())
    assert len(results) == 16 and all(reason == "length" and text for text, reason in results)
    alone = server.client.completions.create(model="tiny-shakespeare", prompt="KING 5:", max_tokens=20, temperature=0)
    assert results[5][0] == alone.choices[0].text  # batching changed nobody's tokens
    wait_until(lambda: idle(server))


def test_a_client_that_leaves_mid_stream_frees_its_request(server):
    before = server.metrics()
    stream = server.client.completions.create(model="tiny-shakespeare", prompt="HAMLET:", max_tokens=900,
                                              temperature=0, stream=True)  # fmt: skip
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()  # after 3 chunks
    wait_until(lambda: idle(server), seconds=10)
    after = wait_until(lambda: (m := server.metrics())["vllm:kv_cache_usage_perc"] == 0 and m, seconds=10)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 900


def test_metrics_are_prometheus_text_with_vllms_names(server):
    server.client.completions.create(model="tiny-shakespeare", prompt="ROMEO:", max_tokens=4)
    families = {f.name: f for f in text_string_to_metric_families(get(server.url + "/metrics"))}
    for name, kind in [
        ("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prefix_cache_queries", "counter"),
        ("vllm:prefix_cache_hits", "counter"), ("vllm:num_preemptions", "counter"),
        ("vllm:prompt_tokens", "counter"), ("vllm:generation_tokens", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"), ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"), ("vllm:request_success", "counter"),
    ]:  # fmt: skip
        assert families[name].type == kind, name
        assert all(s.labels.get("model_name") == "tiny-shakespeare" for s in families[name].samples)
    m = server.metrics()
    assert m["vllm:time_to_first_token_seconds_count"] >= 1 and m["vllm:generation_tokens_total"] >= 4


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "ROMEO:", "temperature": -1}, "temperature"),
        ({"prompt": "ROMEO:", "top_p": 2}, "top_p"),
        ({"prompt": "ROMEO:", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "ROMEO:", "model": "gpt-9"}, "model"),
        ({"prompt": "R" * 5000}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "ROMEO:", "priority": "high"}, "priority"),
        ({"prompt": "ROMEO:", "logprobs": -1}, "logprobs"),
    ],
)
def test_a_bad_request_is_400_with_openais_error_and_disturbs_nobody(server, body, param):
    long = server.client.completions.create(model="tiny-shakespeare", prompt="GLOUCESTER:", max_tokens=60,
                                            temperature=0, stream=True)  # fmt: skip
    first = next(iter(long)).choices[0].text  # running while the bad request arrives
    extra = {k: body[k] for k in ("priority",) if k in body}  # vLLM's extra fields go in the body as they are
    args = {k: v for k, v in body.items() if k not in extra}
    with pytest.raises(openai.BadRequestError) as err:
        server.client.completions.create(**{"model": "tiny-shakespeare", **args}, extra_body=extra)
    assert err.value.status_code == 400 and err.value.body["param"] == param and err.value.body["type"]
    text = first + "".join(c.choices[0].text for c in long)
    alone = server.client.completions.create(model="tiny-shakespeare", prompt="GLOUCESTER:", max_tokens=60,
                                             temperature=0)  # fmt: skip
    assert text == alone.choices[0].text
    assert get(server.url + "/health") == "ok"


def test_a_body_that_is_not_json_is_400(server):
    req = urllib.request.Request(server.url + "/v1/completions", data=b"{not json", method="POST",
                                 headers={"content-type": "application/json"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400 and b"not JSON" in err.value.read()


def test_cache_salt_and_priority_are_accepted_as_vllm_accepts_them(server):
    prompt = "First Citizen:\nBefore we proceed any further, hear me speak."  # several blocks of 4
    hits = lambda: server.metrics()["vllm:prefix_cache_hits_total"]  # noqa: E731
    create = server.client.completions.create
    create(model="tiny-shakespeare", prompt=prompt, max_tokens=2, extra_body={"cache_salt": "tenant-a"})
    base = hits()
    create(model="tiny-shakespeare", prompt=prompt, max_tokens=2, extra_body={"cache_salt": "tenant-b", "priority": 1})
    assert hits() == base  # another tenant's salt: no hit
    create(model="tiny-shakespeare", prompt=prompt, max_tokens=2, extra_body={"cache_salt": "tenant-a", "priority": -1})
    assert hits() > base


def test_explain_metrics_says_why_the_hit_rate_is_low(server):
    run = subprocess.run(
        [sys.executable, "-m", "pagedlab", "serve", "--explain-metrics", "--url", server.url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0 and "prefix cache:" in run.stdout and "full blocks of 4 tokens" in run.stdout


def test_the_live_view_draws_the_servers_steps():
    from rich.console import Console

    state = serve.build_state("tiny-shakespeare", dict(ENGINE, record_trace=True, max_trace_steps=16))
    try:
        view = serve.LiveView(console=Console(record=True, width=80, file=open(os.devnull, "w")))

        async def run():
            outputs = state.engine.generate("r1", "ROMEO:", SamplingParams(max_tokens=30, ignore_eos=True))
            async for _ in outputs:
                view.console.print(view.frame(state.engine))
                break
            await outputs.aclose()  # leaves: the request is aborted

        asyncio.run(run())
        text = view.console.export_text()
        assert "serving at stage 5" in text and "KV pool" in text and "r1" in text
    finally:
        state.engine.shutdown()


def test_sigterm_stops_the_server_cleanly():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedlab", "serve", "--port", str(port), "--max-num-seqs", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/health"), seconds=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read().decode()
    assert "Traceback" not in out and "stopped by SIGTERM" in out


def test_smollm2_chat_streams_its_answer():
    folder = need_smollm2()
    s = Server(str(folder), chat_template=None, stage=5, max_num_seqs=2)
    try:
        args = dict(model=s.state.model_name, messages=[{"role": "user", "content": "What is the capital of France?"}],
                    max_tokens=8, temperature=0)  # fmt: skip
        full = s.client.chat.completions.create(**args)
        text = "".join(c.choices[0].delta.content or "" for c in s.client.chat.completions.create(**args, stream=True))
        assert text == full.choices[0].message.content and "Paris" in text
    finally:
        s.close()
