"""Course: the incident drills' scenarios: each drill's symptom (its ticket's workload, drawn anew at grading), the
cases aimed at a fault no task's scenarios reach, and the engine runs every drill's regression check shares.

Builds on: course/scenarios/common.py (attempt, build_scheduler), llm.py (LLM: the engine a user runs).
Read with: course/drills/grading.py, chapters/98-assignments.md (Incident drills).

A symptom case runs the engine as the ticket's user did, on the bundled model, and observes what a user sees: each
request's tokens and finish reason, the order they finished in, preemptions, prefix-cache hits, and the free blocks
once everything ended (a leak shows there). The grader compares it with the reference's observation of the same
seeded workload, so "the symptom is gone" means "the engine behaves as the reference does on it".

This module is the grader's: a drill's student copy does not ship it (its cases say where each fault is aimed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pagedlab.course.scenarios import TaskScenarios
from pagedlab.course.scenarios.common import attempt, build_scheduler

VOCAB = 68  # the bundled model's (token ids 0 .. 67; 0 is BOS, 1 is EOS)
BUNDLED = Path(__file__).parents[2] / "data" / "tiny-shakespeare"  # the tree's own (a child has no installed pagedlab)
MAX_STEPS = 600  # engine steps a run may take (a livelock ends here, with its observation)


@dataclass
class Ask:
    """One request of a run: added before step `step`, aborted before step `abort` (if given)."""

    rid: str
    prompt: list[int]
    max_tokens: int
    step: int = 0
    n: int = 1
    temperature: float = 0.0
    seed: int | None = None
    priority: int = 0
    cache_salt: str | None = None
    abort: int | None = None
    stop_ids: list[int] = field(default_factory=list)


def tokens(rng, count: int) -> list[int]:
    return [rng.randrange(2, VOCAB) for _ in range(count)]


def run_engine(stage: int, asks: list[Ask], **settings) -> dict:
    """Run the engine of `stage` (the bundled model, float32, one thread) on `asks`; what a user would see."""
    import torch

    from pagedlab.llm import LLM
    from pagedlab.sampling_params import SamplingParams

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = LLM(str(BUNDLED), stage=stage, **settings).engine
        done, outputs, step = [], {}, 0
        try:
            for step in range(MAX_STEPS):
                for a in (a for a in asks if a.step == step):
                    params = SamplingParams(n=a.n, max_tokens=a.max_tokens, temperature=a.temperature, seed=a.seed,
                                            stop_token_ids=a.stop_ids or None)  # fmt: skip
                    engine.add_request(a.rid, a.prompt, params, priority=a.priority, cache_salt=a.cache_salt)
                aborts = [a.rid for a in asks if a.abort == step]
                if aborts:
                    engine.abort_request(aborts)
                if not engine.has_unfinished_requests():
                    if all(a.step <= step for a in asks):
                        break
                    continue
                for out in engine.step():
                    if out.finished:
                        done.append(out.request_id)
                        outputs[out.request_id] = [[c.token_ids for c in out.outputs],
                                                   [c.finish_reason for c in out.outputs]]  # fmt: skip
        except Exception as e:  # the reference never raises here: a step that does ends the run
            return {"raised": type(e).__name__, "step": step, "finished": done}
        stats = engine.stats
        return {
            "outputs": dict(sorted(outputs.items())),
            "finished": done,
            "steps": step,
            "unfinished": engine.has_unfinished_requests(),
            "preemptions": stats.num_preemptions,
            "cache_hits": stats.prefix_cache_hits,
            "free_blocks": engine.kv_manager.num_free_blocks,
        }
    finally:
        torch.set_num_threads(threads)


def many(rng, count: int, lengths: tuple[int, int], outputs: tuple[int, int], spread: int = 4, **fields) -> list[Ask]:
    """`count` requests with random prompts, arriving over the first `spread` steps."""
    return [Ask(f"r{i}", tokens(rng, rng.randint(*lengths)), rng.randint(*outputs), rng.randrange(spread), **fields)
            for i in range(count)]  # fmt: skip


# -- the symptoms: each drill's ticket, as a workload drawn from rng -------------------------------------------------


def past_first_block(rng):
    """Stage 2: prompts longer than a block; greedy."""
    return run_engine(2, many(rng, 8, (40, 90), (16, 32)), block_size=16)


def room_for_exactly_one(rng):
    """Stage 5: one request at a time whose prompt and output fill the pool to its last block."""
    size = rng.choice((4, 8))
    blocks = rng.randint(4, 7)
    prompt = blocks * size - rng.randint(4, size + 2)
    asks = [Ask("big", tokens(rng, prompt), blocks * size - prompt)]
    asks += many(rng, 2, (3, 8), (2, 4), spread=1)
    return run_engine(5, asks, block_size=size, num_kv_blocks=blocks, max_model_len=blocks * size)


def odd_lengths(rng):
    """Stage 2: a batch whose prompt lengths are not multiples of the block size."""
    asks = [Ask(f"r{i}", tokens(rng, rng.randrange(3, 30) | 1), rng.randint(4, 12)) for i in range(4)]
    return run_engine(2, asks, block_size=8)


def sampled_siblings(rng):
    """Stage 3: n = 2 or 3 with temperature and a seed: each sibling as it would be alone."""
    asks = [Ask(f"r{i}", tokens(rng, rng.randint(5, 20)), rng.randint(6, 14), rng.randrange(3), n=rng.choice((2, 3)),
                temperature=1.0, seed=rng.randrange(1000)) for i in range(3)]  # fmt: skip
    return run_engine(3, asks, block_size=rng.choice((4, 8)))


def siblings_finish(rng):
    """Stage 3: n > 1 children that finish at different times (stop tokens, max_tokens), greedy and sampled."""
    asks = [Ask(f"r{i}", tokens(rng, rng.randint(3, 12)), rng.randint(3, 10), rng.randrange(3), n=rng.choice((2, 3)),
                temperature=rng.choice((0.0, 1.0)), seed=rng.randrange(1000)) for i in range(3)]  # fmt: skip
    return run_engine(3, asks, block_size=4)


def shared_middles(rng):
    """Stage 4: prompts made of the same few paragraphs (a block each) in different orders."""
    paragraphs = [tokens(rng, 8) for _ in range(3)]
    asks = []
    for i in range(8):
        prompt = [t for _ in range(rng.randint(2, 3)) for t in rng.choice(paragraphs)] + tokens(rng, rng.randint(1, 6))
        asks.append(Ask(f"r{i}", prompt, rng.randint(4, 10), step=i))
    return run_engine(4, asks, block_size=8)


def two_tenants(rng):
    """Stage 4: two tenants, each with its own cache_salt, send the same long prompt; then each sends it again."""
    prompt = tokens(rng, rng.randint(20, 40))
    asks = [Ask(f"{tenant}-{k}", prompt, 4, step=2 * k + j, cache_salt=tenant)
            for k in range(2) for j, tenant in enumerate(("alice", "bob"))]  # fmt: skip
    return run_engine(4, asks, block_size=4)


def cache_under_pressure(rng):
    """Stage 4: a small pool, many requests sharing a few system prompts, arriving over time."""
    systems = [tokens(rng, 8) for _ in range(4)]
    asks = [Ask(f"r{i}", rng.choice(systems) + tokens(rng, rng.randint(1, 10)), rng.randint(3, 8), step=2 * i)
            for i in range(16)]  # fmt: skip
    return run_engine(4, asks, block_size=4, num_kv_blocks=14, max_model_len=40)


def repeated_prompt(rng):
    """Stage 4: the same block-aligned prompt sent twice, one after the other."""
    size = rng.choice((4, 8))
    prompt = tokens(rng, size * rng.randint(1, 4))
    return run_engine(4, [Ask("first", prompt, 5), Ask("again", prompt, 5, step=8)], block_size=size)


def forks_under_pressure(rng):
    """Stage 5: n > 1 requests arriving into a tight pool (forks and preemptions in the same steps)."""
    asks = many(rng, 8, (3, 14), (4, 12), spread=3, n=2, temperature=1.0, seed=rng.randrange(1000))
    return run_engine(5, asks, block_size=4, num_kv_blocks=rng.randint(10, 16), max_model_len=32)


def urgent_requests(rng):
    """Stage 5 with priorities: urgent requests (priority 0) among background ones (5), a pool that preempts."""
    asks = many(rng, 8, (4, 16), (6, 14), spread=4)
    for a in asks:
        a.priority = rng.choice((0, 5))
    return run_engine(5, asks, block_size=4, num_kv_blocks=14, max_model_len=40, scheduling_policy="priority")


def clients_disconnect(rng):
    """Stage 5: clients abort some requests mid-generation (and one ends on a stop token); then a batch that needs
    the whole pool."""
    asks = many(rng, 5, (4, 12), (10, 20), spread=2, stop_ids=[rng.randrange(2, VOCAB)])
    for a in rng.sample(asks, 3):
        a.abort = rng.randint(3, 8)
    asks += [Ask(f"late{i}", tokens(rng, 10), 6, step=12) for i in range(3)]
    return run_engine(5, asks, block_size=4, num_kv_blocks=24, max_model_len=32)


def swapping(rng):
    """Stage 5 with preemption_mode="swap": more requests than the pool holds, greedy."""
    asks = many(rng, 8, (8, 16), (10, 16), spread=2)
    return run_engine(5, asks, block_size=4, num_kv_blocks=rng.randint(12, 14), max_model_len=32,
                      preemption_mode="swap", num_swap_blocks=64)  # fmt: skip


def priority_order(rng):
    """Stage 5 with priorities, one seat: requests queued together finish in priority order."""
    asks = many(rng, 5, (3, 8), (2, 5), spread=1)
    for a in asks:
        a.priority = rng.randrange(4)
    return run_engine(5, asks, max_num_seqs=1, scheduling_policy="priority")


# -- aimed at faults outside every task's region ----------------------------------------------------------------------


def abort_frees_blocks(rng):
    """Stage 5's scheduler: requests end from outside (abort) while running, waiting or preempted; the pool after."""
    from pagedlab.request import Request, RequestStatus
    from pagedlab.sampling_params import SamplingParams

    sched = build_scheduler(5, block_size=4, num_kv_blocks=12)
    seen = []
    for i in range(5):
        r = Request(f"q{i}", tokens(rng, rng.randint(3, 12)), SamplingParams(max_tokens=8), 64)
        sched.add_request((r,))
    for _ in range(rng.randint(1, 3)):
        sched.schedule()
    ids = rng.sample([f"q{i}" for i in range(5)], 3)
    ended = attempt(lambda: [r.request_id for r in sched.finish_requests(ids, RequestStatus.FINISHED_ABORTED)])
    seen.append([ids, ended, sched.kv.num_free_blocks, len(sched.running), len(sched.waiting)])
    return seen


def forks_preempted(rng):
    """Stage 5's scheduler alone (the fake model): n > 1 groups into a tight pool, so that a child is forked and
    preempted in one step; what each step sends the runner."""
    from pagedlab.course.scenarios.common import random_arrivals, story

    stories = []
    for _ in range(4):
        arrivals = random_arrivals(rng, 5, 8, 32)
        for a in arrivals:
            a.n, a.beam_width, a.priority = 2, 0, 0
        stories.append(story(5, arrivals, 60, block_size=4, num_kv_blocks=rng.randint(8, 12), max_model_len=32))
    return stories


def queue_order(rng):
    """Stage 5's priority queue: the order groups leave it (priority, then arrival)."""
    from pagedlab.request import Request
    from pagedlab.sampling_params import SamplingParams
    from pagedlab.sched.queue import PriorityQueue

    queue = PriorityQueue()
    for i in range(rng.randint(3, 8)):
        r = Request(f"q{i}", [2, 3], SamplingParams(max_tokens=1), 8, arrival_time=float(rng.randrange(5)),
                    priority=rng.randrange(4))  # fmt: skip
        queue.add([r])
    order = []
    while queue:
        order.append(queue.pop()[0].request_id)
    return order


# -- the regression check's engine runs, one per stage ----------------------------------------------------------------


def engine_at(stage: int):
    def run(rng):
        settings = {"block_size": rng.choice((4, 8, 16))}
        fields = {"temperature": rng.choice((0.0, 1.0)), "seed": rng.randrange(1000)}
        if stage >= 3:
            fields["n"] = rng.choice((1, 2))
        if stage >= 5:
            settings |= {"num_kv_blocks": 40, "max_model_len": 64, "preemption_mode": rng.choice(("recompute", "swap")),
                         "num_swap_blocks": 80}  # fmt: skip
        return run_engine(stage, many(rng, 5, (2, 30), (2, 12), spread=4, **fields), **settings)

    run.__name__ = f"engine_stage_{stage}"
    return run


def _suite(task: str, fn, num_seeded: int = 4) -> TaskScenarios:
    return TaskScenarios(task, (), (), fn, num_seeded, warm=("torch", "pagedlab.llm"))


SYMPTOMS = {
    "past-first-block": past_first_block,
    "room-for-exactly-one": room_for_exactly_one,
    "odd-lengths": odd_lengths,
    "sampled-siblings": sampled_siblings,
    "siblings-finish": siblings_finish,
    "shared-middles": shared_middles,
    "two-tenants": two_tenants,
    "cache-under-pressure": cache_under_pressure,
    "repeated-prompt": repeated_prompt,
    "forks-under-pressure": forks_under_pressure,
    "urgent-requests": urgent_requests,
    "clients-disconnect": clients_disconnect,
    "swapping": swapping,
    "priority-order": priority_order,
}
AIMED = {"abort-frees-blocks": abort_frees_blocks, "queue-order": queue_order, "forks-preempted": forks_preempted}

SCENARIOS = [
    *(_suite(f"symptom-{name}", fn) for name, fn in SYMPTOMS.items()),
    *(_suite(f"aimed-{name}", fn, 4) for name, fn in AIMED.items()),
    *(_suite(f"engine-{stage}", engine_at(stage), 2) for stage in (2, 3, 4, 5)),
]
