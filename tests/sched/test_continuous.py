"""Stage 5: the continuous scheduler, step by step, with a fake model (no torch)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedlab import SamplingParams
from pagedlab.request import Request, RequestStatus
from pagedlab.sched.continuous import ContinuousScheduler
from pagedlab.sched.output import ModelRunnerOutput
from pagedlab.sched.sharing import PromptSharing
from pagedlab.stages import engine_config, get_preset, make_kv_manager
from pagedlab.worker.block_table import BlockTableBuffer, MultiGroupBlockTable

pytestmark = pytest.mark.stage5


def make(
    num_kv_blocks=32, max_num_seqs=4, budget=8, threshold=0, policy=None, caching=True, mode=None, swap=None, window=0,
    layers=(),
):  # fmt: skip
    cfg = engine_config(
        5,
        256,
        1,
        block_size=4,
        max_model_len=64,
        num_kv_blocks=num_kv_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        scheduling_policy=policy,
        enable_prefix_caching=caching,
        preemption_mode=mode,
        num_swap_blocks=swap,
    )
    cfg = replace(cfg, sliding_window=window, layer_windows=layers)  # (a model's, not settings: engine_config refuses)
    return ContinuousScheduler(cfg, make_kv_manager(cfg, get_preset(5)), PromptSharing)


def req(rid, prompt_len, max_tokens, first=2, **kw):
    return Request(
        rid,
        list(range(first, first + prompt_len)),
        SamplingParams(max_tokens=max_tokens),
        max_tokens,
        eos_token_ids=(1,),
        **kw,
    )


def step(s, token=7):
    """schedule -> fake model (samples `token` for every request that reached its end) -> update."""
    so = s.schedule()
    plan = dict(so.num_scheduled_tokens)
    samplers = [r.request_id for r in so.scheduled if r.num_computed_tokens + plan[r.request_id] == r.num_tokens]
    s.update(so, ModelRunnerOutput(samplers, [token] * len(samplers), [-0.1] * len(samplers), [None] * len(samplers)))
    return plan


@pytest.mark.task("schedule")
def test_prefill_is_chunked_by_the_budget_and_mixed_with_decodes():
    s = make(budget=8)
    a, b = req("a", 5, 3), req("b", 10, 3, first=50)
    s.add_request([a])
    s.add_request([b])
    assert step(s) == {"a": 5, "b": 3}  # a's whole prompt, then the budget's rest for b's first chunk
    assert a.output_token_ids == [7] and b.output_token_ids == []  # b's chunk does not reach its end
    assert step(s) == {"a": 1, "b": 7}  # a decodes while b finishes its prefill: one mixed batch
    assert b.output_token_ids == [7]
    assert step(s) == {"a": 1, "b": 1}


@pytest.mark.task("schedule")
def test_long_prefill_threshold_caps_each_chunk():
    # The cap keeps a long prefill from starving the others, so it applies while another request is there
    # (b, decoding): alone, a would take its whole prompt at once (tests/sched/test_vllm_repros.py).
    s = make(budget=16, threshold=3)
    a, b = req("a", 8, 2), req("b", 1, 8, first=50)
    s.add_request([a])
    s.add_request([b])
    assert step(s) == {"a": 3, "b": 1}
    assert step(s) == {"a": 3, "b": 1}
    assert step(s) == {"a": 2, "b": 1} and a.output_token_ids == [7]


@pytest.mark.task("schedule")
def test_admission_stops_at_max_num_seqs_and_resumes_as_requests_finish():
    s = make(max_num_seqs=2, budget=64)
    for i, n in enumerate([1, 3, 2]):
        s.add_request([req(f"r{i}", 4, n, first=10 * i + 2)])
    assert step(s) == {"r0": 4, "r1": 4}  # r2 waits for a seat
    assert s.running == [s.running[0]] and s.running[0].request_id == "r1"  # r0 finished (max_tokens 1)
    assert step(s) == {"r1": 1, "r2": 4}  # r2 takes the seat r0 left, in the same step r1 decodes


@pytest.mark.task("preempt")
@pytest.mark.task("victim")
def test_recompute_preemption_of_the_newest_request():
    # 5 blocks of 4 slots. a and b each hold 2 blocks after prefill; growing past 8 tokens needs a third.
    s = make(num_kv_blocks=5, budget=64)
    a, b = req("a", 7, 10), req("b", 7, 10, first=40)
    s.add_request([a])
    s.add_request([b])
    step(s)  # both prefilled: 7 tokens computed + 1 sampled each
    assert s.kv.num_free_blocks == 1
    assert step(s) == {"a": 1, "b": 1}  # tokens 7: still in block 1
    plan = step(s)  # tokens 8 need block 2: a takes the last free block, b finds none
    assert plan == {"a": 1}  # b, the newest, was preempted; nobody is admitted in that step
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert list(s.waiting) == [b] and s.num_preemptions == 1
    assert s.kv.get_block_ids(b) == [] and len(b.output_token_ids) == 2  # its tokens are kept; KV recomputed
    s.check_invariants()


@pytest.mark.task("preempt")
def test_nobody_is_admitted_in_a_step_that_preempted():
    # As vLLM v1: the blocks a preemption frees are not handed to a waiting request in the same step.
    s = make(num_kv_blocks=5, budget=64, policy="priority")
    a, b = req("a", 7, 10, arrival_time=0.0), req("b", 7, 10, first=40, arrival_time=1.0)
    s.add_request([a])
    s.add_request([b])
    step(s)
    step(s)  # a and b hold 2 blocks each; 1 is free
    c = req("c", 2, 2, first=80, priority=-1, arrival_time=2.0)  # urgent, and small enough for the free block
    s.add_request([c])
    assert step(s) == {"a": 1}  # a took the last block, b was preempted: 2 blocks free, but c waits
    assert b.status == RequestStatus.PREEMPTED and c.status == RequestStatus.WAITING
    assert [r.request_id for r in s.waiting] == ["c", "b"]  # by priority
    assert "c" in step(s)  # admitted in the next step


@pytest.mark.task("preempt")
def test_a_preempted_request_goes_back_to_the_front_of_the_queue():
    s = make(num_kv_blocks=5, max_num_seqs=2, budget=64)
    a, b, c = req("a", 7, 10), req("b", 7, 10, first=40), req("c", 2, 2, first=80)
    for r in (a, b, c):
        s.add_request([r])
    step(s)
    step(s)  # a and b run; c waits for a seat
    assert [r.request_id for r in s.waiting] == ["c"]
    assert step(s) == {"a": 1}  # b preempted
    assert [r.request_id for r in s.waiting] == ["b", "c"]  # in front of the request that was already waiting


@pytest.mark.task("preempt")
def test_a_preempted_request_comes_back_through_the_prefix_cache():
    s = make(num_kv_blocks=5, budget=64)
    a, b = req("a", 7, 4), req("b", 7, 10, first=40)
    s.add_request([a])
    s.add_request([b])
    for _ in range(3):
        step(s)  # b preempted in the third step
    assert b.status == RequestStatus.PREEMPTED
    while b.status != RequestStatus.RUNNING:
        step(s)
    assert s.kv.prefix_cache_hits >= 4  # b's first full block was still cached


@pytest.mark.task("preempt")
@pytest.mark.task("swap")
def test_swap_preemption_keeps_progress_and_resumes_by_swapping_in():
    s = make(num_kv_blocks=5, budget=64, mode="swap", swap=4)
    a, b = req("a", 7, 4), req("b", 7, 10, first=40)
    s.add_request([a])
    s.add_request([b])
    step(s)
    step(s)
    so = s.schedule()  # tokens 8 need a third block each: b is swapped out
    assert so.swap_out == [(2, 0), (3, 1)] and b.num_computed_tokens == 8 and s.kv.is_swapped(b)
    assert [r.request_id for r in so.scheduled] == ["a"]
    s.update(so, ModelRunnerOutput(["a"], [7], [0.0], [None]))
    while not a.status.is_finished():
        step(s)
    so = s.schedule()  # a finished: b's two blocks come back into new GPU blocks, then it decodes
    assert [cpu for cpu, _ in so.swap_in] == [0, 1] and so.num_scheduled_tokens == {"b": 1}
    assert s.kv.swap_pool.num_free == 4 and b.status == RequestStatus.RUNNING
    s.check_invariants()


@pytest.mark.task("preempt")
def test_a_full_swap_pool_falls_back_to_recompute():
    s = make(num_kv_blocks=5, budget=64, mode="swap", swap=1)  # b's 2 blocks do not fit in 1
    a, b = req("a", 7, 4), req("b", 7, 10, first=40)
    s.add_request([a])
    s.add_request([b])
    step(s)
    step(s)
    so = s.schedule()
    assert so.swap_out == [] and b.num_computed_tokens == 0 and not s.kv.is_swapped(b)


@pytest.mark.task("preempt")
@pytest.mark.task("victim")
def test_priority_victim_is_the_least_urgent_and_its_budget_is_refunded():
    s = make(num_kv_blocks=5, budget=64, policy="priority")
    lax, urgent = req("lax", 7, 10, first=40, priority=5), req("urgent", 7, 10, priority=0, arrival_time=1.0)
    s.add_request([lax])
    step(s)  # lax alone: 7 prompt tokens
    s.add_request([urgent])
    assert step(s) == {"lax": 1, "urgent": 7}
    assert step(s) == {"lax": 1, "urgent": 1}  # lax's token 8 took the last free block
    # Now lax (first in the running list) is scheduled, then urgent's token 8 finds no block: the least
    # urgent running request, lax, is preempted although it was already given a token this step,
    # and that token goes back to the budget.
    so = s.schedule()
    assert so.num_scheduled_tokens == {"urgent": 1} and [r.request_id for r in so.scheduled] == ["urgent"]
    assert lax.status == RequestStatus.PREEMPTED and "lax" not in so.new_block_ids and "lax" in so.preempted_req_ids
    s.check_invariants()


@pytest.mark.task("preempt")
def test_a_victim_already_scheduled_this_step_gives_its_tokens_back_to_the_budget():
    """Running order lax, urgent, third. lax is given its decode token and the last free block; urgent then
    finds no block, so the least urgent request, lax, is preempted; its token goes back to the budget, where
    third's prefill chunk takes it (5 tokens of a budget of 6, not 4). third (8 tokens) was admitted because
    both of the blocks its whole prompt needs were free, though its first chunk was a single token."""
    s = make(num_kv_blocks=4, budget=6, policy="priority")
    lax = req("lax", 3, 10, priority=5, arrival_time=0.0)
    urgent, third = req("urgent", 4, 10, first=40, arrival_time=1.0), req("third", 8, 2, first=60, arrival_time=2.0)
    s.add_request([lax])
    assert step(s) == {"lax": 3}
    s.add_request([urgent])
    s.add_request([third])
    assert step(s) == {"lax": 1, "urgent": 4, "third": 1}  # 3 blocks used, 1 free
    assert step(s) == {"urgent": 1, "third": 5}
    assert lax.status == RequestStatus.PREEMPTED and s.num_preemptions == 1
    s.check_invariants()


@pytest.mark.task("preempt")
def test_priority_ties_are_broken_by_arrival_then_request_id():
    # vLLM's Request.__lt__: (priority, arrival_time, request_id).
    s = make(max_num_seqs=1, budget=64, policy="priority")
    for rid, prio, arrival in [("b", 0, 1.0), ("a", 0, 1.0), ("c", 0, 0.5), ("d", -1, 9.0)]:
        s.add_request([req(rid, 2, 1, priority=prio, arrival_time=arrival)])
    assert [r.request_id for r in s.waiting] == ["d", "c", "a", "b"]
    assert [next(iter(step(s))) for _ in range(4)] == ["d", "c", "a", "b"]


def test_a_leader_swapped_out_mid_shared_prefill_still_stops_one_short():
    """g's leader has computed 4 of the 5 prompt tokens its follower will share when it is swapped out. Swapped
    back in, it must feed only up to prompt[:-1] again: it once fed its whole prompt, sampled and finished,
    and the follower waited for a fork that never came (the stream never ended)."""
    s = make(num_kv_blocks=4, budget=4, caching=False, mode="swap", swap=1)
    s.add_request([req("a", 7, 6)])
    g = [req(f"{i}_g", 6, 1, first=30, parent_id="g", child_index=i) for i in range(2)]
    s.add_request(g)
    assert step(s) == {"a": 4}
    assert step(s) == {"a": 3, "0_g": 1}  # admitted: the 2 blocks its whole prompt needs are free
    assert step(s) == {"a": 1, "0_g": 3}
    assert step(s) == {"a": 1} and g[0].status == RequestStatus.PREEMPTED and s.kv.is_swapped(g[0])
    plans = [step(s) for _ in range(12)]
    assert {"0_g": 1} in plans and {"0_g": 1, "1_g": 1} in plans  # stop one short, fork, each feeds the last
    assert all(r.status == RequestStatus.FINISHED_LENGTH_CAPPED for r in g) and not s.has_unfinished_requests()


@pytest.mark.task("preempt")
@pytest.mark.task("victim")
def test_a_victim_tie_on_priority_and_arrival_is_broken_by_request_id():
    """Two requests with the same priority and arrival time, each needing 3 of the 4 blocks. With vLLM's key
    (priority, arrival) the tie goes to whichever runs first, and running order flips at every re-admission:
    each preempted the other just before it finished, for ever (a random stream found it). By request id,
    as the waiting queue orders them, "a" is never the victim and both end."""
    s = make(num_kv_blocks=4, budget=4, threshold=1, policy="priority", caching=False)
    a, b = req("a", 5, 6, arrival_time=1.0), req("b", 5, 6, first=30, arrival_time=1.0)
    s.add_request([a])
    s.add_request([b])
    for _ in range(60):
        step(s)
        assert a.status != RequestStatus.PREEMPTED
        if not s.has_unfinished_requests():
            break
    assert a.status == b.status == RequestStatus.FINISHED_LENGTH_CAPPED and s.num_preemptions >= 1


@pytest.mark.task("preempt")
def test_an_n_group_is_admitted_and_preempted_as_one_unit():
    s = make(num_kv_blocks=32, budget=64)
    group = [req(f"{i}_g", 6, 4, parent_id="g", child_index=i) for i in range(3)]
    s.add_request(group)
    assert step(s) == {"0_g": 5}  # the leader prefills all but the last prompt token; the others wait
    assert step(s) == {"0_g": 1, "1_g": 1, "2_g": 1}  # forked: every child feeds the last token itself
    victims = s._victim_group()
    assert {r.request_id for r in victims} == {"0_g", "1_g", "2_g"}


@pytest.mark.task("preempt")
def test_a_follower_forked_and_preempted_in_the_same_step_gets_no_table():
    """a holds block 0; g's leader is admitted (its whole 9-token prompt fits the 3 free blocks) and prefills 8
    of its 9 prompt tokens into blocks 1 and 2. Next step the follower 1_g is forked first (it shares [1, 2])
    and its table is due to be sent; a takes the last free block for its fifth token, the leader finds none
    for its last prompt token, and the newest group, g (the leader's own), is preempted whole. The follower's
    table was just freed: it must leave the output, or the runner installs blocks 1_g no longer owns and
    appends its next blocks after them."""
    s = make(num_kv_blocks=4, budget=16, caching=False)
    s.add_request([req("a", 3, 10)])
    assert step(s) == {"a": 3}
    s.add_request([req(f"{i}_g", 9, 2, first=30, parent_id="g", child_index=i) for i in range(2)])
    assert step(s) == {"a": 1, "0_g": 8}
    so = s.schedule()
    assert so.preempted_req_ids == {"0_g", "1_g"} and so.num_scheduled_tokens == {"a": 1}
    assert so.new_block_tables == {} and so.new_block_ids == {"a": [3]} and so.block_copies == []
    assert s.kv.get_block_ids(s.running[0]) == [0, 3] and s.kv.num_free_blocks == 2


@pytest.mark.task("schedule")
def test_the_priority_policy_picks_the_lowest_value_first():
    s = make(max_num_seqs=1, budget=64, policy="priority")
    s.add_request([req("late-urgent", 3, 1, priority=-1, arrival_time=2.0)])
    s.add_request([req("early-normal", 3, 1, priority=0, arrival_time=1.0)])
    assert step(s) == {"late-urgent": 3}
    assert step(s) == {"early-normal": 3}


def pending_forks(s) -> set[str]:
    """Requests whose fork may be sent by the next schedule(): followers waiting for their leader, and new
    beams that update() forked."""
    families = getattr(s.sharing, "waiting_for_fork", {})  # (no sharing before stage 3)
    followers = {r.request_id for family in families.values() for r in family[1:]}
    return followers | {r.request_id for r in s._unsent_tables}


def forks_preempted_in_their_step(s, before: set[str]) -> set[str]:
    """Of `before` (pending_forks ahead of a step), those forked in that step and preempted in it too."""
    still = pending_forks(s)
    live = {r.request_id: r for r in list(s.waiting)}
    return {i for i in before - still if i in live and live[i].status == RequestStatus.PREEMPTED}


REACHED = {"fork preempted in its step": 0, "hits outnumber the window's cap": 0}  # corners the streams reach


@settings(max_examples=400)  # ~2 s: enough streams to reach a fork preempted in its step several times
@given(
    stream=st.lists(
        st.tuples(st.integers(1, 14), st.integers(1, 6), st.integers(0, 3), st.sampled_from([1, 2])),
        min_size=1,
        max_size=12,
    ),
    num_kv_blocks=st.integers(4, 12),  # tight: preemption in most streams
    budget=st.integers(4, 24),
    threshold=st.sampled_from([0, 1, 1, 3]),  # 1-token chunks: a fork lands in many different steps
    max_num_seqs=st.integers(2, 4),
    aborts=st.lists(st.integers(0, 11), max_size=3),
    caching=st.booleans(),
    mode=st.sampled_from(["recompute", "swap"]),
    policy=st.sampled_from(["fcfs", "priority"]),
    swap=st.integers(1, 12),
)
def random_stream(stream, num_kv_blocks, budget, threshold, max_num_seqs, aborts, caching, mode, policy, swap):
    """Random arrivals (n = 1 or 2), aborts and tiny pools: after every step the invariants hold, and a
    runner's tables kept from the outputs alone (worker/block_table.py) are the KV manager's."""
    s = make(num_kv_blocks, max_num_seqs, budget, threshold, policy=policy, caching=caching, mode=mode, swap=swap)
    run_stream(s, stream, aborts, starts=3)


@settings(max_examples=300)
@given(
    stream=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 4), st.integers(0, 6), st.sampled_from([1, 1, 2])),
        min_size=2,
        max_size=8,
    ),
    num_kv_blocks=st.integers(6, 12),
    budget=st.integers(3, 6),  # small chunks: a request's cap is the window plus a few tokens
    window=st.sampled_from([4, 8, 12]),
    max_num_seqs=st.integers(2, 3),
    aborts=st.lists(st.integers(0, 11), max_size=2),
)
def random_window_stream(stream, num_kv_blocks, budget, window, max_num_seqs, aborts):
    """A sliding window with prefix caching, small chunks and a tight pool: hits behind the window are null blocks,
    so a waiting request's hits can outnumber the blocks it may ever hold at once (the window's cap)."""
    s = make(num_kv_blocks, max_num_seqs, budget, caching=True, window=window)
    run_stream(s, stream, aborts, starts=1)  # every prompt a prefix of the longer ones


@settings(max_examples=300)
@given(
    stream=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 6), st.integers(0, 6), st.sampled_from([1, 1, 2])),
        min_size=2,
        max_size=8,
    ),
    num_kv_blocks=st.integers(12, 24),  # two groups share it: tight
    budget=st.integers(3, 8),
    threshold=st.sampled_from([0, 1, 3]),
    layers=st.sampled_from([(None, 8), (8, None, 8, None), (None, 4, 4, 4, 4, 4), (None, 12, None, 4)]),
    max_num_seqs=st.integers(2, 3),
    aborts=st.lists(st.integers(0, 11), max_size=2),
    caching=st.booleans(),
    mode=st.sampled_from(["recompute", "swap"]),
)
def random_hybrid_stream(stream, num_kv_blocks, budget, threshold, layers, max_num_seqs, aborts, caching, mode):
    """A hybrid model (full and sliding layers: two KV cache groups or more over one pool), prefix caching,
    preemption by recompute or swap, n = 2 and aborts: the invariants hold across every group, and a runner's
    per-group tables kept from the outputs alone are the KV manager's."""
    s = make(num_kv_blocks, max_num_seqs, budget, threshold, caching=caching, mode=mode, swap=8, layers=layers)
    run_stream(s, stream, aborts, starts=1)


def run_stream(s, stream, aborts, starts):
    """Run (prompt length, max_tokens, arrival step, n) requests through `s`, aborting a group at each step in
    `aborts`, checking every invariant and the runner's tables after every step. Request i's prompt counts up
    from 2 + i % starts, so prompts that start alike share their prefix."""
    groups = []
    for i, (prompt_len, max_tokens, arrive_at, n) in enumerate(stream):
        kw = dict(first=2 + (i % starts), priority=i % 2, arrival_time=float(arrive_at))
        if n == 1:
            group = [req(f"r{i}", prompt_len, max_tokens, **kw)]
        else:
            group = [req(f"{c}_r{i}", prompt_len, max_tokens, parent_id=f"r{i}", child_index=c, **kw) for c in range(n)]
        if s.kv.can_ever_admit(group):
            groups.append((arrive_at, group))
    pending = sorted(groups, key=lambda x: x[0])
    hybrid = hasattr(s.kv, "managers")
    runner_tables = MultiGroupBlockTable(len(s.kv.managers), 4, 64) if hybrid else BlockTableBuffer(4, 64)
    window = s.kv.managers[-1].window if hybrid else s.kv.window  # (the hybrid streams: the last group slides)
    cap = window.max_blocks_held(s.config.max_num_batched_tokens, s.config.max_model_len)
    null = None if s.kv.null_block is None else s.kv.null_block.block_id
    for t in range(400):
        while pending and pending[0][0] <= t:
            s.add_request(pending.pop(0)[1])
        if t in aborts and groups:
            s.finish_requests([r.request_id for r in groups[t % len(groups)][1]], RequestStatus.FINISHED_ABORTED)
        forks, waiting = pending_forks(s), list(s.waiting)
        so = s.schedule()
        REACHED["fork preempted in its step"] += bool(forks_preempted_in_their_step(s, forks))
        admitted_on_hits = [r.num_computed_tokens // 4 for r in waiting if r in so.scheduled]
        REACHED["hybrid hit"] = REACHED.get("hybrid hit", 0) + (hybrid and any(admitted_on_hits))
        REACHED["hits outnumber the window's cap"] += cap is not None and any(n >= cap for n in admitted_on_hits)
        assert so.total_num_scheduled_tokens <= s.config.max_num_batched_tokens
        assert len(s.running) <= s.config.max_num_seqs
        runner_tables.apply(so)
        runner_tables.check_matches({r.request_id: s.kv.get_block_ids(r) for r in s.running}, null)
        fed = so.num_scheduled_tokens
        samplers = [r.request_id for r in so.scheduled if r.num_computed_tokens + fed[r.request_id] == r.num_tokens]
        s.update(so, ModelRunnerOutput(samplers, [7] * len(samplers), [0.0] * len(samplers), [None] * len(samplers)))
        s.check_invariants()
        if not pending and not s.has_unfinished_requests():
            break
    assert not s.has_unfinished_requests(), "every request ends"
    assert all(r.status.is_finished() for _, group in groups for r in group)
    assert s.kv.num_free_blocks == s.kv.pool.num_usable, "no block leaked"


@pytest.mark.task("schedule")
@pytest.mark.task("preempt")
@pytest.mark.task("victim")
def test_random_streams_keep_every_invariant():
    """The streams above, and proof that they reach the corner that once broke the runner's tables."""
    REACHED["fork preempted in its step"] = 0
    random_stream()
    assert REACHED["fork preempted in its step"] > 0, "no stream forked a request and preempted it in one step"


@pytest.mark.task("schedule")
def test_random_hybrid_streams_keep_every_invariant():
    """The hybrid streams above, and proof that they reach a prefix-cache hit that every group serves."""
    REACHED["hybrid hit"] = 0
    random_hybrid_stream()
    assert REACHED["hybrid hit"] > 0, "no stream admitted a hybrid request on a prefix-cache hit"


@pytest.mark.task("schedule")
def test_random_window_streams_keep_every_invariant():
    """The window's streams above, and proof that they admit a request whose hits reach the window's cap (the
    corner where only the chunk's own count, uncapped, says whether a block is free for it)."""
    REACHED["hits outnumber the window's cap"] = 0
    random_window_stream()
    assert REACHED["hits outnumber the window's cap"] > 0, "no stream admitted a request on that many hits"
