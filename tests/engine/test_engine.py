"""Stage 1 engine behaviour through the public API: sampling, n > 1, stops, bad input, abort."""

from __future__ import annotations

import pytest

from pagedlab import LLM, BeamSearchParams, SamplingParams, oracle
from tests.equivalence import assert_matches_oracle

pytestmark = pytest.mark.stage1


@pytest.fixture(scope="module")
def llm():
    return LLM(stage=1, max_num_seqs=4, debug_checks=True)


def run_all(engine):
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
    return outs


def test_outputs_come_back_in_prompt_order(llm):
    prompts = ["B:", "A:\nSir", "ROMEO:", "C:", "D:", "E:"]  # more than max_num_seqs: two batches
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    assert all(o.finished and len(o.outputs) == 1 for o in outs)


def test_token_id_prompts_and_a_list_of_params(llm):
    ids = llm.get_tokenizer().encode("JULIET:")
    outs = llm.generate(
        [ids, ids],
        [SamplingParams(temperature=0, max_tokens=3), SamplingParams(temperature=0, max_tokens=6)],
        use_tqdm=False,
    )
    assert outs[0].prompt is None and outs[0].prompt_token_ids == ids
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 6]
    assert outs[1].outputs[0].token_ids[:3] == outs[0].outputs[0].token_ids


def test_seeded_sampling_does_not_depend_on_the_batch(llm):
    p = SamplingParams(temperature=1.0, max_tokens=20, seed=11)
    alone = llm.generate("ROMEO:", p, use_tqdm=False)[0].outputs[0].token_ids
    crowd = llm.generate(
        ["JULIET:", "ROMEO:", "HAMLET:"],
        [SamplingParams(temperature=0.9, max_tokens=30), p, SamplingParams(max_tokens=7)],
        use_tqdm=False,
    )
    assert crowd[1].outputs[0].token_ids == alone
    m = llm.loaded
    ref = oracle.generate(m.model, m.tokenizer.encode("ROMEO:"), p, m.config.eos_token_ids)
    assert_matches_oracle(alone, ref, "seeded sample vs oracle")


def test_n_children_use_seed_plus_i(llm):
    out = llm.generate("ROMEO:", SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=5), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    singles = [
        llm.generate("ROMEO:", SamplingParams(temperature=1.0, max_tokens=12, seed=5 + i), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
        for i in range(3)
    ]
    assert [c.token_ids for c in out.outputs] == singles
    assert len({tuple(t) for t in singles}) > 1


def test_stop_string_is_cut_from_text_but_its_tokens_stay(llm):
    free = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)[0].outputs[0]
    assert "seat" in free.text
    out = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=40, stop="seat"), use_tqdm=False)[0]
    c = out.outputs[0]
    assert c.finish_reason == "stop" and c.text == free.text[: free.text.index("seat")]
    assert c.token_ids == free.token_ids[: len(c.token_ids)]
    assert llm.get_tokenizer().decode(c.token_ids).endswith("seat")


def test_eos_is_in_token_ids_not_in_text(llm):
    out = llm.generate("JULIET:", SamplingParams(temperature=0, max_tokens=400), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == 1  # <eos>
    assert "<eos>" not in out.text and len(out.text) == len(out.token_ids) - 1


def test_stop_token_ids_and_logprobs(llm):
    free = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0].outputs[0]
    stop_id = free.token_ids[4]
    out = llm.generate(
        "ROMEO:", SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_id], logprobs=2), use_tqdm=False
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == stop_id
    assert len(out.logprobs) == len(out.token_ids)
    assert all(t in lp and len(lp) <= 3 for t, lp in zip(out.token_ids, out.logprobs))
    assert out.cumulative_logprob == pytest.approx(sum(lp[t] for t, lp in zip(out.token_ids, out.logprobs)))


def test_max_model_len_caps_the_output():
    llm = LLM(stage=1, max_num_seqs=2, max_model_len=32)
    out = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=100, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 32
    assert out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize(
    "prompt, params, kwargs, message",
    [
        ("", None, {}, "prompt: empty prompt"),
        ([], None, {}, "prompt: empty prompt"),
        ("x" * 2000, None, {}, "prompt: This model.s maximum context length is 1024 tokens"),
        ([5, 99999], None, {}, "prompt: token id 99999 is outside the vocabulary"),
        (3.5, None, {}, "prompt: expected str or list"),
        ("ROMEO:", "greedy", {}, "params: expected SamplingParams"),
        ("ROMEO:", SamplingParams(n=64), {}, "n: 64 children exceed max_num_seqs"),
        ("ROMEO:", None, {"priority": 2}, "priority: 2 needs a policy that orders by priority"),
        ("ROMEO:", None, {"cache_salt": "tenant-a"}, "cache_salt: needs prefix caching"),
    ],
)
def test_bad_requests_are_refused_and_running_ones_carry_on(llm, prompt, params, kwargs, message):
    engine = llm.engine
    good = SamplingParams(temperature=0, max_tokens=12)
    expected = llm.generate(["ROMEO:", "JULIET:"], good, use_tqdm=False)
    engine.add_request("good-1", "ROMEO:", good)
    engine.add_request("good-2", "JULIET:", good)
    engine.step()  # the good requests are running
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", prompt, params, **kwargs)
    outs = run_all(engine)
    assert outs["good-1"].outputs[0].token_ids == expected[0].outputs[0].token_ids
    assert outs["good-2"].outputs[0].token_ids == expected[1].outputs[0].token_ids
    assert "bad" not in outs and engine.kv_manager.num_used_blocks == 0


def test_duplicate_request_id(llm):
    llm.engine.add_request("dup", "ROMEO:", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="request_id: 'dup' is already running"):
        llm.engine.add_request("dup", "ROMEO:", SamplingParams(max_tokens=2))
    run_all(llm.engine)


def test_a_request_that_never_fits_the_pool():
    llm = LLM(stage=1, max_model_len=256, num_kv_blocks=20, max_num_seqs=4)  # a region is 16 blocks
    with pytest.raises(ValueError, match="num_kv_blocks: 20 blocks can never hold"):
        llm.engine.add_request("r", "ROMEO:", SamplingParams(n=2))


def test_abort_frees_the_kv_and_reports_abort(llm):
    engine = llm.engine
    engine.add_request("keep", "ROMEO:", SamplingParams(temperature=0, max_tokens=8))
    engine.add_request("stop-me", "JULIET:", SamplingParams(temperature=0, max_tokens=50, n=2))
    engine.step()
    used = engine.kv_manager.num_used_blocks
    engine.abort_request("stop-me")
    assert engine.kv_manager.num_used_blocks == used - 2 * engine.kv_manager.region_size
    outs = run_all(engine)
    assert [c.finish_reason for c in outs["stop-me"].outputs] == ["abort", "abort"]
    assert outs["keep"].outputs[0].finish_reason == "length"
    assert engine.kv_manager.num_used_blocks == 0


def test_stats_and_trace():
    llm = LLM(stage=1, max_num_seqs=2, record_trace=True)
    llm.generate(["A:", "B:", "C:"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    s = llm.engine.stats
    assert s.num_generated_tokens == 12 and s.num_steps == 8  # two static batches of 4 steps
    assert s.peak_kv_blocks_used == 2 * llm.engine.kv_manager.region_size and s.kv_usage == 0
    assert 0 <= s.overhead_share < 1
    first = llm.engine.trace[0]
    assert first.running == ["0", "1"] and first.waiting == ["2"]
    assert first.kv_held["0"] == llm.engine.config.max_model_len


def test_beam_search_needs_stage_3(llm):
    with pytest.raises(ValueError, match="beam_search: needs copy-on-write"):
        llm.beam_search(["ROMEO:"], BeamSearchParams(beam_width=2, max_tokens=4))


def test_a_stop_string_on_the_last_allowed_token_is_a_stop(llm):
    free = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0].outputs[0]
    tail = free.text[-3:]
    out = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=5, stop=tail), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].text == free.text[:-3]
