"""Course: stage 1's scenarios: the contiguous reservation, and static scheduling.

Builds on: kv/contiguous.py, sched/static.py, course/scenarios/common.py.
Read with: chapters/98-assignments.md (Scenarios), chapters/01-contiguous-static.md.
"""

from __future__ import annotations

from pagedlab.course.scenarios import TaskScenarios
from pagedlab.course.scenarios.common import Arrival, attempt, random_arrivals, story
from pagedlab.kv.contiguous import ContiguousKVCacheManager
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams


def reservation_program(num_blocks: int, block_size: int, max_model_len: int, ops: list) -> list:
    """Ops on a ContiguousKVCacheManager over requests 0..9: ("admit", group, running) asks can_admit,
    ("ever", group) can_ever_admit, ("grow", who, n) allocate_slots (n tokens count as computed when it succeeds),
    ("free", who). After each: its result, every request's blocks, the free regions, num_free_blocks."""
    kv = ContiguousKVCacheManager(num_blocks, block_size, max_model_len)
    reqs = [Request(f"r{i}", [2, 3], SamplingParams(max_tokens=2), 2) for i in range(10)]
    calls = {
        "admit": lambda group, running: kv.can_admit([reqs[i] for i in group], [reqs[i] for i in running]),
        "ever": lambda group: kv.can_ever_admit([reqs[i] for i in group]),
        "grow": lambda who, n: kv.allocate_slots(reqs[who], n),
        "free": lambda who: kv.free(reqs[who]),
    }
    seen = []
    for op, *args in ops:
        result = attempt(calls[op], *args, says=("outgrew",))
        if op == "grow" and result[0] == "ok" and result[1] is not None:
            reqs[args[0]].num_computed_tokens += args[1]
        held = {r.request_id: kv.get_block_ids(r) for r in reqs if kv.get_block_ids(r)}
        seen.append([op, args, result, held, sorted(kv.free_regions), kv.num_free_blocks])
    return seen


def regions_are_first_fit(rng):
    ops = [("grow", 0, 3), ("grow", 1, 5), ("grow", 2, 1), ("free", 0), ("grow", 3, 2), ("grow", 0, 1), ("grow", 4, 1)]
    return reservation_program(12, 4, 16, ops)


def admission_counts_pending_regions(rng):
    ops = [("admit", [0, 1], []), ("grow", 0, 2), ("admit", [2], [0, 1]), ("admit", [2, 3], [0, 1]),
           ("ever", [0, 1, 2]), ("ever", [0, 1, 2, 3]), ("free", 0), ("admit", [2, 3], [1])]  # fmt: skip
    return reservation_program(12, 4, 16, ops)


def freeing_twice_and_outgrowing(rng):
    ops = [("grow", 0, 3), ("free", 0), ("free", 0), ("grow", 1, 8), ("grow", 1, 1), ("free", 5), ("grow", 2, 2)]
    return reservation_program(8, 4, 8, ops)


def reservation_random(rng):
    if rng.random() < 0.4:
        arrivals = random_arrivals(rng, 1, rng.randrange(3, 8), 32)
        return story(1, arrivals, block_size=rng.choice((2, 4)), num_kv_blocks=rng.randrange(16, 48), max_model_len=32)
    block_size, max_len = rng.choice((1, 2, 4)), rng.choice((8, 12, 16))
    ops = []
    for _ in range(25):
        op = rng.choice(("admit", "ever", "grow", "grow", "grow", "free"))
        group = rng.sample(range(10), rng.randrange(1, 4))
        if op == "admit":
            ops.append((op, group, rng.sample(range(10), rng.randrange(0, 4))))
        elif op == "ever":
            ops.append((op, group))
        else:
            ops.append((op, rng.randrange(10), rng.randrange(1, 6)) if op == "grow" else (op, rng.randrange(10)))
    return reservation_program(rng.randrange(4, 30), block_size, max_len, ops)


def static_story(rng, arrivals, **settings):
    return story(1, arrivals, **({"block_size": 4, "num_kv_blocks": 8, "max_model_len": 16} | settings))


def a_batch_runs_to_completion_before_the_next(rng):
    arrivals = [Arrival(0, "a", [2, 3, 4], 1), Arrival(0, "b", [5, 6, 7, 8, 9], 3), Arrival(0, "c", [2, 3], 1)]
    return static_story(rng, arrivals, max_num_seqs=2)


def max_num_seqs_and_the_token_budget_cap_a_batch(rng):
    arrivals = [Arrival(0, r, [2 + i] * (3 + i), 2) for i, r in enumerate("abcd")] + [Arrival(2, "e", [9] * 4, 3)]
    seats = static_story(rng, arrivals, max_num_seqs=2, num_kv_blocks=16, max_num_batched_tokens=64)
    budget = static_story(rng, arrivals, max_num_seqs=4, num_kv_blocks=16, max_num_batched_tokens=12)
    return {"seats": seats, "budget": budget}


def regions_run_out_before_seats(rng):
    # (Stage 1's stories run stage 1's parts only: a student copy of stage 1 holds no later stage's answers.)
    arrivals = random_arrivals(rng, 1, 6, 32)
    return story(1, arrivals, block_size=2, num_kv_blocks=40, max_num_seqs=4, max_model_len=32)


def static_random(rng):
    arrivals = random_arrivals(rng, 1, rng.randrange(3, 9), 32)
    settings = {"block_size": rng.choice((1, 2, 4)), "max_num_seqs": rng.randrange(1, 5), "max_model_len": 32}
    settings["num_kv_blocks"] = rng.randrange(24, 80)
    settings["max_num_batched_tokens"] = rng.choice((32, 48, 64))
    return story(1, arrivals, **settings)


SCENARIOS = [
    TaskScenarios(
        "contiguous-reservation",
        ("static-schedule",),
        (regions_are_first_fit, admission_counts_pending_regions, freeing_twice_and_outgrowing),
        reservation_random,
    ),
    TaskScenarios(
        "static-schedule",
        ("contiguous-reservation",),
        (a_batch_runs_to_completion_before_the_next, max_num_seqs_and_the_token_budget_cap_a_batch,
         regions_run_out_before_seats),
        static_random,
    ),
]  # fmt: skip
