"""`pagedlab serve` tried as a hostile client (serve/protocol.py): every field bounded at the door, the
body capped, prompts tokenized off the engine thread, a non-streaming client that leaves aborted, chat
templates bounded in time and size, one chunk per choice, logprobs served. Each case ends with the server
healthy and another request served as if nothing had happened. Every loop is bounded."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time

import openai
import pytest

from pagedlab import LLM, SamplingParams
from pagedlab.model import chat_template
from tests.serve.test_serve import ENGINE, Server, get, idle, wait_until

GREEDY = dict(model="tiny-shakespeare", temperature=0)


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.close()


def post(server, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    """A raw POST (the openai client would refuse to send some of these bodies)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"content-type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def still_serving(server) -> None:
    """The engine loop survived: /health is 200 and a greedy request gets its full answer."""
    assert get(server.url + "/health") == "ok"
    out = server.client.completions.create(prompt="ROMEO:", max_tokens=5, **GREEDY)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5


def error_of(server, path: str, body: dict) -> tuple[int, dict]:
    status, reply = post(server, path, json.dumps(body).encode())
    assert set(reply["error"]) == {"message", "type", "param", "code"}, reply
    return status, reply["error"]


def test_a_top_k_beyond_int64_samples_from_the_whole_vocabulary(server):
    """It once passed the door and overflowed in the sampler, inside step(): the loop died for everyone."""
    status, reply = post(server, "/v1/completions", b'{"prompt": "ROMEO:", "max_tokens": 4, "top_k": 1' + b"0" * 20
                         + b', "seed": 1}')  # fmt: skip
    assert status == 200 and reply["usage"]["completion_tokens"] == 4
    whole = server.client.completions.create(prompt="ROMEO:", max_tokens=4, seed=1, model="tiny-shakespeare")
    assert reply["choices"][0]["text"] == whole.choices[0].text  # top_k 10**20 is top_k off
    still_serving(server)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "ROMEO:", "top_k": 1e20}, "top_k"),
        ({"prompt": "ROMEO:", "seed": -1}, "seed"),
        ({"prompt": "ROMEO:", "n": 10**6}, "n"),
        ({"prompt": "ROMEO:", "logprobs": -1}, "logprobs"),
        ({"prompt": "ROMEO:", "logprobs": 10**6}, "logprobs"),
        ({"prompt": "ROMEO:", "stop_token_ids": [10**30]}, "stop_token_ids"),
        ({"prompt": "ROMEO:", "stream": "yes"}, "stream"),
        ({"prompt": "ROMEO:", "stream_options": "include_usage"}, "stream_options"),
        ({"prompt": "ROMEO:", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "ROMEO:", "cache_salt": 7}, "cache_salt"),
        ({"prompt": [10**30]}, "prompt"),
        ({"prompt": "ROMEO:", "presence_penalty": 0.5}, "presence_penalty"),  # never silently ignored
        ({"prompt": "ROMEO:", "logit_bias": {"5": 100}}, "logit_bias"),
        ({"prompt": "ROMEO:", "echo": True}, "echo"),
    ],
)
def test_every_field_is_bounded_at_the_door(server, body, param):
    status, error = error_of(server, "/v1/completions", body)
    assert status == 400 and error["param"] == param and error["type"] == "BadRequestError", error
    still_serving(server)


def test_unserved_fields_at_their_off_value_are_accepted(server):
    out = server.client.completions.create(prompt="ROMEO:", max_tokens=3, presence_penalty=0, echo=False,
                                           frequency_penalty=0.0, **GREEDY)  # fmt: skip
    assert out.usage.completion_tokens == 3


def test_stream_options_without_stream_get_vllms_message(server):
    _, error = error_of(server, "/v1/completions", {"prompt": "ROMEO:", "stream_options": {"include_usage": True}})
    assert error["message"].endswith("Stream options can only be defined when `stream=True`.")


def test_a_lone_surrogate_is_a_400_wherever_it_is(server):
    for path, body in [
        ("/v1/completions", b'{"prompt": "ROMEO \\ud800"}'),
        ("/v1/completions", b'{"prompt": "ROMEO:", "stop": ["\\udfff"]}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi \\ud800"}]}'),
    ]:
        status, reply = post(server, path, body)
        assert status == 400 and "lone surrogate" in reply["error"]["message"], reply
    still_serving(server)


def test_brackets_nested_deeper_than_python_recurses_are_a_400(server):
    status, reply = post(server, "/v1/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "not JSON" in reply["error"]["message"]


def test_a_body_over_the_cap_is_413_unread_and_the_running_stream_goes_on(server):
    stream = server.client.completions.create(prompt="GLOUCESTER:", max_tokens=40, stream=True, **GREEDY)
    first = next(iter(stream)).choices[0].text
    status, reply = post(server, "/v1/completions", json.dumps({"prompt": "R" * (2 << 20)}).encode())
    assert status == 413 and reply["error"]["code"] == 413 and "limit of 1048576" in reply["error"]["message"]
    text = first + "".join(c.choices[0].text for c in stream)
    assert text == server.client.completions.create(prompt="GLOUCESTER:", max_tokens=40, **GREEDY).choices[0].text


def test_a_prompt_too_long_is_refused_by_its_length_before_anything_is_queued(server, monkeypatch):
    """vLLM's words; a text longer than (max_model_len - 1) x the longest token is refused untokenized, and a
    prompt is never tokenized on the engine thread."""
    threads = []
    encode = server.state.tokenizer.encode
    monkeypatch.setattr(server.state.tokenizer, "encode",
                        lambda *a, **k: threads.append(threading.current_thread().name) or encode(*a, **k))  # fmt: skip
    _, error = error_of(server, "/v1/completions", {"prompt": "R" * 600_000})  # under the body cap
    assert "maximum context length is 1024 tokens" in error["message"] and "characters" in error["message"]
    assert threads == []  # refused by its length in characters: never tokenized
    _, error = error_of(server, "/v1/completions", {"prompt": "R" * 2000})
    assert "maximum context length is 1024 tokens" in error["message"] and "2001 input tokens" in error["message"]
    still_serving(server)
    assert threads and "pagedlab-engine" not in threads


def test_a_non_streaming_client_that_leaves_is_aborted(server):
    before = server.metrics()
    body = json.dumps({"prompt": "HAMLET:", "max_tokens": 900, "temperature": 0, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: server.metrics()["vllm:num_requests_running"] >= 1, seconds=10)
    wait_until(lambda: idle(server), seconds=20)
    after = wait_until(lambda: (m := server.metrics())["vllm:kv_cache_usage_perc"] == 0 and m, seconds=10)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 900


NESTED_LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
OUTPUT_BOMB = "{% for a in range(100000) %}{{ 'x' * 100000 }}{% endfor %}"


@pytest.mark.parametrize(
    "template, words",
    [
        (NESTED_LOOPS, "longer than 1 s"),
        (OUTPUT_BOMB, "exceeds"),
        ("{% set x = 'x' * 10**9 %}{{ x }}", "MiB"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ messages[0].content + 1 }}", "TypeError"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
        ("{{ (2 ** 100000) | string }}", "ValueError"),  # more digits than Python converts
        ("{% for m in messages %}", "not a valid Jinja template"),
    ],
)
def test_a_chat_template_that_misbehaves_is_a_400_and_the_server_lives(server, monkeypatch, template, words):
    monkeypatch.setattr(chat_template, "RENDER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(server.state, "chat_template", template)
    status, error = error_of(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and error["param"] == "chat_template" and words in error["message"], error
    still_serving(server)


def test_chat_templates_that_run_to_their_bound_never_delay_a_plain_completion(server, monkeypatch):
    """Renders once ran in asyncio's one pool of threads, which tokenized plain prompts too: eight templates that
    loop until their 5 s bound held every thread, and a completion that takes 0.04 s alone took about 14 s. Renders
    have threads of their own now (serve/prompts.py PromptPools): a plain completion is served while every render
    runs, and a chat request beyond those rendering and waiting is a 429 at once."""
    monkeypatch.setattr(chat_template, "RENDER_TIMEOUT_S", 2.0)
    monkeypatch.setattr(server.state, "chat_template", NESTED_LOOPS)
    pools = server.state.pools
    monkeypatch.setattr(pools, "max_renders", chat_template.RENDER_WORKERS + 2)  # two wait: a short test
    chats = min(32, (os.cpu_count() or 1) + 4) + 2  # more than asyncio's pool has threads
    finished, lock = [], threading.Lock()  # (status, error, when) of each chat request

    def chat():
        try:
            server.client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **GREEDY)
            result = (200, None)
        except openai.APIStatusError as e:
            result = (e.status_code, e.body)
        with lock:
            finished.append((*result, time.monotonic()))

    threads = [threading.Thread(target=chat) for _ in range(chats)]
    for t in threads:
        t.start()
    refused = chats - pools.max_renders
    wait_until(lambda: pools.renders == pools.max_renders and len(finished) == refused, seconds=30)
    out = server.client.completions.create(prompt="ROMEO:", max_tokens=5, **GREEDY)
    served = time.monotonic()
    for t in threads:
        t.join(60)
    assert out.usage.completion_tokens == 5
    rendered = [when for status, error, when in finished if status == 400 and "longer than 2 s" in error["message"]]
    too_many = [(error, when) for status, error, when in finished if status == 429]
    assert len(rendered) == pools.max_renders and len(too_many) == refused, finished
    assert served < min(rendered)  # the plain completion did not wait for any render
    assert max(when for _, when in too_many) < min(rendered)  # refused at once, not after a render
    assert all(e["type"] == "RateLimitError" and e["code"] == 429 and "try again" in e["message"] for e, _ in too_many)
    still_serving(server)


def test_a_rendered_chat_prompt_too_long_is_refused_by_its_length_untokenized(server, monkeypatch):
    """A template may render up to 4 Mi characters in milliseconds; tokenizing them took seconds. What cannot fit
    the context is refused by its length in characters, as a plain prompt is."""
    calls = []
    encode = server.state.tokenizer.encode
    monkeypatch.setattr(server.state.tokenizer, "encode", lambda *a, **k: calls.append(1) or encode(*a, **k))
    monkeypatch.setattr(server.state, "chat_template", "{{ 'x' * 4000000 }}")
    status, error = error_of(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and error["param"] == "messages" and calls == [], error
    assert "maximum context length is 1024 tokens" in error["message"] and "4000000 characters" in error["message"]
    still_serving(server)


def test_custom_roles_are_accepted_as_vllm_accepts_them(server):
    out = server.client.chat.completions.create(messages=[{"role": "narrator", "content": "Enter ROMEO."}],
                                                max_tokens=4, **GREEDY)  # fmt: skip
    assert out.choices[0].finish_reason == "length"


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_n_choices_stream_one_chunk_each_and_finish_once(server, chat):
    args = dict(model="tiny-shakespeare", max_tokens=12, n=3, temperature=1.0, seed=5)
    if chat:
        create, args["messages"] = server.client.chat.completions.create, [{"role": "user", "content": "Speak."}]
    else:
        create, args["prompt"] = server.client.completions.create, "JULIET:"
    whole = create(**args)
    chunks = list(create(**args, stream=True))
    assert all(len(c.choices) == 1 for c in chunks)  # vLLM: one choice per chunk
    texts, finished = {0: "", 1: "", 2: ""}, []
    for c in chunks:
        ch = c.choices[0]
        texts[ch.index] += (ch.delta.content or "") if chat else ch.text
        if ch.finish_reason is not None:
            finished.append(ch.index)
    assert sorted(finished) == [0, 1, 2]  # each finish reason exactly once
    assert texts == {c.index: (c.message.content if chat else c.text) for c in whole.choices}


def test_completion_logprobs_are_served_as_the_engine_computes_them(server):
    offline = LLM(**ENGINE).generate(["ROMEO:"], SamplingParams(max_tokens=6, temperature=0, logprobs=2),
                                     use_tqdm=False)[0].outputs[0]  # fmt: skip
    for k in (0, 2):
        out = server.client.completions.create(prompt="ROMEO:", max_tokens=6, logprobs=k, **GREEDY).choices[0]
        lp = out.logprobs
        assert "".join(lp.tokens) == out.text and lp.text_offset[0] == 0 and len(lp.token_logprobs) == 6
        assert lp.token_logprobs == pytest.approx([d[t] for d, t in zip(offline.logprobs, offline.token_ids)], abs=1e-4)
        assert all(len(top) == max(k, 1) for top in lp.top_logprobs)  # greedy: the sampled token is in the top k


def test_chat_logprobs_stream_with_their_tokens(server):
    args = dict(messages=[{"role": "user", "content": "Speak."}], max_tokens=6, logprobs=True, top_logprobs=3,
                **GREEDY)  # fmt: skip
    whole = server.client.chat.completions.create(**args).choices[0]
    entries = whole.logprobs.content
    assert len(entries) == 6 and all(len(e.top_logprobs) == 3 for e in entries)
    assert all(e.top_logprobs[0].logprob == pytest.approx(e.logprob) for e in entries)  # greedy picks the top one
    streamed = [e for c in server.client.chat.completions.create(**args, stream=True) if c.choices
                and c.choices[0].logprobs for e in c.choices[0].logprobs.content]  # fmt: skip
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in entries]
    status, error = error_of(server, "/v1/chat/completions", {"messages": args["messages"], "top_logprobs": 2})
    assert status == 400 and error["param"] == "top_logprobs"


def test_the_openai_client_sees_openais_error_for_each(server):
    with pytest.raises(openai.BadRequestError) as err:
        server.client.completions.create(prompt="ROMEO:", extra_body={"top_k": -5}, **GREEDY)
    assert err.value.body["param"] == "top_k"
