"""Course: stage 3's scenarios: fork and copy-on-write, the n > 1 sharing protocol, one beam-search step.

Builds on: kv/cow.py, sched/sharing.py, sched/beam.py, course/scenarios/common.py.
Read with: chapters/98-assignments.md (Scenarios), chapters/03-copy-on-write.md.
"""

from __future__ import annotations

from pagedlab.course.scenarios import TaskScenarios
from pagedlab.course.scenarios.common import EOS, Arrival, attempt, random_arrivals, story
from pagedlab.kv.cow import CowKVCacheManager
from pagedlab.request import Request, RequestStatus
from pagedlab.sampling_params import BeamSearchParams, SamplingParams
from pagedlab.sched.beam import BeamGroup

# -- fork-cow -----------------------------------------------------------------------------------------------------


def cow_program(block_size: int, num_blocks: int, ops: list) -> list:
    """Ops on a CowKVCacheManager: ("grow", who, n) allocate_slots (computed on success), ("fork", parent, child),
    ("free", who). After each: its result, every table, the copies made, every ref_cnt, the free queue."""
    kv = CowKVCacheManager(num_blocks, block_size, max_model_len=256)
    reqs = [Request(f"r{i}", [2, 3, 4], SamplingParams(max_tokens=8), 8) for i in range(6)]

    def fork(parent, child):
        kv.fork(reqs[parent], reqs[child])
        reqs[child].num_computed_tokens = reqs[parent].num_computed_tokens

    def free(who):
        kv.free(reqs[who])
        reqs[who].num_computed_tokens = 0

    calls = {"grow": lambda who, n: kv.allocate_slots(reqs[who], n), "fork": fork, "free": free}
    seen = []
    for op, *args in ops:
        result = attempt(calls[op], *args)
        if op == "grow" and result[0] == "ok" and result[1] is not None:
            reqs[args[0]].num_computed_tokens += args[1]
        copies = [[c.request_id, c.index, c.src, c.dst] for c in kv.take_block_copies()]
        tables = {r.request_id: kv.get_block_ids(r) for r in reqs if kv.get_block_ids(r)}
        refs = [b.ref_cnt for b in kv.pool.blocks]
        free = [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()]
        seen.append([op, args, result, tables, copies, refs, free])
    return seen


def fork_shares_then_a_write_copies(rng):
    ops = [("grow", 0, 6), ("fork", 0, 1), ("grow", 1, 1), ("grow", 0, 1), ("grow", 1, 2), ("free", 0), ("free", 1)]
    return cow_program(4, 8, ops)


def a_full_block_is_never_copied(rng):
    ops = [("grow", 0, 8), ("fork", 0, 1), ("fork", 0, 2), ("grow", 2, 1), ("grow", 1, 1), ("free", 2), ("grow", 0, 1)]
    return cow_program(4, 10, ops)


def no_room_for_the_copy(rng):
    ops = [("grow", 0, 3), ("fork", 0, 1), ("grow", 2, 4), ("grow", 1, 1), ("free", 2), ("grow", 1, 1), ("free", 0)]
    return cow_program(4, 2, ops)


def cow_random(rng):
    if rng.random() < 0.4:
        arrivals = random_arrivals(rng, 3, rng.randrange(3, 7), 64)
        return story(3, arrivals, block_size=rng.choice((1, 2, 4)), num_kv_blocks=rng.randrange(24, 48), max_num_seqs=4)
    ops, live = [], set()
    for _ in range(24):
        op, who = rng.choice(("grow", "grow", "grow", "fork", "free")), rng.randrange(6)
        if op == "fork" and live and who not in live:
            ops.append(("fork", rng.choice(sorted(live)), who))
        elif op == "free":
            ops.append(("free", who))
        else:
            ops.append(("grow", who, rng.choice((1, 1, 2, 3, 5))))
        live = (live | {who}) - ({who} if op == "free" else set())
    return cow_program(rng.choice((1, 2, 4)), rng.randrange(4, 16), ops)


# -- n-sharing ----------------------------------------------------------------------------------------------------


def sharing_story(arrivals, **settings):
    return story(3, arrivals, **({"block_size": 4, "num_kv_blocks": 32, "max_num_seqs": 6} | settings))


def n_children_share_the_prompt(rng):
    return sharing_story([Arrival(0, "a", [2, 3, 4, 5, 6, 7, 8, 9, 10], 3, n=3), Arrival(1, "b", [4] * 6, 2)])


def a_one_token_prompt_shares_nothing(rng):
    return sharing_story([Arrival(0, "a", [5], 3, n=2), Arrival(0, "b", [2, 3, 4, 5], 2, n=2)], block_size=2)


def sharing_random(rng):
    arrivals = random_arrivals(rng, 3, rng.randrange(3, 7), 64)
    for a in arrivals:
        a.n = a.n if a.beam_width else rng.choice((1, 2, 2, 3))
    return sharing_story(arrivals, block_size=rng.choice((1, 2, 4)), num_kv_blocks=rng.randrange(30, 60))


# -- beam-step ----------------------------------------------------------------------------------------------------


def beam_steps(width: int, prompt: list[int], tops: list[list[list]], max_steps: int = 8, ignore_eos=False) -> list:
    """Step one beam search by hand: tops[t][k] is the candidates [(token, logprob), ...] of live beam k at step t.
    After each step: the forks (parent, child), the dropped beams, the live beams' tokens, the finished ones."""
    params = BeamSearchParams(beam_width=width, max_tokens=max_steps, ignore_eos=ignore_eos)
    beams = BeamGroup.start("s", prompt, params, max_steps, (EOS,), 0.0, None)
    beams.live[0].status = RequestStatus.RUNNING
    seen = []
    for step in tops:
        if beams.done:
            break
        top = {b.request_id: dict(step[k % len(step)]) for k, b in enumerate(beams.live)}
        forks, dropped = beams.step(top, 256)
        seen.append([
            [[p.request_id, c.request_id] for p, c in forks],
            [b.request_id for b in dropped],
            [[b.request_id, b.output_token_ids, round(b.cumulative_logprob, 6)] for b in beams.live],
            [[s.tokens, round(s.cum_logprob, 6), s.finish_reason] for s in beams.finished],
        ])  # fmt: skip
    return seen


def the_best_continue_and_a_twice_chosen_beam_forks(rng):
    first = [[(5, -0.1), (6, -0.2), (7, -3.0), (8, -4.0)]]  # one beam: two candidates kept
    then = [[(9, -0.5), (10, -0.6), (11, -2.0), (12, -2.1)], [(13, -0.1), (14, -3.0), (15, -3.1), (16, -4.0)]]
    tops = [first, then]
    return beam_steps(2, [2, 3, 4], tops + tops[1:] * 2)


def eos_candidates_are_set_aside(rng):
    tops = [[[(EOS, -0.05), (5, -0.1), (6, -0.2), (7, -0.3)]], [[(EOS, -0.01), (8, -0.2), (9, -0.3), (10, -0.4)]]]
    return beam_steps(2, [2, 3], tops * 3, max_steps=4) + beam_steps(2, [2, 3], tops * 3, max_steps=3, ignore_eos=True)


def beams_in_the_engine(rng):
    arrivals = [Arrival(0, "s", [2, 3, 4, 5, 6], 5, beam_width=2), Arrival(1, "t", [7, 8, 9], 4, beam_width=3)]
    return story(3, arrivals, block_size=2, num_kv_blocks=48, max_num_seqs=6)


def beam_random(rng):
    if rng.random() < 0.4:
        arrivals = [Arrival(rng.randrange(3), c, [rng.randrange(2, 40) for _ in range(rng.randrange(2, 9))],
                            rng.randrange(2, 7), beam_width=rng.randrange(1, 4)) for c in "st"]  # fmt: skip
        return story(3, arrivals, block_size=rng.choice((1, 2, 4)), num_kv_blocks=64, max_num_seqs=8)
    width = rng.randrange(1, 4)

    def candidates():
        tokens = rng.sample(range(2, 30), 2 * width) + ([EOS] if rng.random() < 0.3 else [])
        scored = [(t, -round(rng.random() * 3, 3)) for t in tokens][: 2 * width]
        return sorted(scored, key=lambda c: c[1], reverse=True)  # best first, as the runner gives them

    tops = [[candidates() for _ in range(width)] for _ in range(8)]
    return beam_steps(width, [2, 3, 4], tops, max_steps=rng.randrange(2, 7), ignore_eos=rng.random() < 0.2)


SCENARIOS = [
    TaskScenarios(
        "fork-cow",
        ("n-sharing", "beam-step"),
        (fork_shares_then_a_write_copies, a_full_block_is_never_copied, no_room_for_the_copy),
        cow_random,
    ),
    TaskScenarios(
        "beam-step",
        ("fork-cow", "n-sharing"),
        (the_best_continue_and_a_twice_chosen_beam_forks, eos_candidates_are_set_aside, beams_in_the_engine),
        beam_random,
    ),
    TaskScenarios(
        "n-sharing", ("fork-cow", "beam-step"), (n_children_share_the_prompt, a_one_token_prompt_shares_nothing),
        sharing_random,
    ),
]  # fmt: skip
