"""Course: what every scenario shares: plain-data observations, and a scheduler story driven by a fake model.

Builds on: stages.py (a stage's parts), sched/output.py (ModelRunnerOutput), sched/beam.py (BeamGroup).
Read with: chapters/98-assignments.md (Scenarios).

A scenario returns only plain data (ints, strings, lists, dicts; floats inside
`floats(...)`), so the grader compares a student's observations with the
reference's without trusting anything else the student's process says. A
story drives a stage's scheduler and KV manager for a few steps with a fake
model whose tokens depend only on the sequence so far (crc32, the same in
every process), and records after each step what the runner would be told and
what the KV cache holds:

    step 3: run [["a", 1], ["b", 4]]  new {"b": [5]}  free [6, 7, 4]  held {"a": [0, 1], "b": [2, 5]} ...
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

VOCAB = 48  # token ids 0 .. 47 in stories; 1 is EOS
EOS = 1
MODEL_MAX_LEN = 64


def attempt(fn, *args, says: tuple[str, ...] = (), messages: tuple[str, ...] = ()) -> list:
    """["ok", fn(*args)], or ["raised", the exception's type name, which `says` phrases its message holds, and
    which of `messages` it is exactly]: a message counts only where the task's docstring states it."""
    try:
        return ["ok", fn(*args)]
    except Exception as e:  # a BaseException (an interrupt, an exit) is no answer: it ends the case
        text = str(e)
        return ["raised", type(e).__name__, [s for s in says if s in text], [m for m in messages if m == text]]


def floats(values, tol: float, digits: int = 6) -> dict:
    """Numbers compared within `tol` (absolute and relative, as torch.testing.assert_close); the tolerance the
    grader uses is the one in the reference's observation."""
    return {"floats": [round(float(x), digits) for x in values], "tol": tol}


def crc(*parts) -> int:
    """A hash that is the same in every process (Python's hash() of a str is not)."""
    return zlib.crc32(repr(parts).encode())


@dataclass
class Arrival:
    """A request a story adds before the given step."""

    step: int  # added before this step's schedule()
    rid: str  # its request id (an n > 1 request's children are "{i}_{rid}"; a beam search's beams "{rid}-beam{k}")
    prompt: list[int]  # token ids
    max_tokens: int  # output tokens at most
    n: int = 1  # children sharing the prompt (stage 3 on)
    priority: int = 0  # lower runs first under the priority policy (stage 5)
    cache_salt: str | None = None  # isolates its prefix-cache entries (stage 4 on)
    beam_width: int = 0  # > 0: a beam search (stage 3 on)


def random_arrivals(rng, stage: int, count: int, max_len: int, prefixes: int = 0) -> list[Arrival]:
    """`count` requests arriving over the first steps; from stage 3 some have n > 1 or are beam searches, from
    stage 4 many share a prompt prefix and some carry a salt, at stage 5 they have priorities."""
    shared = [[rng.randrange(2, VOCAB) for _ in range(rng.randrange(3, 10))] for _ in range(prefixes)]
    out = []
    for i in range(count):
        max_tokens = rng.randrange(1, 7)
        length = rng.randrange(1, max(2, max_len // 2 - max_tokens))
        head = rng.choice(shared) if shared and rng.random() < 0.7 else []
        prompt = (head + [rng.randrange(2, VOCAB) for _ in range(length)])[: max_len - max_tokens - 1] or [2]
        a = Arrival(rng.randrange(0, 5), chr(ord("a") + i), prompt, max_tokens)
        if stage >= 3 and rng.random() < 0.3:
            a.n = rng.choice((2, 3))
        elif stage >= 3 and rng.random() < 0.15:
            a.beam_width = 2
        if stage >= 4 and rng.random() < 0.2:
            a.cache_salt = rng.choice(("t1", "t2"))
        if stage >= 5:
            a.priority = rng.randrange(0, 3)
        out.append(a)
    return sorted(out, key=lambda a: a.step)


def build_scheduler(stage: int, **settings):
    """The stage's scheduler over its KV manager, wired as the engine wires them (stages.py)."""
    from pagedlab.stages import STAGES, engine_config, make_kv_manager, make_scheduler

    settings.setdefault("max_model_len", MODEL_MAX_LEN)
    config = engine_config(stage, MODEL_MAX_LEN, 1, **settings)
    return make_scheduler(config, STAGES[stage], make_kv_manager(config, STAGES[stage]))


def story(stage: int, arrivals: list[Arrival], steps: int = 40, seed: int = 0, **settings) -> dict:
    """Run the scheduler `steps` steps (or until every request ended) with the fake model; what each step did."""
    sched = build_scheduler(stage, **settings)
    record: list = []
    requests: dict = {}
    try:
        for step in range(steps):
            for a in (a for a in arrivals if a.step == step):
                record.append({"add": a.rid, "result": _add(sched, a, requests)})
            if not sched.has_unfinished_requests():
                if all(a.step <= step for a in arrivals):
                    break
                continue
            so = sched.schedule()
            seen = _step_facts(sched, so)
            update = sched.update(so, fake_model(so, seed))
            seen["beams_done"] = {b.request_id: _best(b) for b in update.finished_beams}
            record.append(seen)
            sched.check_invariants()
    except Exception as e:  # the reference never raises here; a student's step that does ends the story
        record.append({"raised": type(e).__name__})
    finals = {rid: [r.output_token_ids, r.status.name] for rid, r in sorted(requests.items())}
    return {"steps": record, "requests": finals}


def _add(sched, a: Arrival, requests: dict) -> str:
    from pagedlab.request import Request
    from pagedlab.sampling_params import BeamSearchParams, SamplingParams
    from pagedlab.sched.beam import BeamGroup

    max_tokens = min(a.max_tokens, sched.config.max_model_len - len(a.prompt))
    if a.beam_width:
        params = BeamSearchParams(beam_width=a.beam_width, max_tokens=max_tokens)
        beams = BeamGroup.start(a.rid, a.prompt, params, max_tokens, (EOS,), float(a.step), None)
        group = beams.live * a.beam_width
    else:
        params = SamplingParams(n=a.n, max_tokens=max_tokens, seed=a.step)
        beams, group = (
            None,
            Request.new_group(
                a.rid, a.prompt, params, max_tokens, (EOS,), float(a.step), a.priority, a.cache_salt, None
            ),
        )
    try:
        sched.check_admissible(group)
    except ValueError:
        return "refused"
    if beams is not None:
        sched.add_beam_search(beams)
    else:
        sched.add_request(group)
        requests.update((r.request_id, r) for r in group)
    return "added"


def _step_facts(sched, so) -> dict:
    """What the runner is told this step, and what the KV cache holds once it is scheduled."""
    kv = sched.kv
    facts = {
        "run": [[r.request_id, so.num_scheduled_tokens[r.request_id]] for r in so.scheduled],
        "new": dict(sorted(so.new_block_ids.items())),
        "tables": dict(sorted(so.new_block_tables.items())),
        "copies": [[c.request_id, c.index, c.src, c.dst] for c in so.block_copies],
        "preempted": sorted(so.preempted_req_ids),
        "finished": sorted(so.finished_req_ids),
        "swap": [list(map(list, so.swap_out)), list(map(list, so.swap_in))],
        "held": {r.request_id: kv.get_block_ids(r) for r in sorted(sched.running, key=lambda r: r.request_id)},
        "waiting": [r.request_id for r in sched.waiting],
        "computed": {r.request_id: r.num_computed_tokens for r in sched.running},
    }
    pool = getattr(kv, "pool", None)
    if pool is None:  # stage 1's regions
        facts["free"] = sorted(kv.free_regions)
        return facts
    facts["free"] = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    facts["refs"] = [[b.block_id, b.ref_cnt] for b in pool.blocks if b.ref_cnt]
    index = getattr(pool, "index", None)
    if index is not None:
        facts["cached"] = sorted(b.block_id for b in index.blocks())
    return facts


def _best(beams) -> list:
    return [[s.tokens, round(s.cum_logprob, 6), s.finish_reason] for s in beams.best((EOS,))]


def fake_model(so, seed: int):
    """Every request fed up to its last known token samples one: a token that depends only on its tokens so far
    (and its child index); one asking for logprobs (a beam) gets that many candidates, best first."""
    from pagedlab.sched.output import ModelRunnerOutput

    out = ModelRunnerOutput()
    for r in so.scheduled:
        if r.num_computed_tokens + so.num_scheduled_tokens[r.request_id] != r.num_tokens:
            continue  # a prefill chunk that does not reach the end of the prompt samples nothing
        h = crc(seed, r.child_index, tuple(r.all_token_ids))
        token = EOS if h % 16 == 0 else 2 + h % (VOCAB - 2)
        top = None
        k = r.sampling_params.logprobs
        if k:
            h = crc(seed, tuple(r.all_token_ids))  # a beam's candidates depend on its tokens only
            cands = [EOS if (h >> 3) % 5 == 0 else 2 + (h + 7 * i) % (VOCAB - 2) for i in range(k)]
            cands = list(dict.fromkeys(cands + [2 + (h + 7 * i + 3) % (VOCAB - 2) for i in range(k)]))[:k]
            top = {t: -round(0.05 + 0.4 * i + ((h >> i) & 7) * 0.01, 4) for i, t in enumerate(cands)}
            token = cands[0]
        out.req_ids.append(r.request_id)
        out.token_ids.append(token)
        out.logprobs.append(-0.1 if top is None else top[token])
        out.top_logprobs.append(top)
    return out
