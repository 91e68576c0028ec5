"""What a server or an impatient user does to an engine, and what must happen: aborts at any moment, calls
that fail halfway, one request's options never leaking into another's output, vLLM's behaviour where vLLM
pins it (stop order, reset_prefix_cache, num_cached_tokens), and invariants that survive `python -O`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from pagedlab import LLM, BeamSearchParams, SamplingParams
from pagedlab.stages import STAGES

GREEDY = SamplingParams(temperature=0, max_tokens=8)
SRC = Path(__file__).resolve().parents[2] / "src" / "pagedlab"


def run_all(engine, limit: int = 500) -> dict:
    """Step to the end; every group's final output, checked to arrive exactly once."""
    finished: dict = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            return finished
        for out in engine.step():
            if out.finished:
                assert out.request_id not in finished, f"{out.request_id} finished twice"
                finished[out.request_id] = out
    raise AssertionError(f"still unfinished after {limit} steps")


TORCH_STAGES = [
    pytest.param(n, marks=getattr(pytest.mark, p.marker)) for n, p in STAGES.items() if p.backends[0] != "triton"
]


@pytest.mark.parametrize("stage", TORCH_STAGES)
def test_aborting_a_waiting_request_breaks_nothing(stage):
    """The bug: at stage 5 the waiting queue shared the group's list with the engine; removing the aborted
    request emptied it, and the next step raised IndexError, losing the outputs of a request finishing in it."""
    llm = LLM(stage=stage, max_num_seqs=2, block_size=4, debug_checks=True)
    engine = llm.engine
    engine.add_request("a", "ROMEO:", SamplingParams(temperature=0, max_tokens=2))
    engine.add_request("b", "JULIET:", SamplingParams(temperature=0, max_tokens=2, n=2))
    engine.step()  # a prefilled; b's two children wait for two seats
    engine.abort_request("b")
    outs = {o.request_id: o for o in engine.step()}  # a finishes in the same step that reports b's abort
    assert outs["a"].finished and outs["a"].outputs[0].finish_reason == "length"
    assert [c.finish_reason for c in outs["b"].outputs] == ["abort"] * len(outs["b"].outputs)
    assert outs["b"].outputs[0].token_ids == []
    assert not engine.has_unfinished_requests() and not engine.scheduler.requests.live and not engine.owner_of("b")
    assert engine.kv_manager.num_used_blocks == 0
    engine.add_request("b", "JULIET:", GREEDY)  # the id is free again
    assert run_all(engine)["b"].outputs[0].finish_reason is not None


@pytest.mark.stage5
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_aborts_at_every_moment_leave_the_others_untouched(mode):
    """Abort a waiting, a running, a mid-prefill, a preempted (swapped out or recomputing), an n > 1 and a beam
    request, in one busy engine with a pool that preempts; the one request left equals its solo run."""
    solo = LLM(stage=5).generate("ROMEO:", SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)
    llm = LLM(
        stage=5,
        max_num_seqs=4,
        block_size=4,
        num_kv_blocks=24,
        long_prefill_token_threshold=6,
        preemption_mode=mode,
        debug_checks=True,
    )
    engine = llm.engine
    engine.add_request("keep", "ROMEO:", SamplingParams(temperature=0, max_tokens=30))
    engine.add_request("long", "KING RICHARD III:\nNow is the winter of our discontent", GREEDY)
    engine.add_request("n", "JULIET:", SamplingParams(temperature=1.0, seed=2, max_tokens=30, n=2))
    engine.add_beam_request("beam", "HAMLET:", BeamSearchParams(beam_width=2, max_tokens=30))
    engine.add_request("late", "MENENIUS:", GREEDY)
    engine.step()
    (long,) = engine.scheduler.requests.live["long"]
    assert 0 < long.num_computed_tokens < long.num_prompt_tokens
    engine.abort_request(["long", "late"])  # mid-prefill, and waiting
    for _ in range(12):
        engine.step()
    preempted = [r for r in engine.scheduler.waiting if r.status.name == "PREEMPTED"]
    engine.abort_request(["n", "beam"])  # n > 1 and beams, running or preempted
    outs = run_all(engine)
    assert outs["keep"].outputs[0].token_ids == solo[0].outputs[0].token_ids
    assert {o.outputs[0].finish_reason for k, o in outs.items() if k != "keep"} == {"abort"}
    assert "beam" in engine.beam_outputs
    assert engine.stats.num_preemptions > 0 or preempted == []
    assert (
        engine.kv_manager.num_used_blocks == 0 and engine.kv_manager.swap_pool.num_free == engine.config.num_swap_blocks
    )


@pytest.mark.stage1
def test_generate_is_all_or_nothing():
    llm = LLM(stage=5)
    with pytest.raises(ValueError, match="prompt: empty prompt"):
        llm.generate(["ROMEO:", ""], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    outs = llm.generate(["JULIET:"], GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == ["JULIET:"]
    with pytest.raises(ValueError, match="beam_width"):
        llm.beam_search(["ROMEO:", "JULIET:"], BeamSearchParams(beam_width=40, max_tokens=2))
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.stage1
def test_an_interrupted_generate_aborts_what_it_queued(monkeypatch):
    llm = LLM(stage=5)
    expected = llm.generate(["HAMLET:"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    real_step, calls = llm.engine.step, []

    def step_then_interrupt():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in a notebook, mid-generation
        return real_step()

    monkeypatch.setattr(llm.engine, "step", step_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["ROMEO:", "JULIET:"], SamplingParams(temperature=0, max_tokens=50), use_tqdm=False)
    monkeypatch.undo()
    assert llm.engine.kv_manager.num_used_blocks == 0  # freed at once
    outs = llm.generate(["HAMLET:"], GREEDY, use_tqdm=False)  # the next call runs only its own request
    assert [o.prompt for o in outs] == ["HAMLET:"] and outs[0].outputs[0].token_ids == expected
    assert not llm.engine.has_unfinished_requests() and not llm.engine.scheduler.requests.live


@pytest.mark.stage1
def test_llm_ids_skip_the_ones_a_script_used():
    llm = LLM(stage=5)
    llm.engine.add_request("0", "ROMEO:", SamplingParams(max_tokens=30))  # the id generate would take first
    outs = llm.generate(["JULIET:", "HAMLET:"], GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == ["JULIET:", "HAMLET:"] and "0" not in {o.request_id for o in outs}


@pytest.mark.stage1
@pytest.mark.parametrize("stage", [1, 5])
def test_logprobs_never_depend_on_the_rest_of_the_batch(stage):
    """vLLM: logprobs=0 returns the sampled token's logprob alone, one dict per token, in any batch."""
    llm = LLM(stage=stage)
    zero = SamplingParams(temperature=0, max_tokens=4, logprobs=0)
    alone = llm.generate("ROMEO:", zero, use_tqdm=False)[0].outputs[0]
    batched = llm.generate(
        ["ROMEO:", "JULIET:", "KING:"],
        [zero, SamplingParams(temperature=0, max_tokens=4, logprobs=5), SamplingParams(max_tokens=4)],
        use_tqdm=False,
    )
    together = batched[0].outputs[0].logprobs
    assert [list(d) for d in alone.logprobs] == [list(d) for d in together] == [[t] for t in alone.token_ids]
    for a, b in zip(alone.logprobs, together):  # equal up to float noise across batch shapes
        assert list(a.values()) == pytest.approx(list(b.values()), abs=1e-5)
    assert all(len(d) in (5, 6) for d in batched[1].outputs[0].logprobs) and batched[2].outputs[0].logprobs is None


@pytest.mark.stage1
def test_a_temperature_below_vllms_epsilon_is_greedy():
    llm = LLM(stage=5)
    greedy = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    tiny = llm.generate("ROMEO:", SamplingParams(temperature=1e-310, max_tokens=12, seed=1), use_tqdm=False)
    assert tiny[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids  # once: token 0 forever


@pytest.mark.stage1
@pytest.mark.parametrize("stage", [1, 5])
def test_eos_as_the_last_allowed_token_finishes_with_stop(stage):
    """vLLM >= 0.11.1 checks EOS before length: an EOS that is also the max_tokens-th token is a "stop"."""
    llm = LLM(stage=stage)
    free = llm.generate("JULIET:", SamplingParams(temperature=0, max_tokens=400), use_tqdm=False)[0].outputs[0]
    assert free.finish_reason == "stop" and free.token_ids[-1] in llm.engine.model_config.eos_token_ids
    capped = SamplingParams(temperature=0, max_tokens=len(free.token_ids))
    out = llm.generate("JULIET:", capped, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free.token_ids and out.finish_reason == "stop"
    shorter = SamplingParams(temperature=0, max_tokens=len(free.token_ids) - 1)
    assert llm.generate("JULIET:", shorter, use_tqdm=False)[0].outputs[0].finish_reason == "length"


@pytest.mark.stage4
def test_reset_prefix_cache_forgets_every_hash_and_refuses_while_blocks_are_held():
    llm = LLM(stage=4, block_size=4)
    prompt = "KING RICHARD III:\nNow is the winter"
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 0
    again = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 4 * ((len(again.prompt_token_ids) - 1) // 4) > 0
    llm.engine.add_request("busy", prompt, GREEDY)
    llm.engine.step()
    assert llm.reset_prefix_cache() is False  # blocks in use: nothing done
    assert llm.engine.kv_manager.pool.cached_block_hash_to_block
    run_all(llm.engine)
    hits = llm.engine.stats.prefix_cache_hits
    assert llm.reset_prefix_cache() is True
    assert not llm.engine.kv_manager.pool.cached_block_hash_to_block
    assert all(b.block_hash is None for b in llm.engine.kv_manager.pool.blocks)
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 0
    assert llm.engine.stats.prefix_cache_hits == hits  # counters are cumulative, as vLLM's metrics


@pytest.mark.stage2
@pytest.mark.parametrize("stage", [1, 2])
def test_reset_prefix_cache_before_stage_4_only_says_whether_blocks_are_free(stage):
    llm = LLM(stage=stage)
    assert llm.reset_prefix_cache() is True
    llm.engine.add_request("r", "ROMEO:", GREEDY)
    llm.engine.step()
    assert llm.reset_prefix_cache() is False
    run_all(llm.engine)
    assert llm.reset_prefix_cache() is True


@pytest.mark.stage5
def test_num_cached_tokens_is_counted_at_the_first_admission():
    llm = LLM(stage=5, block_size=4)
    prompt = "KING RICHARD III:\nNow is the winter"
    llm.generate(prompt, GREEDY, use_tqdm=False)
    outs = llm.generate([prompt, "ROMEO:"], GREEDY, use_tqdm=False)
    assert outs[0].num_cached_tokens > 0 and outs[1].num_cached_tokens == 0


@pytest.mark.stage1
def test_the_trace_is_a_ring_of_the_last_steps():
    llm = LLM(stage=5, record_trace=True, max_trace_steps=5)
    llm.generate(["ROMEO:", "JULIET:"], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    trace = llm.engine.trace
    assert len(trace) == 5 and [s.step for s in trace] == list(range(16, 21)) == list(
        range(16, 1 + llm.engine.stats.num_steps)
    )


@pytest.mark.stage1
def test_no_plain_assert_in_the_package():
    """`python -O` strips every assert statement, with the check and anything called inside it."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assert):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
            is_check = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check"
            if is_check and len(node.args) == 2 and isinstance(node.args[1], ast.JoinedStr):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} (check() builds its f-string message every call)")
    assert not found, found


@pytest.mark.stage2
def test_invariants_and_results_survive_python_dash_O():
    script = """
import pytest
from pagedlab import LLM, SamplingParams
from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import BlockPool
pool = BlockPool(2)
(block,) = pool.allocate(1)
pool.free([block])
try:
    pool.free([block])
except InvariantError as e:
    print("refused:", e)
for stage in (1, 2, 5):
    out = LLM(stage=stage).generate("ROMEO:", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    print(stage, out[0].outputs[0].token_ids)
"""
    expected = LLM(stage=1).generate("ROMEO:", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    run = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "refused: KVCacheBlock(0, ref_cnt=0) freed twice"
    assert lines[1:] == [f"{s} {expected[0].outputs[0].token_ids}" for s in (1, 2, 5)]
