"""Stage 4 through the public API: hits skip prefill, salts isolate tenants, sharing still composes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedlab import LLM, BeamSearchParams, SamplingParams
from tests.engine.admission_story import shared_admission_never_runs_out

pytestmark = pytest.mark.stage4

PREFIX = "ROMEO:\nWhat shall be the seat of the seas? "
GREEDY = SamplingParams(temperature=0, max_tokens=8)


def prefill_tokens(llm):
    """Prompt tokens the model actually computed: what each request was fed in its first step."""
    first: dict[str, int] = {}
    for t in llm.engine.trace:
        for req_id, n in t.scheduled.items():
            first.setdefault(req_id, n)
    return sum(first.values())


@pytest.mark.task("lookup")
def test_a_second_batch_hits_what_the_first_cached():
    llm = LLM(stage=4, block_size=4, max_num_seqs=1, record_trace=True, debug_checks=True)
    first, second = llm.generate([PREFIX + "A", PREFIX + "B"], GREEDY, use_tqdm=False)
    prompt_len = len(first.prompt_token_ids)
    cached = (prompt_len - 1) // 4 * 4  # the shared full blocks (the prefix is 44 tokens, 11 blocks)
    assert llm.engine.stats.prefix_cache_hits == min(cached, 44)
    assert llm.engine.stats.prefix_cache_queries == 2 * prompt_len
    assert prefill_tokens(llm) == 2 * prompt_len - 44
    assert 0 < llm.engine.stats.prefix_cache_hit_rate < 0.5


def test_caching_off_computes_everything():
    llm = LLM(stage=4, block_size=4, max_num_seqs=1, record_trace=True, enable_prefix_caching=False)
    a, b = llm.generate([PREFIX + "A", PREFIX + "B"], GREEDY, use_tqdm=False)
    assert llm.engine.stats.prefix_cache_hits == 0
    assert prefill_tokens(llm) == len(a.prompt_token_ids) + len(b.prompt_token_ids)


@pytest.mark.task("block-hashing")
def test_cache_salt_isolates_tenants():
    llm = LLM(stage=4, block_size=4, max_num_seqs=1)
    llm.generate(PREFIX + "A", GREEDY, cache_salt="tenant-a", use_tqdm=False)
    llm.generate(PREFIX + "B", GREEDY, cache_salt="tenant-b", use_tqdm=False)
    assert llm.engine.stats.prefix_cache_hits == 0
    llm.generate(PREFIX + "C", GREEDY, cache_salt="tenant-a", use_tqdm=False)
    assert llm.engine.stats.prefix_cache_hits == 44


@pytest.mark.task("lookup")
def test_outputs_do_not_depend_on_hits():
    cold = LLM(stage=4, block_size=4, max_num_seqs=1, enable_prefix_caching=False)
    warm = LLM(stage=4, block_size=4, max_num_seqs=1)
    prompts = [PREFIX + "A", PREFIX + "A", PREFIX + "Be"]
    expected = [o.outputs[0].token_ids for o in cold.generate(prompts, GREEDY, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in warm.generate(prompts, GREEDY, use_tqdm=False)] == expected


@pytest.mark.task("caching-pool")
def test_n_and_beams_compose_with_the_cache():
    llm = LLM(stage=4, block_size=4, max_num_seqs=8, debug_checks=True)
    llm.generate(PREFIX + "A", GREEDY, use_tqdm=False)  # warm the cache
    ref = LLM(stage=3, block_size=4, max_num_seqs=8)
    params = SamplingParams(n=3, temperature=1.0, seed=4, max_tokens=8)
    got = llm.generate(PREFIX + "B", params, use_tqdm=False)[0]
    assert [c.token_ids for c in got.outputs] == [
        c.token_ids for c in ref.generate(PREFIX + "B", params, use_tqdm=False)[0].outputs
    ]
    beams = BeamSearchParams(beam_width=3, max_tokens=6)
    assert [s.tokens for s in llm.beam_search([PREFIX + "C"], beams)[0].sequences] == [
        s.tokens for s in ref.beam_search([PREFIX + "C"], beams)[0].sequences
    ]
    assert llm.engine.stats.prefix_cache_hits >= 2 * 44
    assert llm.engine.kv_manager.num_used_blocks == 0


@pytest.mark.task("lookup")
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_static_admission_with_shared_prompts_and_caching_never_runs_out(tiny_model_dir, data):
    shared_admission_never_runs_out(tiny_model_dir, data, stage=4)
