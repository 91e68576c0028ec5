"""Stage 5: a request forked and preempted in the same step (three programs a random checker found).

The bug: `schedule()` sent a fork's whole table (an n = 2 follower, or a new beam), then preempted its
group later in the same step, and withdrew only the entries of victims that had been *scheduled*. The
runner dropped the preempted rows, then installed the freed table; on re-admission the new blocks were
appended after the stale ones, and the request read and wrote K/V in blocks it did not own. Each program
below, shrunk from a random add/step program, gave tokens or logprobs the oracle does not. With
`debug_checks` the runner's tables are now compared with the KV manager's after every forward pass, so
the same bug fails at the step it happens (tests/worker/test_block_table.py has that check's own tests).
"""

from __future__ import annotations

import pytest

from pagedlab import LLM, BeamSearchParams, SamplingParams, oracle
from tests.engine.test_stage3 import assert_beams_match
from tests.equivalence import assert_matches_oracle

pytestmark = pytest.mark.stage5

GREEDY = dict(temperature=0.0, ignore_eos=True)
BASE = dict(stage=5, max_num_batched_tokens=256, enable_prefix_caching=False, seed=0, debug_checks=True)

# seed 142: the leader of an n = 2 request ends its shared prefill in a step where the pool is short; the
# follower is forked (its table sent) and then preempted with its group in that same step.
SEED_142 = (
    dict(BASE, block_size=3, max_model_len=32, max_num_seqs=3, num_kv_blocks=13, long_prefill_token_threshold=1),
    [
        ("r9", [50, 22, 64, 18, 48, 5], SamplingParams(max_tokens=1, **GREEDY)),
        ("r10", [17, 29, 8, 34, 37, 22, 41, 43, 56, 10, 53], SamplingParams(max_tokens=10, **GREEDY)),
        ("r11", [16, 7, 6, 31], SamplingParams(max_tokens=1, **GREEDY)),
        ("r12", [14, 21, 39, 47, 47, 25, 36], SamplingParams(max_tokens=20, **GREEDY)),
    ],
)
N2_SAMPLED = SamplingParams(n=2, temperature=1.0, seed=57650, max_tokens=1, ignore_eos=True)  # the report
N2_GREEDY = SamplingParams(n=2, max_tokens=3, **GREEDY)  # the same program greedy: a clear non-tie (gap 1.76)
N2_PROMPT = [40, 37, 47, 6, 14, 10, 38, 54, 58, 29]

# seed 371: a beam search's new beams are preempted (FCFS: the search is the newest) in the step that
# sends them their tables.
SEED_371 = (
    dict(BASE, block_size=8, max_model_len=48, max_num_seqs=8, num_kv_blocks=12),
    ("r1", [0, 21, 50, 59, 60, 61, 4, 18, 50, 61, 67, 46, 55, 3, 17, 46, 47, 56, 59, 46, 4, 64],
     BeamSearchParams(beam_width=3, max_tokens=6, length_penalty=0.0)),
    [
        ("r2", [31, 12, 32, 59, 49, 15, 20, 49, 61, 30, 60, 17, 39, 45, 44, 22, 35, 16, 15, 5, 33, 66, 23, 65],
         SamplingParams(max_tokens=10, **GREEDY)),
        ("r3", [19, 28, 64, 9, 67, 33, 31, 12, 32, 59, 49, 15, 20, 49, 61, 30, 60, 17, 39, 45, 44, 54, 4, 63],
         SamplingParams(max_tokens=8, **GREEDY)),
    ],
)  # fmt: skip


def run_to_end(llm: LLM, limit: int = 500) -> dict:
    finished, engine = {}, llm.engine
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            break
        finished |= {out.request_id: out for out in engine.step() if out.finished}
    assert not engine.has_unfinished_requests() and engine.kv_manager.num_used_blocks == 0
    return finished


def expected(llm: LLM, prompt, params: SamplingParams, child: int, max_model_len: int) -> oracle.OracleOutput:
    seed = None if params.seed is None else params.seed + child
    eos = llm.loaded.config.eos_token_ids
    return oracle.generate(llm.loaded.model, prompt, params, eos, max_model_len=max_model_len, seed=seed)


@pytest.mark.parametrize("n2", [N2_SAMPLED, N2_GREEDY], ids=["sampled", "greedy"])
def test_an_n2_follower_forked_and_preempted_in_one_step_equals_the_oracle(n2):
    config, program = SEED_142
    llm = LLM(**config)
    for rid, prompt, params in [*program, ("r13", N2_PROMPT, n2)]:
        llm.engine.add_request(rid, prompt, params)
    finished = run_to_end(llm)
    assert llm.engine.stats.num_preemptions > 0
    for rid, prompt, params in [*program, ("r13", N2_PROMPT, n2)]:
        for child in finished[rid].outputs:
            want = expected(llm, prompt, params, child.index, config["max_model_len"])
            if params.temperature > 0:  # seeded: the report's margin is 0.585, far from a tie
                assert child.token_ids == want.token_ids, f"{rid}[{child.index}]"
            else:
                assert_matches_oracle(child.token_ids, want, f"{rid}[{child.index}]")


def test_new_beams_preempted_in_the_step_that_sends_their_tables_equal_the_oracle():
    config, (beam_id, beam_prompt, beam_params), program = SEED_371
    llm = LLM(**config)
    llm.engine.add_beam_request(beam_id, beam_prompt, beam_params)
    for rid, prompt, params in program:
        llm.engine.add_request(rid, prompt, params)
    finished = run_to_end(llm)
    assert llm.engine.stats.num_preemptions > 0
    eos, model = llm.loaded.config.eos_token_ids, llm.loaded.model
    want = oracle.beam_search(model, beam_prompt, beam_params, eos, max_model_len=config["max_model_len"])
    assert_beams_match(llm.engine.beam_outputs.pop(beam_id).sequences, want, eos, 0.0, beam_id)
    for rid, prompt, params in program:
        assert_matches_oracle(finished[rid].outputs[0].token_ids, expected(llm, prompt, params, 0, 48), rid)


def test_a_new_beam_preempted_by_the_recompute_fallback_of_swap_keeps_its_logprobs():
    """seed 135: swap mode, but the swap pool cannot hold the search (a shared block is copied out once per
    beam), so the group falls back to recompute in the step that sends the new beam's table."""
    llm = LLM(**dict(BASE, block_size=5, max_model_len=48, max_num_seqs=3, num_kv_blocks=12,
                     preemption_mode="swap", scheduling_policy="priority"))  # fmt: skip
    engine, beam = llm.engine, BeamSearchParams(beam_width=2, max_tokens=5, length_penalty=0.5)
    beam_prompt = [0, 21, 50, 59, 60, 61, 4, 18, 50, 61, 50, 67, 3, 17, 46, 47, 56, 59, 46]
    plain = [
        ("r0", [25, 36, 27, 24, 20, 35, 13, 3, 30, 4, 33, 56, 54, 46, 56, 9, 4, 33, 56], 20, 0),
        ("r4", [37, 38, 35, 38, 7, 27, 39, 3, 35, 13, 37, 36, 30, 14, 63], 8, 2),
        ("r7", [0, 30], 5, -2),
    ]
    finished = {}
    for rid, prompt, max_tokens, priority in plain[:2]:
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), priority=priority)
    for _ in range(2):
        finished |= {o.request_id: o for o in engine.step() if o.finished}
    engine.add_beam_request("r5", beam_prompt, beam)
    finished |= {o.request_id: o for o in engine.step() if o.finished}
    rid, prompt, max_tokens, priority = plain[2]
    engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, **GREEDY), priority=priority)
    finished |= run_to_end(llm)
    assert engine.stats.num_preemptions > 0
    eos = llm.loaded.config.eos_token_ids
    want = oracle.beam_search(llm.loaded.model, beam_prompt, beam, eos, max_model_len=48)
    assert_beams_match(engine.beam_outputs.pop("r5").sequences, want, eos, 0.5, "r5")
    for rid, prompt, max_tokens, _ in plain:
        params = SamplingParams(max_tokens=max_tokens, **GREEDY)
        assert_matches_oracle(finished[rid].outputs[0].token_ids, expected(llm, prompt, params, 0, 48), rid)
