"""Stage 3 through the public API: n > 1 over shared prompt blocks, beam search against the oracle."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedlab import LLM, BeamSearchParams, SamplingParams, load_model, oracle
from pagedlab.outputs import beam_score
from tests.engine.admission_story import shared_admission_never_runs_out

pytestmark = pytest.mark.stage3

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo", "KING RICHARD III:\nNow is the winter"]


@functools.cache
def bundled():
    return load_model()


@functools.cache
def oracle_beams(prompt: str, width: int, max_tokens: int, length_penalty: float = 1.0):
    m = bundled()
    params = BeamSearchParams(beam_width=width, max_tokens=max_tokens, length_penalty=length_penalty)
    return oracle.beam_search(m.model, m.tokenizer.encode(prompt), params, m.config.eos_token_ids)


def assert_beams_match(got, expected, eos, length_penalty, label=""):
    """Same sequences in the same order, cum logprobs within 1e-4; a different pick only at a near tie."""
    for rank, (a, b) in enumerate(zip(got, expected)):
        if a.tokens != b.tokens:
            sa = beam_score(a.tokens, a.cum_logprob, eos, length_penalty)
            sb = beam_score(b.tokens, b.cum_logprob, eos, length_penalty)
            print(f"{label}: rank {rank} differs; scores {sa:.6f} vs oracle {sb:.6f}")
            assert abs(sa - sb) < 1e-4, f"{label}: rank {rank} differs with score gap {abs(sa - sb):.2e}"
            return
        assert a.cum_logprob == pytest.approx(b.cum_logprob, abs=1e-4)
    assert len(got) == len(expected)


@pytest.mark.task("beam-step")
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("width", [1, 2, 4])
def test_beam_search_equals_the_oracle(block_size, width):
    llm = LLM(stage=3, block_size=block_size, max_num_seqs=8, debug_checks=True)
    outs = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=width, max_tokens=10))
    eos = llm.loaded.config.eos_token_ids
    for prompt, out in zip(PROMPTS, outs):
        assert_beams_match(out.sequences, oracle_beams(prompt, width, 10), eos, 1.0, label=prompt)
        assert out.sequences[0].text == llm.get_tokenizer().decode(
            out.sequences[0].tokens[len(llm.get_tokenizer().encode(prompt)) :]
        )
    assert llm.engine.kv_manager.num_used_blocks == 0


@pytest.mark.task("beam-step")
def test_beams_that_end_in_eos_are_set_aside():
    llm = LLM(stage=3, block_size=4, max_num_seqs=8, debug_checks=True)
    # A long search: some candidates end in <eos> (finish_reason "stop"), the rest run to "length".
    out = llm.beam_search(["GLOUCESTER:\nNow"], BeamSearchParams(beam_width=4, max_tokens=40, length_penalty=0.5))[0]
    expected = oracle_beams("GLOUCESTER:\nNow", 4, 40, 0.5)
    assert_beams_match(out.sequences, expected, llm.loaded.config.eos_token_ids, 0.5)
    assert {s.finish_reason for s in out.sequences} <= {"stop", "length"}


@pytest.mark.task("n-sharing")
def test_n_children_share_the_prompt_and_equal_independent_requests():
    llm = LLM(stage=3, block_size=4, max_num_seqs=8, debug_checks=True, record_trace=True)
    prompt = "KING RICHARD III:\nNow is the winter"
    out = llm.generate(prompt, SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=9), use_tqdm=False)[0]
    shared_peak = llm.engine.stats.peak_kv_blocks_used
    singles = [
        llm.generate(prompt, SamplingParams(temperature=1.0, max_tokens=8, seed=9 + i), use_tqdm=False)[0]
        for i in range(4)
    ]
    assert [c.token_ids for c in out.outputs] == [s.outputs[0].token_ids for s in singles]
    prompt_blocks = (len(out.prompt_token_ids) - 1) // 4  # full blocks of the shared prefill, held once
    first = next(t for t in llm.engine.trace if len(t.scheduled) == 4)
    tables = list(first.block_tables.values())
    assert all(t[:prompt_blocks] == tables[0][:prompt_blocks] for t in tables)
    assert shared_peak < 4 * len(tables[0])


@pytest.mark.task("n-sharing")
def test_greedy_n_gives_identical_children():
    llm = LLM(stage=3, max_num_seqs=8)
    out = llm.generate("ROMEO:", SamplingParams(n=3, temperature=0, max_tokens=12), use_tqdm=False)[0]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1


@pytest.mark.task("beam-step")
def test_abort_a_beam_search_frees_its_blocks():
    llm = LLM(stage=3, max_num_seqs=8, debug_checks=True)
    engine = llm.engine
    engine.add_beam_request("b", "ROMEO:", BeamSearchParams(beam_width=4, max_tokens=30))
    engine.add_request("plain", "JULIET:", SamplingParams(temperature=0, max_tokens=5))
    for _ in range(4):
        engine.step()
    engine.abort_request("b")
    while engine.has_unfinished_requests():
        engine.step()
    assert "b" in engine.beam_outputs and engine.kv_manager.num_used_blocks == 0


def test_beam_width_must_fit_max_num_seqs():
    llm = LLM(stage=3, max_num_seqs=2)
    with pytest.raises(ValueError, match="exceed max_num_seqs"):
        llm.beam_search(["ROMEO:"], BeamSearchParams(beam_width=4, max_tokens=4))


@pytest.mark.task("n-sharing")
def test_static_admission_counts_a_groups_shared_prompt_blocks_once():
    """Two n=3 requests of 7 prompt tokens, blocks of 4, 16 blocks: each group's worst case is the
    prompt's full block once plus 2 blocks per child, 7 blocks (not 3 x 3 = 9), so both run at once."""
    llm = LLM(stage=3, block_size=4, num_kv_blocks=16, max_num_seqs=8, debug_checks=True)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    engine = llm.engine
    for rid in ("A", "B"):
        engine.add_request(rid, "ROMEO:", params)
    assert engine.kv_manager.worst_case_blocks(engine.scheduler.waiting) == 2 * (1 + 3 * 2)
    engine.step()
    assert sorted(r.request_id for r in engine.scheduler.running) == ["0_A", "0_B", "1_A", "1_B", "2_A", "2_B"]
    outs = {}
    while engine.has_unfinished_requests():
        outs |= {o.request_id: o for o in engine.step() if o.finished}
    alone = LLM(stage=3, block_size=4, max_num_seqs=8).generate("ROMEO:", params)[0]
    assert [c.token_ids for c in outs["A"].outputs] == [c.token_ids for c in alone.outputs]
    assert engine.kv_manager.num_used_blocks == 0


@pytest.mark.task("n-sharing")
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_static_admission_with_shared_prompts_never_runs_out(tiny_model_dir, data):
    shared_admission_never_runs_out(tiny_model_dir, data, stage=3)
