"""Stage 5: a run as data (engine/replay.py): the engine records it with record_trace=True, and ReplayEngine plays it
back through the stage-5 scheduler with the recorded tokens and no model, step for step the same run."""

import pytest

from pagedlab import LLM, SamplingParams
from pagedlab.engine.replay import ReplayEngine
from pagedlab.lessons.demo import DemoOptions, demo_trace
from pagedlab.viz.trace import to_trace

pytestmark = pytest.mark.stage5
DECISIONS = ("scheduled", "prefills", "waiting", "running", "preempted", "finished", "tables", "used", "pool",
             "num_cached_tokens")  # fmt: skip


def decided(trace: dict) -> list[dict]:
    return [{k: s[k] for k in DECISIONS} for s in trace["steps"]]


@pytest.mark.parametrize("opts", [{}, {"scheduling_policy": "priority"}, {"num_kv_blocks": 14}], ids=str)
def test_a_replay_of_the_demo_is_the_demo(opts):
    real = demo_trace(DemoOptions(**opts))
    assert decided(to_trace(ReplayEngine(real["recording"]).run())) == decided(real)


def test_the_recording_holds_what_decides_a_schedule():
    llm = LLM(stage=5, block_size=4, num_kv_blocks=16, max_num_seqs=2, record_trace=True)
    llm.engine.add_request("a", [1, 5, 6, 7, 8], SamplingParams(max_tokens=3, temperature=0.0), priority=0)
    llm.engine.step()
    llm.engine.add_request("b", [1, 9], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    recording = to_trace(llm)["recording"]
    a, b = recording["requests"]
    assert (a["id"], a["prompt_token_ids"], a["arrival_step"], a["max_tokens"]) == ("a", [1, 5, 6, 7, 8], 1, 3)
    assert (b["id"], b["arrival_step"], b["ignore_eos"], len(b["output_token_ids"])) == ("b", 2, True, 2)
    assert recording["config"]["block_size"] == 4 and recording["ends"] == []


def test_an_abort_is_recorded_as_an_end_after_its_step():
    llm = LLM(stage=5, block_size=4, num_kv_blocks=16, record_trace=True)
    llm.engine.add_request("a", [1, 5, 6], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    llm.engine.add_request("b", [1, 7], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    llm.engine.step()
    llm.engine.step()
    llm.engine.abort_request("a")
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    real = to_trace(llm)
    assert real["recording"]["ends"] == [[2, "a", "abort"]]
    assert decided(to_trace(ReplayEngine(real["recording"]).run())) == decided(real)


def test_a_run_with_n_children_cannot_be_recorded():
    llm = LLM(stage=5, record_trace=True)
    llm.generate(["ROMEO:"], SamplingParams(n=2, max_tokens=2, seed=1), use_tqdm=False)
    assert to_trace(llm)["recording"] is None
    with pytest.raises(ValueError, match="replay: request '0' has n = 2 children"):
        llm.engine.recorder.recording(llm.engine.config)
