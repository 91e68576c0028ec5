"""Every bad input is a ValueError whose message starts with the field at fault, raised before any work.

One table per door: sampling params, engine settings, a request, the LLM calls. Each row is one input a user
(or a server relaying a client) could really send; the table is the list the hardening issue asked for, plus
the rest of the same kind found while fixing it. The last test throws every request-level row at an engine
while two good requests run, and checks that they finish exactly as if nothing had happened.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from pagedlab import LLM, BeamSearchParams, SamplingParams

pytestmark = pytest.mark.stage1

NAN, INF = math.nan, math.inf


def _raises_naming(field: str, call, match: str = ""):
    """call() raises a ValueError whose message starts with `field` (and contains `match`)."""
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert message.startswith(field), f"{message!r} does not start with {field!r}"
    assert re.search(match, message), f"{message!r} does not match {match!r}"
    return message


SAMPLING = [
    ({"n": 0}, "n"),
    ({"n": True}, "n"),
    ({"n": 1.5}, "n"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": NAN}, "temperature"),
    ({"temperature": INF}, "temperature"),
    ({"temperature": -INF}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": NAN}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"seed": -1}, "seed"),
    ({"seed": "abc"}, "seed"),
    ({"logprobs": -2}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"stop": 123}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["ok", 5]}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": [-3]}, "stop_token_ids"),
    ({"stop_token_ids": ["2"]}, "stop_token_ids"),
    ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"ignore_eos": "no"}, "ignore_eos"),
]


@pytest.mark.parametrize("kwargs, field", SAMPLING, ids=[f"{k}={v!r}" for kw, _ in SAMPLING for k, v in kw.items()])
def test_sampling_params(kwargs, field):
    _raises_naming(f"SamplingParams.{field}", lambda: SamplingParams(**kwargs))


BEAM = [
    ({"beam_width": 0}, "beam_width"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"length_penalty": NAN}, "length_penalty"),
    ({"length_penalty": INF}, "length_penalty"),
    ({"length_penalty": "long"}, "length_penalty"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
]


@pytest.mark.parametrize("kwargs, field", BEAM)
def test_beam_search_params(kwargs, field):
    base = {"beam_width": 2, "max_tokens": 4} | kwargs
    _raises_naming(f"BeamSearchParams.{field}", lambda: BeamSearchParams(**base))


def test_temperature_thresholds_are_vllms():
    assert SamplingParams(temperature=1e-310).greedy and SamplingParams(temperature=9e-6).greedy  # below 1e-5
    with pytest.warns(UserWarning, match="raised to 0.01"):
        assert SamplingParams(temperature=1e-4).temperature == 0.01  # would overflow the softmax
    assert not SamplingParams(temperature=0.02).greedy


# Engine settings: LLM(**kwargs). The stage is 5 unless a row says otherwise (every field is in use there).
SETTINGS = [
    ({"seed": "abc"}, "seed", "integer"),
    ({"seed": -1}, "seed", ">= 0"),
    ({"device": "tpu0"}, "device", "not a torch device"),
    ({"device": "meta"}, "device", "not supported"),
    ({"device": 5}, "device", "a string"),
    ({"long_prefill_token_threshold": 3.5}, "long_prefill_token_threshold", "an integer"),
    ({"enable_prefix_caching": "no"}, "enable_prefix_caching", "True or False"),
    ({"record_trace": "false"}, "record_trace", "True or False"),
    ({"debug_checks": 1}, "debug_checks", "True or False"),
    ({"block_size": True}, "block_size", "an integer"),
    ({"max_num_seqs": 2.0}, "max_num_seqs", "an integer"),
    ({"dtype": 5}, "dtype", ""),
    ({"dtype": ["float32"]}, "dtype", ""),
    ({"max_logprobs": -2}, "max_logprobs", ""),
    ({"max_trace_steps": 0}, "max_trace_steps", "positive"),
    ({"max_trace_steps": 10**30}, "max_trace_steps", "at most"),
    ({"preemption_mode": "drop"}, "preemption_mode", "not one of"),
    ({"blocksize": 8}, "blocksize", "not an engine setting"),
    ({"num_kv_blocks": 10**7}, "num_kv_blocks", r"GiB.*available"),
    ({"block_size": 10**7}, "block_size", r"exceed max_model_len .* GiB of KV"),
    ({"preemption_mode": "swap", "num_swap_blocks": 10**8}, "num_swap_blocks", r"GiB.*available"),
    ({"max_num_seqs": 10**9, "max_num_batched_tokens": 10**9}, "max_num_seqs", r"block tables take .*GiB"),
]


@pytest.mark.parametrize(
    "kwargs, field, match", SETTINGS, ids=[f"{f}={list(kw.values())[-1]!r}" for kw, f, _ in SETTINGS]
)
def test_engine_settings(kwargs, field, match):
    _raises_naming(field, lambda: LLM(stage=5, **kwargs), match)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda():
    _raises_naming("device", lambda: LLM(device="cuda"), "no usable CUDA device")


@pytest.mark.parametrize("model", [None, "", 123, "no/such/folder"])
def test_model_argument(model):
    _raises_naming("model", lambda: LLM(model=model))


@pytest.fixture(scope="module")
def llm():
    """Stage 5 with every request option in use: priorities, cache salts, a small seat count."""
    return LLM(stage=5, max_num_seqs=4, block_size=4, scheduling_policy="priority", debug_checks=True)


# Requests: engine.add_request(request_id, prompt, params, **options). "live" is a request already running.
REQUESTS = [
    ("unhashable id", (["x"], "ROMEO:", None), {}, "request_id"),
    ("int id", (5, "ROMEO:", None), {}, "request_id"),
    ("empty id", ("", "ROMEO:", None), {}, "request_id"),
    ("duplicate id", ("live", "ROMEO:", None), {}, "request_id"),
    ("id of a live beam search", ("live-beam", "ROMEO:", None), {}, "request_id"),
    ("id of a live child", ("0_live-n", "ROMEO:", None), {}, "request_id"),
    ("children would collide", ("n-host", "ROMEO:", SamplingParams(n=2)), {}, "request_id"),
    ("id of a live beam", ("live-beam-beam0", "ROMEO:", None), {}, "request_id"),
    ("params not SamplingParams", ("r", "ROMEO:", "greedy"), {}, "params"),
    ("beam params to add_request", ("r", "ROMEO:", BeamSearchParams(beam_width=2, max_tokens=2)), {}, "params"),
    ("logprobs above max_logprobs", ("r", "ROMEO:", SamplingParams(logprobs=21)), {}, "logprobs"),
    ("logprobs of the whole vocabulary", ("r", "ROMEO:", SamplingParams(logprobs=-1)), {}, "logprobs"),
    (
        "stop token outside the vocabulary",
        ("r", "ROMEO:", SamplingParams(stop_token_ids=[10**6])),
        {},
        "stop_token_ids",
    ),
    ("n of a million", ("r", "ROMEO:", SamplingParams(n=10**6)), {}, "n"),
    ("arrival_time a string", ("r", "ROMEO:", None), {"arrival_time": "soon"}, "arrival_time"),
    ("arrival_time NaN", ("r", "ROMEO:", None), {"arrival_time": NAN}, "arrival_time"),
    ("arrival_time infinite", ("r", "ROMEO:", None), {"arrival_time": INF}, "arrival_time"),
    ("priority a string", ("r", "ROMEO:", None), {"priority": "high"}, "priority"),
    ("priority a float", ("r", "ROMEO:", None), {"priority": 1.5}, "priority"),
    ("priority a bool", ("r", "ROMEO:", None), {"priority": True}, "priority"),
    ("cache_salt an int", ("r", "ROMEO:", None), {"cache_salt": 5}, "cache_salt"),
    ("empty prompt", ("r", "", None), {}, "prompt"),
    ("empty token list", ("r", [], None), {}, "prompt"),
    ("a float prompt", ("r", 3.5, None), {}, "prompt"),
    ("a bool token", ("r", [5, True], None), {}, "prompt"),
    ("a negative token", ("r", [-1], None), {}, "prompt"),
    ("a token outside the vocabulary", ("r", [5, 99999], None), {}, "prompt"),
    ("a prompt longer than max_model_len", ("r", "x" * 2000, None), {}, "prompt"),
]


def _with_live_requests(llm):
    """Four groups that stay live for 40 steps (longer than the table): some run, some wait for a seat."""
    engine, long = llm.engine, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.add_request("live", "ROMEO:", long)
    engine.add_request(
        "live-n", "JULIET:", SamplingParams(temperature=0.8, seed=3, max_tokens=40, n=2, ignore_eos=True)
    )
    engine.add_request("0_n-host", "HAMLET:", long)
    engine.add_beam_request("live-beam", "KING:", BeamSearchParams(beam_width=2, max_tokens=40, ignore_eos=True))
    engine.step()


def _finish(engine) -> dict:
    outs = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        outs |= {o.request_id: o for o in engine.step() if o.finished}
    return outs


@pytest.mark.parametrize("label, args, options, field", REQUESTS, ids=[r[0] for r in REQUESTS])
def test_requests(llm, label, args, options, field):
    _with_live_requests(llm)
    engine = llm.engine
    before = (dict(engine.scheduler.requests.live), list(engine.scheduler.waiting), list(engine.scheduler.running))
    try:
        _raises_naming(field, lambda: engine.add_request(*args, **options))
        now = (engine.scheduler.requests.live, list(engine.scheduler.waiting), engine.scheduler.running)
        assert now == before, "state changed"
    finally:
        _finish(llm.engine)
        llm.engine.beam_outputs.clear()


BEAM_REQUESTS = [
    ("sampling params to beam_search", SamplingParams(), "params"),
    ("beam_width above max_num_seqs", BeamSearchParams(beam_width=5, max_tokens=2), "beam_width"),
]


@pytest.mark.parametrize("label, params, field", BEAM_REQUESTS, ids=[r[0] for r in BEAM_REQUESTS])
def test_beam_requests(llm, label, params, field):
    _raises_naming(field, lambda: llm.beam_search(["ROMEO:"], params))


def test_beam_width_must_fit_max_logprobs():
    roomy = LLM(stage=5, max_num_seqs=16)
    _raises_naming("beam_width", lambda: roomy.beam_search(["ROMEO:"], BeamSearchParams(beam_width=11, max_tokens=2)))
    assert LLM(stage=5, max_num_seqs=16, max_logprobs=22).beam_search(
        ["A:"], BeamSearchParams(beam_width=11, max_tokens=2)
    )


def test_a_beam_search_cannot_take_a_live_beams_namespace(llm):
    llm.engine.add_request("s-beam3", "ROMEO:", SamplingParams(max_tokens=2))
    _raises_naming("request_id", lambda: llm.engine.add_beam_request("s", "JULIET:", BeamSearchParams(2, 2)))
    _finish(llm.engine)


CALLS = [
    ("prompts None", lambda llm: llm.generate(None), "prompts"),
    ("prompts a number", lambda llm: llm.generate(5), "prompts"),
    (
        "params for the wrong number of prompts",
        lambda llm: llm.generate(["A:", "B:"], [SamplingParams()] * 3),
        "sampling_params",
    ),
    ("priorities for the wrong number of prompts", lambda llm: llm.generate(["A:", "B:"], priority=[0]), "priority"),
    ("abort with a number", lambda llm: llm.engine.abort_request(5), "request_id"),
    ("abort with a list of numbers", lambda llm: llm.engine.abort_request([1, 2]), "request_id"),
]


@pytest.mark.parametrize("label, call, field", CALLS, ids=[r[0] for r in CALLS])
def test_calls(llm, label, call, field):
    _raises_naming(field, lambda: call(llm))
    assert not llm.engine.has_unfinished_requests()


def test_every_bad_request_leaves_the_running_ones_exactly_as_they_were(llm):
    """The running requests' tokens do not change when every bad request above is refused between steps."""
    expected = _finish_alone(llm)
    _with_live_requests(llm)
    for _, args, options, _ in REQUESTS:
        with pytest.raises(ValueError):
            llm.engine.add_request(*args, **options)
        llm.engine.step()
    outs = _finish(llm.engine)
    assert {k: [c.token_ids for c in o.outputs] for k, o in outs.items()} == expected
    assert llm.engine.beam_outputs.pop("live-beam").sequences
    assert llm.engine.kv_manager.num_used_blocks == 0 and not llm.engine.scheduler.requests.live


def _finish_alone(llm) -> dict:
    _with_live_requests(llm)
    outs = _finish(llm.engine)
    llm.engine.beam_outputs.clear()
    return {k: [c.token_ids for c in o.outputs] for k, o in outs.items()}


def test_stop_strings_need_a_tokenizer(tiny_model_dir):
    llm = LLM(model=str(tiny_model_dir), stage=5)  # no tokenizer.json: token-id prompts only
    _raises_naming("stop", lambda: llm.engine.add_request("r", [3, 4, 5], SamplingParams(stop="\n")))
    _raises_naming("prompt", lambda: llm.engine.add_request("r", "ROMEO:", SamplingParams()))
