"""Stage 1: the static scheduler, step by step, with a fake model (no torch)."""

import pytest

from pagedlab import SamplingParams
from pagedlab.kv.contiguous import ContiguousKVCacheManager
from pagedlab.request import Request, RequestStatus
from pagedlab.sched.output import ModelRunnerOutput
from pagedlab.sched.static import StaticScheduler
from pagedlab.stages import engine_config

pytestmark = [pytest.mark.stage1, pytest.mark.task("static-schedule")]


def make(max_num_seqs=2, num_kv_blocks=8, max_num_batched_tokens=64):
    # block_size 4, max_model_len 16: a region is 4 blocks, so 8 blocks hold 2 regions.
    cfg = engine_config(
        1,
        64,
        1,
        block_size=4,
        max_model_len=16,
        num_kv_blocks=num_kv_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return StaticScheduler(cfg, ContiguousKVCacheManager.from_config(cfg))


def req(rid, prompt_len, max_tokens, **kw):
    return Request(
        rid, list(range(2, 2 + prompt_len)), SamplingParams(max_tokens=max_tokens), max_tokens, eos_token_ids=(1,), **kw
    )


def fake_sample(so, token=7):
    """Every scheduled request samples `token` (as a model would after a full prefill or a decode)."""
    ids = [r.request_id for r in so.scheduled]
    return ModelRunnerOutput(ids, [token] * len(ids), [-0.5] * len(ids), [None] * len(ids))


def test_a_static_batch_runs_to_completion_before_the_next():
    s = make()
    a, b, c = req("a", 3, 1), req("b", 5, 3), req("c", 2, 1)
    for r in (a, b, c):
        s.add_request([r])
    # Step 1: a and b fill both regions; c waits. Whole prompts are prefilled at once.
    so = s.schedule()
    assert [r.request_id for r in so.scheduled] == ["a", "b"] and so.num_scheduled_tokens == {"a": 3, "b": 5}
    assert so.new_block_ids == {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]} and so.new_block_tables == {}
    s.update(so, fake_sample(so))
    assert a.status == RequestStatus.FINISHED_LENGTH_CAPPED  # max_tokens 1
    assert s.kv.region_of == {"b": 1}
    # Step 2: a's region is free, but a static batch admits nobody until it is done.
    so = s.schedule()
    assert [r.request_id for r in so.scheduled] == ["b"] and so.num_scheduled_tokens == {"b": 1}
    assert so.new_block_tables == so.new_block_ids == {}  # the runner already has b's region
    assert so.finished_req_ids == {"a"} and [r.request_id for r in s.waiting] == ["c"]
    s.update(so, fake_sample(so))
    so = s.schedule()
    s.update(so, fake_sample(so))
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED and b.output_token_ids == [7, 7, 7]
    # Step 4: the batch is done; c is admitted into the first free region.
    so = s.schedule()
    assert [r.request_id for r in so.scheduled] == ["c"]
    assert so.new_block_ids == {"c": [0, 1, 2, 3]}
    s.update(so, fake_sample(so))
    assert not s.has_unfinished_requests()
    s.check_invariants()
    assert s.kv.num_used_blocks == 0


def test_token_budget_limits_the_batch():
    s = make(max_num_batched_tokens=6)
    s.add_request([req("a", 3, 2)])
    s.add_request([req("b", 5, 2)])
    so = s.schedule()
    assert [r.request_id for r in so.scheduled] == ["a"]  # 3 + 5 > 6


def test_an_n_group_is_admitted_as_one_unit():
    s = make(max_num_seqs=3, num_kv_blocks=12)  # 3 regions
    s.add_request([req("x", 2, 2)])
    group = [req(f"{i}_g", 2, 2, parent_id="g", child_index=i) for i in range(3)]
    s.add_request(group)
    so = s.schedule()
    # x takes one region; the group needs three at once, so it waits whole.
    assert [r.request_id for r in so.scheduled] == ["x"]
    assert len(s.waiting) == 1 and [r.request_id for r in s.waiting] == ["0_g", "1_g", "2_g"]


def test_eos_and_stop_token_ids_finish_with_stop():
    s = make()
    a = req("a", 2, 5)
    b = Request("b", [2, 3], SamplingParams(max_tokens=5, stop_token_ids=[9]), 5, eos_token_ids=(1,))
    s.add_request([a])
    s.add_request([b])
    so = s.schedule()
    s.update(so, ModelRunnerOutput(["a", "b"], [1, 9], [-1.0, -1.0], [None, None]))
    assert a.status == b.status == RequestStatus.FINISHED_STOPPED
    assert a.output_token_ids == [1] and b.output_token_ids == [9]  # the stopping token is kept


def test_eos_is_checked_before_length_as_vllm_does():
    # vLLM's current check_stop order is EOS, stop token ids, then length (length came first up to v0.10).
    s = make(max_num_seqs=3, num_kv_blocks=12)
    a, b = req("a", 2, 1), Request("b", [2, 3], SamplingParams(max_tokens=1, stop_token_ids=[9]), 1)
    c = req("c", 2, 1)
    for r in (a, b, c):
        s.add_request([r])
    so = s.schedule()
    s.update(so, ModelRunnerOutput(["a", "b", "c"], [1, 9, 5], [-1.0] * 3, [None] * 3))  # all at max_tokens
    assert a.status == b.status == RequestStatus.FINISHED_STOPPED  # EOS, a stop token id: "stop"
    assert c.status == RequestStatus.FINISHED_LENGTH_CAPPED  # anything else: "length"


def test_requests_that_can_never_fit():
    s = make(max_num_seqs=2, num_kv_blocks=8, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="n: 3 children exceed max_num_seqs"):
        s.check_admissible([req(str(i), 2, 2) for i in range(3)])
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        s.check_admissible([req("a", 10, 2), req("b", 10, 2)])
    s1 = make(max_num_seqs=4, num_kv_blocks=8)
    with pytest.raises(ValueError, match="num_kv_blocks: 8 blocks can never hold"):
        s1.check_admissible([req(str(i), 2, 2) for i in range(3)])


def test_abort_a_waiting_and_a_running_request():
    s = make()
    a, b, c = req("a", 2, 5), req("b", 2, 5), req("c", 2, 5)
    for r in (a, b, c):
        s.add_request([r])
    s.schedule()
    ended = s.finish_requests(["a", "c"], RequestStatus.FINISHED_ABORTED)
    assert {r.request_id for r in ended} == {"a", "c"}
    assert a.status == c.status == RequestStatus.FINISHED_ABORTED
    assert s.kv.region_of == {"b": 1} and not s.waiting
    s.check_invariants()
