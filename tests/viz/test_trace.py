"""pagedlab.viz.trace: the recorded steps as versioned JSON: it round-trips, passes its schema at every stage
(n > 1, beams, swap, prefix hits), refuses broken traces naming the field, matches the engine, and stays small."""

from __future__ import annotations

import copy
import json

import pytest

from pagedlab import LLM, BeamSearchParams, SamplingParams
from pagedlab.engine import events
from pagedlab.lessons.demo import DemoOptions, add_requests, make_llm
from pagedlab.viz import trace as viz_trace


def run_demo_quietly(**options):
    """The demo scenario without drawing: (llm, prompts, texts)."""
    opts = DemoOptions(delay=0, **options)
    llm = make_llm(opts)
    prompts, latest = add_requests(llm, opts), {}
    while llm.engine.has_unfinished_requests():
        latest |= {out.request_id: out for out in llm.engine.step()}
    return llm, prompts, {rid: out.outputs[0].text for rid, out in latest.items()}


def run_n2():
    """Stage 3: two requests of two children each; the second child forks, then copies on write."""
    llm = LLM(stage=3, block_size=4, num_kv_blocks=32, record_trace=True)
    params = SamplingParams(n=2, max_tokens=6, temperature=0.8, seed=0)
    outs = llm.generate(["ROMEO:", "JULIET:"], params, use_tqdm=False)
    return llm, {o.request_id: o.prompt for o in outs}, {}


def run_beams():
    llm = LLM(stage=3, block_size=4, num_kv_blocks=32, record_trace=True)
    llm.beam_search(["ROMEO:"], BeamSearchParams(beam_width=3, max_tokens=8))
    return llm, None, None


def run_stage6(tiny_model_dir):
    """Stage 6 on the torch backend (the trace does not depend on the kernels): token-id prompts, no tokenizer."""
    llm = LLM(model=str(tiny_model_dir), stage=6, max_model_len=64, block_size=4, num_kv_blocks=12,
              max_num_seqs=3, long_prefill_token_threshold=6, attention_backend="torch", record_trace=True)  # fmt: skip
    prompts = [[3, 14, 15, 9, 26, 5, 35, 8, 9], [3, 14, 15, 9, 26, 5, 35, 8, 30], [44, 2, 44, 2, 44]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    return llm, {o.request_id: o.prompt_token_ids for o in outs}, {}


RUNS = {  # name -> (how to run it, an event kind its trace must hold)
    "contiguous": (lambda _: run_demo_quietly(stage="contiguous"), "finish"),
    "paged": (lambda _: run_demo_quietly(stage="paged"), "allocate"),
    "cow n=2": (lambda _: run_n2(), "copy"),
    "cow beams": (lambda _: run_beams(), "fork"),
    "prefix": (lambda _: run_demo_quietly(stage="prefix"), "hit"),
    "continuous": (lambda _: run_demo_quietly(), "evict"),
    "continuous swap": (lambda _: run_demo_quietly(preemption_mode="swap"), "swap_in"),
    "kernel": (run_stage6, "hit"),
}
MARKS = {"contiguous": 1, "paged": 2, "cow n=2": 3, "cow beams": 3, "prefix": 4, "continuous": 5,
         "continuous swap": 5, "kernel": 6}  # fmt: skip


@pytest.fixture(scope="module")
def demo():
    """The default scenario (stage 5, ten requests) and its trace."""
    llm, prompts, texts = run_demo_quietly()
    return llm, viz_trace.to_trace(llm, prompts, texts)


@pytest.mark.parametrize("name", [pytest.param(n, marks=getattr(pytest.mark, f"stage{s}")) for n, s in MARKS.items()])
def test_every_stage_round_trips_and_passes_the_schema(name, tiny_model_dir):
    make, kind = RUNS[name]
    llm, prompts, texts = make(tiny_model_dir)
    trace = viz_trace.to_trace(llm, prompts, texts)
    viz_trace.validate(trace)
    assert viz_trace.from_json(json.dumps(trace)) == trace
    assert trace["stage"] == llm.engine.config.stage and len(trace["steps"]) == llm.engine.stats.num_steps
    kinds = {e["kind"] for step in trace["steps"] for e in step["events"]}
    assert kind in kinds, sorted(kinds)
    assert (trace["steps"][0]["pool"] is None) == (name == "contiguous")  # regions at stage 1, a pool after


@pytest.mark.stage3
def test_a_child_that_waits_for_its_leader_forks_a_step_later():
    llm, prompts, _ = run_n2()
    step1, step2 = viz_trace.to_trace(llm, prompts)["steps"][:2]
    assert step1["tables"]["1_0"] == [] and step1["tables"]["0_0"] == [0, 1]  # the leader prefills "<bos>ROMEO:"
    assert {
        "kind": "fork",
        "request": "1_0",
        "blocks": [0, 1],
        "text": "1_0 forked: shares blocks 0-1 with its parent (" + events.FORKED + ")",
    } in (step2["events"])
    # The leaders write their next token into a private copy of their shared last block (4 and 5);
    # the first blocks 0 and 2 stay shared, each by its two children.
    assert step2["tables"] == {"0_0": [0, 4], "1_0": [0, 1], "0_1": [2, 5], "1_1": [2, 3]}
    assert step2["copies"] == [["0_0", 1, 4], ["0_1", 3, 5]]
    assert step2["pool"]["ref"][:7] == [2, 1, 2, 1, 1, 1, 0] and step2["pool"]["free"][0] == 6


@pytest.mark.stage2
def test_a_paged_run_records_exact_tables_and_the_free_queue():
    # block_size 4, 8 blocks: "<bos>ROMEO:" (7 tokens) takes blocks 0-1, "<bos>JULIET:" (8) takes 2-3
    llm = LLM(stage=2, block_size=4, num_kv_blocks=8, max_num_seqs=2, record_trace=True)
    outs = llm.generate(
        ["ROMEO:", "JULIET:"], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), use_tqdm=False
    )
    trace = viz_trace.to_trace(llm, {o.request_id: o.prompt for o in outs})
    s1, s2, s3 = trace["steps"]
    assert s1["tables"] == {"0": [0, 1], "1": [2, 3]} and s1["used"] == {"0": 7, "1": 8}
    assert s1["pool"] == {"free": [4, 5, 6, 7], "ref": [1, 1, 1, 1, 0, 0, 0, 0], "hash": [None] * 8}
    assert s2["tables"]["1"] == [2, 3, 4] and s2["pool"]["free"] == [5, 6, 7]  # 1's ninth token opens block 4
    assert s3["finished"] == {"0": "length", "1": "length"}
    assert [e["text"] for e in s3["events"] if e["kind"] == "free"] == ["0 freed 0-1,5 (after this step)",
                                                                       "1 freed 2-4 (after this step)"]  # fmt: skip
    assert trace["requests"]["0"] == {"group": "0", "prompt": "ROMEO:", "num_prompt_tokens": 7, "text": None,
                                      "first_step": 1, "last_step": 3, "finish_reason": "length"}  # fmt: skip


@pytest.mark.stage5
def test_the_demo_trace_matches_the_engines_steps(demo):
    llm, trace = demo
    pool = llm.engine.kv_manager.pool
    for ours, theirs in zip(trace["steps"], llm.engine.trace, strict=True):
        assert ours["step"] == theirs.step and ours["scheduled"] == theirs.scheduled
        assert ours["tables"] == theirs.block_tables and ours["used"] == theirs.kv_used
        assert (ours["waiting"], ours["running"], ours["preempted"]) == (
            theirs.waiting,
            theirs.running,
            theirs.preempted,
        )
        assert ours["pool"]["free"] == theirs.free_queue and ours["pool"]["ref"] == theirs.ref_cnts
        assert len(ours["pool"]["free"]) == pool.num_blocks - ours["num_used_blocks"]
    named = [None if i is None else trace["hashes"][i] for i in trace["steps"][-1]["pool"]["hash"]]
    last = llm.engine.trace[-1].block_hashes
    assert named == [None if h is None else h[:6].hex() for h in last]
    assert trace["requests"]["5"]["num_prompt_tokens"] == 77 and trace["requests"]["5"]["finish_reason"] == "length"
    preempt = next(e for step in trace["steps"] for e in step["events"] if e["kind"] == "preempt")
    assert "why: no free block" in preempt["text"]  # the reason travels with the event


@pytest.mark.stage5
def test_a_sliding_window_run_keeps_its_null_block_out_of_the_free_queue():
    # With a window, block 0 is the null block: ref 0 yet never free. The free queue holds every other block
    # nobody holds, so its length is the pool less the null block less the blocks in use.
    from pagedlab.lessons.window import windowed_bundled_model

    llm, prompts, texts = run_demo_quietly(model=str(windowed_bundled_model(16)))
    trace = viz_trace.from_json(viz_trace.dumps(viz_trace.to_trace(llm, prompts, texts)))
    assert trace["config"]["sliding_window"] == 16 and llm.engine.kv_manager.window.null_block.block_id == 0
    for step in trace["steps"]:
        assert step["pool"]["ref"][0] == 0 and 0 not in step["pool"]["free"]
        assert len(step["pool"]["free"]) == 24 - 1 - step["num_used_blocks"]
    assert any(0 in table for step in trace["steps"] for table in step["tables"].values())  # a block went behind
    with pytest.raises(ValueError, match=r"^steps\[0\]\.pool\.free: must hold exactly the blocks with ref 0"):
        viz_trace.validate(broken(trace, lambda t: t["steps"][0]["pool"]["free"].append(0)))
    with pytest.raises(ValueError, match=r"^steps\[0\]\.pool\.ref\[0\]: the null block is nobody's, got ref 1"):
        viz_trace.validate(broken(trace, lambda t: t["steps"][0]["pool"]["ref"].__setitem__(0, 1)))
    older = broken(trace, lambda t: t["config"].pop("sliding_window"))  # a trace written before the field
    viz_trace.validate(broken(older, lambda t: [s["pool"]["free"].append(0) for s in t["steps"]]))


@pytest.mark.stage5
def test_a_hybrid_trace_keeps_a_table_per_group_and_names_the_groups():
    # The differential's hybrid recording (layers full and sliding-24), replayed without a model: every request
    # has one table per KV cache group, and the config names the groups in that order for the page's labels.
    from pagedlab.engine.replay import ReplayEngine
    from pagedlab.lessons.differential import workload

    trace = viz_trace.from_json(viz_trace.dumps(viz_trace.to_trace(ReplayEngine(workload("hybrid", 1)).run())))
    config = trace["config"]
    assert config["layer_windows"] == [None, 24] and viz_trace.trace_groups(config) == 2
    assert config["kv_cache_groups"] == [{"kind": "full", "layers": [0]}, {"kind": "sliding-24", "layers": [1]}]
    tables = [t for step in trace["steps"] for t in step["tables"].values()]
    assert tables and all(len(t) == 2 for t in tables)
    assert any(0 in window for _, window in tables) and not any(0 in full for full, _ in tables)  # the null block
    first = trace["steps"][0]["tables"]
    rid = next(r for r, t in first.items() if t[0])
    with pytest.raises(ValueError, match=rf"^steps\[0\]\.tables\['{rid}'\]: expected 2 tables \(one per group\)"):
        viz_trace.validate(broken(trace, lambda t: t["steps"][0]["tables"].update({rid: first[rid][:1]})))
    with pytest.raises(ValueError, match=rf"^steps\[0\]\.tables\['{rid}'\]\[0\]: expected list, got int"):
        viz_trace.validate(broken(trace, lambda t: t["steps"][0]["tables"].update({rid: [1, 2]})))  # a flat table
    with pytest.raises(ValueError, match=r"^config\.kv_cache_groups: expected \[\{'kind': 'full'"):
        viz_trace.validate(broken(trace, lambda t: t["config"]["kv_cache_groups"].reverse()))
    with pytest.raises(ValueError, match=r"^config\.kv_cache_groups: expected none: the layers are all alike"):
        viz_trace.validate(broken(trace, lambda t: t["config"].update(layer_windows=[24, 24])))
    viz_trace.validate(broken(trace, lambda t: t["config"].pop("kv_cache_groups")))  # written before the labels


def broken(trace: dict, change) -> dict:
    bad = copy.deepcopy(trace)
    change(bad)
    return bad


@pytest.mark.stage5
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.update(version=2), r"^version: expected 1, got 2"),
        (lambda t: t.pop("steps"), r"^steps: missing"),
        (lambda t: t["config"].pop("block_size"), r"^config\.block_size: missing"),
        (lambda t: t["steps"][3].pop("tables"), r"^steps\[3\]\.tables: missing"),
        (lambda t: t["steps"][3]["tables"]["0"].__setitem__(0, 24), r"^steps\[3\]\.tables\['0'\]\[0\]: block id 24 "),
        (lambda t: t["steps"][2]["pool"]["ref"].pop(), r"^steps\[2\]\.pool\.ref: expected 24 entries"),
        (lambda t: t["steps"][2]["pool"]["free"].append(0), r"^steps\[2\]\.pool\.free"),
        (lambda t: t["steps"][2]["pool"]["hash"].__setitem__(0, 999), r"^steps\[2\]\.pool\.hash\[0\]: 999 is not"),
        (lambda t: t["steps"][0]["events"][0].update(kind="boom"), r"^steps\[0\]\.events\[0\]\.kind: 'boom'"),
        (lambda t: t["steps"][0].update(step=True), r"^steps\[0\]\.step: expected int, got bool"),
        (lambda t: t["steps"][0]["running"].append("nobody"), r"^steps\[0\]\.running\[\d+\]: request 'nobody'"),
        (lambda t: t["requests"]["0"].pop("group"), r"^requests\['0'\]\.group: missing"),
    ],
)
def test_validate_names_the_first_bad_field(demo, change, message):
    _, trace = demo
    with pytest.raises(ValueError, match=message):
        viz_trace.validate(broken(trace, change))
    with pytest.raises(ValueError, match=message):
        viz_trace.from_json(json.dumps(broken(trace, change)))


def test_from_json_refuses_what_is_not_a_trace():
    with pytest.raises(ValueError, match=r"^trace: expected dict, got list"):
        viz_trace.from_json("[]")


@pytest.mark.stage5
def test_save_and_load(demo, tmp_path):
    _, trace = demo
    path = viz_trace.save(trace, tmp_path / "demo.json")
    assert viz_trace.load(path) == trace
    assert path.stat().st_size < 50_000  # ten requests, 34 steps


@pytest.mark.stage5
def test_a_500_step_demo_run_stays_under_1_mb():
    llm, prompts, texts = run_demo_quietly(num_requests=135, max_tokens=19)  # ~23 prompt + 19 output tokens each
    trace = viz_trace.to_trace(llm, prompts, texts)
    assert len(trace["steps"]) >= 500
    assert len(viz_trace.dumps(trace).encode()) < 1_000_000
