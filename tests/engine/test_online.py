"""Stage 5 online use: requests arrive between steps, stream their tokens, and can be aborted mid-flight."""

import random

import pytest

from pagedlab import LLM, SamplingParams

pytestmark = pytest.mark.stage5

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def poisson_times(rate: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def test_requests_join_a_running_batch_and_stream_tokens():
    llm = LLM(stage=5, max_num_seqs=4, block_size=4, debug_checks=True)
    engine = llm.engine
    reference = {
        o.prompt: o.outputs[0].token_ids
        for o in LLM(stage=4, max_num_seqs=1).generate(
            ["ROMEO:", "JULIET:", "HAMLET:", "First Citizen:"], GREEDY, use_tqdm=False
        )
    }
    arrivals = dict(zip(reference, [0, 3, 4, 9]))  # the step at which each request arrives
    streamed: dict[str, list[list[int]]] = {}
    step = 0
    while arrivals or engine.has_unfinished_requests():
        for prompt in [p for p, at in arrivals.items() if at <= step]:
            engine.add_request(prompt, prompt, GREEDY, arrival_time=float(step))
            del arrivals[prompt]
        for out in engine.step():
            streamed.setdefault(out.request_id, []).append(list(out.outputs[0].token_ids))
        step += 1
    for prompt, tokens in reference.items():
        snapshots = streamed[prompt]
        assert snapshots[-1] == tokens
        assert [len(s) for s in snapshots] == list(range(1, len(tokens) + 1)), "one more token per step"
        assert all(s == tokens[: len(s)] for s in snapshots)
    assert engine.kv_manager.num_used_blocks == 0


def test_abort_mid_flight_frees_blocks_and_the_rest_carry_on():
    llm = LLM(stage=5, max_num_seqs=4, block_size=4, num_kv_blocks=40, debug_checks=True)
    engine = llm.engine
    alone = LLM(stage=5, max_num_seqs=4).generate(["ROMEO:"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    engine.add_request("keep", "ROMEO:", GREEDY)
    engine.add_request("drop", "JULIET:", SamplingParams(temperature=0, max_tokens=50, n=2))
    for _ in range(3):
        engine.step()
    held = engine.kv_manager.num_used_blocks
    engine.abort_request("drop")
    assert engine.kv_manager.num_used_blocks < held
    outs = {}
    while engine.has_unfinished_requests():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    assert [c.finish_reason for c in outs["drop"].outputs] == ["abort", "abort"]
    assert outs["keep"].outputs[0].token_ids == alone
    assert engine.kv_manager.num_used_blocks == 0


def test_a_seeded_poisson_stream_finishes_every_request():
    llm = LLM(
        stage=5, max_num_seqs=3, block_size=4, num_kv_blocks=30, long_prefill_token_threshold=5, debug_checks=True
    )
    engine = llm.engine
    times = poisson_times(rate=2.0, n=8, seed=3)  # arrivals in "seconds" of a simulated clock: 0.5 s per step
    finished, step = set(), 0
    while len(finished) < 8:
        clock = step * 0.5
        while times and times[0] <= clock:
            i = 8 - len(times)
            engine.add_request(
                f"r{i}", f"CITIZEN {i}:", SamplingParams(temperature=0, max_tokens=6 + i), arrival_time=times.pop(0)
            )
        finished |= {o.request_id for o in engine.step() if o.finished}
        step += 1
        assert step < 500
    assert engine.kv_manager.num_used_blocks == 0 and not engine.has_unfinished_requests()
