"""What the step-through page (and `pagedlab demo --step`) says happened, checked against the trace it is drawn from,
one message of each kind: a fork, a copy-on-write, a prefix-cache hit, a preemption, a swap-in and an eviction."""

from __future__ import annotations

import pytest

from pagedlab import LLM, SamplingParams
from pagedlab.engine import events
from pagedlab.viz import trace as viz_trace


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def events_of(trace: dict, kind: str) -> list[tuple[int, dict]]:
    return [(i, e) for i, s in enumerate(trace["steps"]) for e in s["events"] if e["kind"] == kind]


@pytest.fixture(scope="module")
def forked() -> dict:
    """n = 3 at stage 3: the leader prefills 6 of its 7 prompt tokens, the followers fork in step 2 and copy."""
    llm = LLM(stage="cow", block_size=4, num_kv_blocks=16, max_num_seqs=8, record_trace=True)
    llm.engine.add_request("A", "ROMEO:", SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=4, ignore_eos=True))
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    return viz_trace.to_trace(llm)


@pytest.mark.stage3
def test_a_fork_names_every_block_it_shares_with_its_parent(forked):
    forks = events_of(forked, "fork")
    assert [e["request"] for _, e in forks] == ["1_A", "2_A"]
    for i, e in forks:
        step = forked["steps"][i]
        undone = {dst: src for rid, src, dst in step["copies"] if rid == e["request"]}  # the table as forked
        as_forked = [undone.get(b, b) for b in step["tables"][e["request"]]]
        assert e["blocks"] == as_forked == step["tables"]["0_A"][: len(as_forked)] or e["blocks"] == as_forked
        assert e["text"] == f"{e['request']} forked: shares blocks {events.block_list(as_forked)} with its parent " \
                            f"({events.FORKED})"  # fmt: skip
    (i, first), _ = forks
    assert len(first["blocks"]) == 2  # both of the leader's blocks, the full one and the one about to be copied


@pytest.mark.stage3
def test_a_copy_on_write_shows_its_source_and_its_copy(forked):
    copies = events_of(forked, "copy")
    recorded = [(i, rid, src, dst) for i, s in enumerate(forked["steps"]) for rid, src, dst in s["copies"]]
    assert [(i, e["request"], *e["blocks"]) for i, e in copies] == recorded and recorded
    for _, e in copies:
        src, dst = e["blocks"]
        assert e["text"].startswith(f"{e['request']} copy-on-write: block {src} -> block {dst} (")


@pytest.mark.stage4
def test_a_hit_names_the_blocks_found_cached():
    llm = LLM(stage="prefix", block_size=4, num_kv_blocks=16, max_num_seqs=1, record_trace=True)
    llm.generate(["ROMEO:\nBut soft", "ROMEO:\nBut hark"], greedy(2), use_tqdm=False)
    trace = viz_trace.to_trace(llm)
    ((i, hit),) = events_of(trace, "hit")
    step = trace["steps"][i]
    cached = step["num_cached_tokens"][hit["request"]] if "num_cached_tokens" in step else len(hit["blocks"]) * 4
    assert hit["blocks"] == step["tables"][hit["request"]][: cached // 4] and len(hit["blocks"]) == 3  # "ROMEO:\\nBut "
    assert (
        hit["text"]
        == f"{hit['request']} prefix-cache hit: {events.block_list(hit['blocks'])} (12 tokens not recomputed)"
    )


@pytest.mark.stage5
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_preemption_and_a_swap_in_are_the_trace_s(mode):
    llm = LLM(stage="continuous", block_size=4, num_kv_blocks=12, max_num_seqs=3, max_num_batched_tokens=32,
              preemption_mode=mode, num_swap_blocks=16 if mode == "swap" else 0, record_trace=True)  # fmt: skip
    llm.generate(["MIRANDA:", "ARIEL:", "CALIBAN:"], greedy(14), use_tqdm=False)
    trace = viz_trace.to_trace(llm)
    preempts = [(i, e["request"]) for i, e in events_of(trace, "preempt")]
    assert preempts and preempts == [(i, rid) for i, s in enumerate(trace["steps"]) for rid in s["preempted"]]
    swapped_in = events_of(trace, "swap_in")
    if mode == "swap":
        assert swapped_in
        for i, e in swapped_in:
            assert set(e["blocks"]) == {gpu for _, gpu in trace["steps"][i]["swap_in"]} & set(
                trace["steps"][i]["tables"][e["request"]]
            )
    else:
        assert not swapped_in


@pytest.mark.stage4
def test_an_eviction_names_the_cached_blocks_reused():
    llm = LLM(stage="prefix", block_size=4, num_kv_blocks=6, max_num_seqs=1, record_trace=True)
    llm.generate(["ROMEO:\nBut soft", "JULIET:\nAy me, O Ro"], greedy(2), use_tqdm=False)
    trace = viz_trace.to_trace(llm)
    evictions = events_of(trace, "evict")
    assert evictions
    for i, e in evictions:
        before, now = trace["steps"][i - 1]["pool"]["hash"], trace["steps"][i]["pool"]["hash"]
        assert e["blocks"] == [b for b, h in enumerate(before) if h is not None and now[b] != h and
                               b in trace["steps"][i]["tables"].get(e["request"], [])]  # fmt: skip
