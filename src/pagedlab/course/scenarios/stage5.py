"""Course: stage 5's scenarios: swapping, continuous scheduling, preemption, the victim rules.

Builds on: kv/swap.py, sched/continuous.py, sched/queue.py, course/scenarios/common.py.
Read with: chapters/98-assignments.md (Scenarios), chapters/05-continuous-batching.md.
"""

from __future__ import annotations

from pagedlab.course.scenarios import TaskScenarios
from pagedlab.course.scenarios.common import Arrival, attempt, random_arrivals, story
from pagedlab.kv.swap import SwappingKVCacheManager
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams
from pagedlab.sched.queue import least_urgent, newest


def continuous(arrivals, **settings) -> dict:
    base = {"block_size": 4, "num_kv_blocks": 16, "max_num_seqs": 4, "max_num_batched_tokens": 8}
    return story(5, arrivals, **(base | settings))


def pressure(rng, groups: float = 0.0, **settings) -> dict:
    """Random arrivals on a pool a little larger than one request's worst case, so that running requests that
    grow must preempt one another; `groups`: the share of arrivals that are n = 2 groups (preempted whole)."""
    arrivals = random_arrivals(rng, 5, rng.randrange(4, 9), 48, prefixes=rng.randrange(0, 3))
    for a in arrivals:
        a.max_tokens, a.step = rng.randrange(6, 15), a.step // 2
        a.n = 2 if a.n > 1 or (not a.beam_width and rng.random() < groups) else 1
        a.prompt = a.prompt[: 48 - a.max_tokens - 1]
    block_size = settings.get("block_size") or rng.choice((1, 2, 4))
    settings = {
        "block_size": block_size,
        "max_num_seqs": rng.randrange(3, 6),
        "max_num_batched_tokens": rng.choice((6, 8, 16, 32)),
        "long_prefill_token_threshold": rng.choice((0, 0, 3, 5)),
        "scheduling_policy": rng.choice(("fcfs", "priority")),
        "enable_prefix_caching": rng.random() < 0.8,
        "max_model_len": 48,
    } | settings
    worst = max((len(a.prompt) + a.max_tokens) * max(a.n, a.beam_width) for a in arrivals)
    settings.setdefault("num_kv_blocks", -(-worst // block_size) + rng.randrange(0, 3))
    return story(5, arrivals, steps=80, **settings)


# -- swap ---------------------------------------------------------------------------------------------------------


def swap_program(num_blocks: int, num_swap: int, ops: list) -> list:
    """On a SwappingKVCacheManager (block_size 4): ("admit", who, tokens) as the scheduler admits a prompt,
    ("fork", parent, child), ("grow", who, n), ("can", [who..]) can_swap_out, ("out", who), ("need", who, n)
    blocks_to_swap_in, ("in", who), ("free", who). After each: its result, the tables, the CPU pool, free queue."""
    kv = SwappingKVCacheManager(num_blocks, 4, max_model_len=128, num_swap_blocks=num_swap)
    reqs = [Request(f"r{i}", list(range(10 * i + 2, 10 * i + 12)), SamplingParams(max_tokens=8), 8) for i in range(5)]

    def admit(who, tokens):
        r = reqs[who]
        r.all_token_ids[:] = r.all_token_ids[:tokens]
        r.num_computed_tokens = kv.lookup_prefix(r)
        got = kv.allocate_slots(r, r.num_tokens - r.num_computed_tokens)
        r.num_computed_tokens = r.num_tokens
        return got

    def fork(parent, child):
        kv.fork(reqs[parent], reqs[child])
        reqs[child].num_computed_tokens = reqs[parent].num_computed_tokens

    calls = {
        "admit": admit, "fork": fork, "grow": lambda who, n: kv.allocate_slots(reqs[who], n),
        "can": lambda group: kv.can_swap_out([reqs[i] for i in group]),
        "out": lambda who: kv.swap_out(reqs[who]), "need": lambda who, n: kv.blocks_to_swap_in(reqs[who], n),
        "in": lambda who: kv.swap_in(reqs[who]), "free": lambda who: kv.free(reqs[who]),
    }  # fmt: skip
    seen = []
    for op, *args in ops:
        result = attempt(calls[op], *args)
        tables = {r.request_id: kv.get_block_ids(r) for r in reqs if kv.get_block_ids(r)}
        free = [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()]
        computed = [r.num_computed_tokens for r in reqs]
        seen.append([op, args, result, tables, kv.swap_pool.held, sorted(kv.swap_pool.free_ids), free, computed])
    return seen


def swap_out_then_in(rng):
    ops = [("admit", 0, 10), ("admit", 1, 10), ("can", [1]), ("out", 1), ("can", [0, 0]), ("admit", 2, 4),
           ("need", 1, 1), ("in", 1), ("free", 1), ("free", 0)]  # fmt: skip
    return swap_program(8, 4, ops)


def a_forked_request_swaps_its_own_copy(rng):
    ops = [("admit", 0, 6), ("fork", 0, 1), ("grow", 1, 1), ("out", 1), ("in", 1), ("out", 0), ("free", 0),
           ("free", 1)]  # fmt: skip
    return swap_program(8, 4, ops)


def swapping_in_the_scheduler(rng):
    arrivals = [Arrival(0, c, list(range(2 + 7 * i, 9 + 7 * i)), 6) for i, c in enumerate("abc")]
    return continuous(arrivals, num_kv_blocks=7, preemption_mode="swap", num_swap_blocks=8, max_num_batched_tokens=16)


def swap_random(rng):
    if rng.random() < 0.6:
        return pressure(rng, preemption_mode="swap", num_swap_blocks=rng.randrange(2, 16))
    ops, kinds = [], ("admit", "admit", "fork", "grow", "can", "out", "out", "need", "in", "in", "free")
    for _ in range(22):
        op, who = rng.choice(kinds), rng.randrange(5)
        args = {
            "admit": (who, rng.randrange(1, 11)), "fork": (who, rng.randrange(5)), "grow": (who, rng.randrange(1, 4)),
            "can": (rng.sample(range(5), rng.randrange(1, 3)),), "need": (who, rng.randrange(1, 3)),
        }.get(op, (who,))  # fmt: skip
        ops.append((op, *args))
    return swap_program(rng.randrange(6, 14), rng.randrange(2, 8), ops)


# -- schedule -----------------------------------------------------------------------------------------------------


def prefill_is_chunked_by_the_budget(rng):
    arrivals = [Arrival(0, "a", list(range(2, 7)), 3), Arrival(0, "b", list(range(50, 60)), 3)]
    return continuous(arrivals, num_kv_blocks=32)


def long_prefills_are_capped_and_seats_are_limited(rng):
    arrivals = [Arrival(0, c, [3 + i] * (4 + 3 * i), 3) for i, c in enumerate("abcde")]
    return continuous(arrivals, num_kv_blocks=40, max_num_batched_tokens=12, long_prefill_token_threshold=5,
                      max_num_seqs=3)  # fmt: skip


def prefix_hits_at_admission(rng):
    head = list(range(2, 14))
    arrivals = [Arrival(0, "a", head + [20], 2), Arrival(3, "b", head + [21, 22], 2), Arrival(3, "c", head, 2, n=2)]
    return continuous(arrivals, num_kv_blocks=24, max_num_batched_tokens=16)


def nobody_is_admitted_in_a_step_that_preempted(rng):
    arrivals = [Arrival(1, "a", [30, 34, 39, 14, 13, 34, 32, 13, 8], 7), Arrival(1, "b", [7, 36, 4, 27], 7),
                Arrival(2, "c", [2, 35, 6, 5], 4)]  # fmt: skip
    return continuous(arrivals, num_kv_blocks=6, enable_prefix_caching=False)


def schedule_random(rng):
    if rng.random() < 0.3:  # a swapped-out request comes back through admission
        return pressure(rng, preemption_mode="swap", num_swap_blocks=rng.randrange(4, 16))
    return pressure(rng, num_kv_blocks=rng.randrange(30, 64)) if rng.random() < 0.4 else pressure(rng)


# -- preempt ------------------------------------------------------------------------------------------------------


def the_newest_is_recomputed(rng):
    arrivals = [Arrival(0, c, list(range(2 + 9 * i, 10 + 9 * i)), 8) for i, c in enumerate("abc")]
    return continuous(arrivals, num_kv_blocks=8, max_num_batched_tokens=24)


def a_group_is_preempted_whole(rng):
    arrivals = [Arrival(0, "a", list(range(3, 12)), 8), Arrival(1, "b", list(range(17, 23)), 8, n=2)]
    return continuous(arrivals, num_kv_blocks=8, max_num_batched_tokens=24)


def priority_preempts_the_least_urgent(rng):
    arrivals = [Arrival(0, "a", [2] * 7, 7, priority=2), Arrival(0, "b", [3] * 7, 7, priority=0),
                Arrival(2, "c", [4] * 7, 7, priority=1)]  # fmt: skip
    return continuous(arrivals, num_kv_blocks=5, max_num_batched_tokens=24, scheduling_policy="priority")


def preempt_random(rng):
    mode = rng.choice(("recompute", "swap"))
    swap = {"preemption_mode": mode, "num_swap_blocks": rng.randrange(2, 12)} if mode == "swap" else {}
    return pressure(rng, groups=0.5, **swap)


# -- victim -------------------------------------------------------------------------------------------------------


def victims(groups: list[tuple]) -> list:
    """newest, and the group of least_urgent (a group is preempted whole), of each running list of (id, priority,
    arrival, parent)."""
    seen = []
    for running in groups:
        reqs = [Request(rid, [2], SamplingParams(max_tokens=1), 1, priority=p, arrival_time=t, parent_id=parent)
                for rid, p, t, parent in running]  # fmt: skip
        fcfs = attempt(lambda rs: newest(rs).request_id, reqs)
        seen.append([fcfs, attempt(lambda rs: least_urgent(rs).group_id, reqs)])
    return seen


def fcfs_takes_the_last_admitted_and_priority_the_least_urgent(rng):
    return victims([
        [("a", 0, 2.0, None), ("b", 0, 0.0, None), ("c", 0, 1.0, None)],
        [("b", 1, 5.0, None), ("a", 1, 5.0, None), ("z", 0, 9.0, None), ("c", 1, 4.0, None)],
        [("0_x", 1, 1.0, "x"), ("1_x", 1, 1.0, "x"), ("y", 1, 1.0, None)],
    ])  # fmt: skip


def victim_random(rng):
    if rng.random() < 0.4:
        return pressure(rng, scheduling_policy=rng.choice(("fcfs", "priority")))
    lists = []
    for _ in range(8):
        size = rng.randrange(1, 6)
        lists.append([(f"{c}{rng.randrange(3)}", rng.randrange(3), float(rng.randrange(4)), None)
                      for c in rng.sample("abcdefgh", size)])  # fmt: skip
    return victims(lists)


SCENARIOS = [
    TaskScenarios("swap", ("schedule", "preempt", "victim"),
                  (swap_out_then_in, a_forked_request_swaps_its_own_copy, swapping_in_the_scheduler), swap_random),
    TaskScenarios("schedule", ("preempt", "victim", "swap"),
                  (prefill_is_chunked_by_the_budget, long_prefills_are_capped_and_seats_are_limited,
                   prefix_hits_at_admission, nobody_is_admitted_in_a_step_that_preempted), schedule_random),
    TaskScenarios("preempt", ("schedule", "victim", "swap"),
                  (the_newest_is_recomputed, a_group_is_preempted_whole, priority_preempts_the_least_urgent),
                  preempt_random),
    TaskScenarios("victim", ("schedule", "preempt"), (fcfs_takes_the_last_admitted_and_priority_the_least_urgent,),
                  victim_random),
]  # fmt: skip
