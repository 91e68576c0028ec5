"""Stage 2: predict, then see: the prediction points of notebooks 02 to 05.

Builds on: sched/ (a copy of the scheduler, stepped once, says what the next step will do), kv/ (block tables,
the free queue, the prefix cache), engine/engine.py (`process_inputs`: a request built without queueing it).
Read with: chapters/98-assignments.md (Prediction points), the notebooks 02_paged_blocks to 05_continuous_batching.

A notebook asks first, and shows nothing of the answer until the learner has given one:

    q = ask("02-next-block", llm)     the question; its truth is worked out now, from the engine, and kept
    q.answer(...)                     your answer in place of `...`: ✓ or ✗, then what the engine does and why
    engine.step()
    with q.hidden():                  what the step did, printed only once q is answered
        show()

The truth is computed at `ask`, never written down: change a knob above and the question follows. A question
keeps the state it was asked about, so answering again after stepping on gives the same verdict. A question
about the *next* step is answered by a lookahead: a deep copy of the scheduler (and so of its KV manager and
requests) runs `schedule()` once. Scheduling needs no model: which blocks are allocated, copied or freed, who
is admitted or preempted, depends only on token counts. The live engine is never touched.

A hint says something true and useful; a sentence of it that contains the answer's text is dropped. Teachers
get the answer with `answer(name, state)`. In CI, where nobody types, PAGEDLAB_ANSWERS answers every `...`:
"right" (the truth), "wrong" (something else), or a JSON file of {name: answer}.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedlab.sampling_params import SamplingParams

STALE = "this question is about the engine right after the cell above it: run the notebook again up to here"
NO_HINT = "look again at the state printed above."
PLACEHOLDER = "write your answer in place of the `...`, then run this cell again"
HIDDEN = "(hidden until you answer {name} above)"


@dataclass(frozen=True)
class Prediction:
    """One prediction point. `truth` and `hints` read the state they are given and change nothing."""

    name: str  # "02-next-block": the notebook's number, then what it asks
    question: str  # as the notebook poses it; {placeholders} are filled from what `ask` is given
    truth: Callable[..., Any]  # (state, **given) -> the true answer, now (state: an LLM or its engine)
    hints: Callable[..., list[str]]  # (state, **given) -> sentences that help without telling
    kind: str = "exact"  # "exact" (a list or a value), "set" (order does not matter) or "int"
    explain: str = ""  # why: shown with the answer, right or wrong
    code: str = ""  # where it happens: the file and function a learner reads next


# --- reading the state ----------------------------------------------------------------------------------


def _engine(state):
    return getattr(state, "engine", state)


def _find(scheduler, request_id: str):
    """The live request `request_id` in a scheduler's running or waiting queue."""
    for r in (*scheduler.running, *scheduler.waiting):
        if r.request_id == request_id:
            return r
    raise KeyError(f"request {request_id!r} is neither running nor waiting")


def ahead(state, arrivals: tuple = ()):
    """(a copy of the scheduler after one more `schedule()`, its SchedulerOutput). `arrivals`: (request_id,
    prompt, SamplingParams, cache_salt) queued in the copy first. The live engine is left as it was."""
    engine = _engine(state)
    scheduler = copy.deepcopy(engine.scheduler)
    for rid, prompt, params, salt in arrivals:
        scheduler.add_request(engine.process_inputs(rid, prompt, params, cache_salt=salt))
    return scheduler, type(scheduler).schedule(scheduler)  # the class's: a notebook may wrap the instance's


def lookup(state, prompt: str, params, cache_salt: str | None = None) -> int:
    """How many prompt tokens a request with `prompt` would find in the prefix cache now (no block is touched)."""
    engine = _engine(state)
    kv = copy.deepcopy(engine.kv_manager)
    (request,) = engine.process_inputs("lookup", prompt, params, cache_salt=cache_salt)
    return len(kv.get_computed_blocks(request)) * kv.block_size


def _new_slot(state, rid: str) -> int:
    scheduler, _ = ahead(state)
    request = _find(scheduler, rid)
    pos, size = _find(_engine(state).scheduler, rid).num_computed_tokens, scheduler.kv.block_size
    return scheduler.kv.get_block_ids(request)[pos // size] * size + pos % size


def _free_after_step(state, **_) -> list[int]:
    """The free queue after the next step, once the requests it finishes have freed their blocks (the notebooks
    set ignore_eos: a request ends when it samples its max_tokens-th token)."""
    scheduler, out = ahead(state)
    for request in out.scheduled:
        if samples_its_last(request, out):
            scheduler.kv.free(request)
    return [b.block_id for b in scheduler.kv.pool.free_block_queue.get_all_free_blocks()]


def samples_its_last(request, out) -> bool:
    """`request` samples its last token in the step `out` schedules (ignore_eos: its max_tokens-th)."""
    fed = request.num_computed_tokens + out.num_scheduled_tokens[request.request_id]
    return fed >= request.num_tokens and request.num_output_tokens + 1 >= request.max_tokens


def _admitted(state, **_) -> set[str]:
    running = {r.request_id for r in _engine(state).scheduler.running}
    scheduler, _ = ahead(state)
    return {r.request_id for r in scheduler.running} - running


def _gained(state, **_) -> set[int]:
    """The blocks that the next step adds to the running requests' tables."""
    engine = _engine(state)
    before = {b for r in engine.scheduler.running for b in engine.kv_manager.get_block_ids(r)}
    scheduler, _ = ahead(state)
    return {b for r in scheduler.running for b in scheduler.kv.get_block_ids(r)} - before


def _slots_in_last_block(state, rid: str) -> int:
    engine = _engine(state)
    n, size = _find(engine.scheduler, rid).num_computed_tokens, engine.kv_manager.block_size
    return n - (n - 1) // size * size if n else 0


def _num_copies(state, **_) -> int:
    return len(ahead(state)[1].block_copies)


def _fed(state, rid: str) -> int:
    return ahead(state)[1].num_scheduled_tokens.get(rid, 0)


def _max_blocks(state) -> str:
    engine = _engine(state)
    return ", ".join(f"{r.request_id}: {engine.kv_manager.max_blocks(r)}" for r in engine.scheduler.waiting)


def _greedy(max_tokens: int = 3) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _cached_free(state, **_) -> set[int]:
    pool = _engine(state).kv_manager.pool
    return {b.block_id for b in pool.cached_block_hash_to_block.values() if b.ref_cnt == 0}


def _arrives(state, prompt: str):
    return ahead(state, (("B", prompt, _greedy(), None),))


def _hits_of(state, prompt: str) -> int:
    scheduler, _ = _arrives(state, prompt)
    return scheduler.kv.prefix_cache_hits - _engine(state).kv_manager.prefix_cache_hits


def _table_of_arrival(state, prompt: str) -> list[int]:
    scheduler, _ = _arrives(state, prompt)
    return scheduler.kv.get_block_ids(_find(scheduler, "B"))


def _preempted(state, **_) -> set[str]:
    return set(ahead(state)[1].preempted_req_ids)


def _shared_by_all(state, **_) -> set[int]:
    scheduler, _ = ahead(state)
    return set.intersection(*(set(scheduler.kv.get_block_ids(r)) for r in scheduler.running))


def _table_after(state, rid: str) -> list[int]:
    scheduler, _ = ahead(state)
    return scheduler.kv.get_block_ids(_find(scheduler, rid))


# --- the predictions, by notebook -----------------------------------------------------------------------
# A question's {placeholders} are the `given` of `ask(name, state, **given)`, which its truth and hints take too.

_SLOT = "slot = block_table[pos // block_size] * block_size + pos % block_size."
_HEAD = (
    "A block a table lacks comes from the head of the free queue, and requests earlier in the batch take theirs first."
)

NOTEBOOK_02 = [
    Prediction(
        "02-admitted",
        "Which of the waiting requests will the next step admit? (a set of request ids)",
        _admitted,
        lambda s: [
            f"Admission is static and by worst case; the worst cases in blocks are {_max_blocks(s)}.",
            f"The pool has {_engine(s).kv_manager.pool.num_blocks} blocks, and requests are admitted in arrival "
            "order until the next worst case no longer fits.",
        ],
        kind="set",
        explain="Their worst cases fit the pool together; the next one's would not, so the rest wait for the batch "
        "to empty.",
        code="sched/static.py StaticScheduler.schedule and kv/paged.py can_admit",
    ),
    Prediction(
        "02-next-block",
        "In the next step, which physical block will {rid}'s next token land in?",
        lambda s, rid: _new_slot(s, rid) // _engine(s).kv_manager.block_size,
        lambda s, rid: [
            f"{rid}'s next position is its number of computed tokens: which logical block is it in "
            "(pos // block_size)?",
            f"{rid}'s table is {_engine(s).kv_manager.get_block_ids(_find(_engine(s).scheduler, rid))}.",
            _HEAD,
        ],
        kind="int",
        explain="A token lands in its request's last block while that block has room; a full one means a new block "
        "from the head of the free queue.",
        code="kv/paged.py PagedKVCacheManager.allocate_slots, kv/block_pool.py BlockPool.allocate",
    ),
    Prediction(
        "02-free-after-finish",
        "{rid} samples its last token in the next step. What will the free queue be after that step, head to tail?",
        _free_after_step,
        lambda s, rid: [
            "Before anyone finishes, a request whose last block is full takes a block from the head of the queue.",
            "`free` then gives a finished request's blocks to the head (nothing is cached at stage 2), last block "
            "first, so that the last one freed is the first reused.",
        ],
        explain="Freed last block first, each to the head: the finished request's blocks are reused before any "
        "other (vLLM's order).",
        code="kv/paged.py PagedKVCacheManager.free, kv/block_pool.py BlockPool.free",
    ),
    Prediction(
        "02-E-table",
        "{rid} is admitted in the next step. What will its block table be?",
        _table_after,
        lambda s, rid: [
            f"{rid}'s prompt has {_find(_engine(s).scheduler, rid).num_prompt_tokens} tokens: cdiv(that, block_size) "
            "blocks, for the prompt only.",
            "They are taken one by one from the head of `free_queue()`, in the order it lists them.",
        ],
        explain="The head of the queue held the blocks freed last, last block first: a table need not be in order.",
        code="kv/paged.py allocate_slots, kv/block_pool.py FreeKVCacheBlockQueue.popleft",
    ),
    Prediction(
        "02-next-slot",
        "In the next step, which slot of the pool will receive the K/V of {rid}'s next token?",
        _new_slot,
        lambda s, rid: [
            _SLOT,
            f"{rid}'s next position is its number of computed tokens: does its table have that logical block yet?",
            _HEAD,
        ],
        kind="int",
        explain="The slot is the block table's entry for the position's logical block, times block_size, plus the "
        "offset in the block.",
        code="worker/runner.py ModelRunner.slot_mapping",
    ),
]

NOTEBOOK_03 = [
    Prediction(
        "03-leader-feeds",
        "How many tokens will the leader {rid} feed in the first step?",
        _fed,
        lambda s, rid: [
            "The group prefills the prompt once, in the leader, but each child must feed one prompt token itself, "
            "to sample its own first token from it.",
            f"{rid} has {_find(_engine(s).scheduler, rid).num_prompt_tokens} prompt tokens.",
        ],
        kind="int",
        explain="All but the last prompt token: each child feeds that one itself, after the fork.",
        code="sched/sharing.py PromptSharing.target_tokens",
    ),
    Prediction(
        "03-copies-step2",
        "The next step forks the followers from the leader, then every child writes its next token. How many block "
        "copies will it make?",
        _num_copies,
        lambda s: [
            "Right after the fork every child holds the leader's table: every block has as many holders as there "
            "are children.",
            "Only the block a child writes into can need a copy, and only while someone else holds it too.",
            "The last holder of a shared block finds it no longer shared and writes in place.",
        ],
        kind="int",
        explain="The children that write while others still hold the block copy it; the last holder writes in place "
        "(none at all when the prompt filled its last block: each child opens a fresh one).",
        code="kv/cow.py CowKVCacheManager._copy_on_write",
    ),
    Prediction(
        "03-shared-after-step2",
        "After that step, which blocks will all the children still share? (a set of block ids)",
        _shared_by_all,
        lambda s: [
            "A full block is never written again, so nobody copies it.",
            "The leader's block table and its number of computed tokens say which of its blocks are full.",
        ],
        kind="set",
        explain="Only the full blocks stay shared; the one being written was copied.",
        code="kv/cow.py CowKVCacheManager.allocate_slots",
    ),
    Prediction(
        "03-last-block-slots",
        "How many slots of {rid}'s last block hold keys and values now?",
        _slots_in_last_block,
        lambda s, rid: [
            f"{rid} has K/V for its first num_computed_tokens positions: the ones a copy brought and the ones it "
            "wrote itself.",
            "Position p lives in logical block p // block_size, at offset p % block_size.",
        ],
        kind="int",
        explain="A copy brings the source block's filled slots; the child then wrote its own next token after them.",
        code="kv/cow.py BlockCopy, worker/runner.py copy_blocks",
    ),
    Prediction(
        "03-copies-step3",
        "In the next step each child writes its next token. How many block copies will it make?",
        _num_copies,
        lambda s: [
            "A block is copied only when a request is about to write into it while its ref_cnt is above 1.",
            "Which block does each child write into now, and who else holds it? `ref_cnts()` says.",
        ],
        kind="int",
        explain="After a copy-on-write each child writes into a block of its own.",
        code="kv/cow.py CowKVCacheManager.allocate_slots",
    ),
    Prediction(
        "03-beam-new-blocks",
        "In the next step every beam writes its next token. Which blocks will the beams' tables gain? (a set of block "
        "ids)",
        _gained,
        lambda s: [
            "Is there room for the next position in the beams' shared last block? The prompt's length and "
            "block_size say.",
            "A block a table lacks comes from the head of the free queue, one per beam, in batch order.",
        ],
        kind="set",
        explain="Where the shared last block is full each beam takes a fresh block; where it has room, the beams "
        "copy it (all but the last holder).",
        code="sched/beam.py BeamGroup, kv/cow.py fork",
    ),
]

NOTEBOOK_04 = [
    Prediction(
        "04-B-hits",
        "B = {prompt!r} arrives now. How many of its prompt tokens will hit the cache?",
        _hits_of,
        lambda s, prompt: [
            "Only full blocks are cached, and a lookup walks the request's block hashes from the first one to "
            "the first miss.",
            "A block's hash covers its tokens and every token before it: which of B's blocks hold exactly what "
            "A's held, after the same tokens?",
        ],
        kind="int",
        explain="B's hashes equal A's up to the first block that differs; the lookup stops there.",
        code="kv/prefix.py PrefixCachingKVCacheManager.get_computed_blocks, kv/hashing.py",
    ),
    Prediction(
        "04-B-table",
        "And what will B's block table be after its first step?",
        _table_of_arrival,
        lambda s, prompt: [
            "A hit keeps the block id it was cached in: `cached()` lists them.",
            "The blocks B still needs come from the head of `free_queue()`, after the hits have left it.",
        ],
        explain="The hits keep their block ids; the new blocks come from the head of the free queue.",
        code="kv/prefix.py PrefixCachingKVCacheManager.allocate_slots (hits first, then new blocks)",
    ),
    Prediction(
        "04-C-lookup",
        "C sends exactly A's prompt, {prompt!r}. If C were looked up now, how many of its prompt tokens would hit?",
        lambda s, prompt: lookup(s, prompt, _greedy()),
        lambda s, prompt: [
            "C's first output token is sampled from the logits of its last prompt token.",
            "Logits come only from a forward pass: `get_computed_blocks` stops at (num_tokens - 1) // block_size.",
        ],
        kind="int",
        explain="The last prompt token's logits are needed, so the block holding it is computed again.",
        code="kv/prefix.py get_computed_blocks ((num_tokens - 1) // block_size)",
    ),
    Prediction(
        "04-cached-free",
        "Which blocks are cached but free right now (ref_cnt 0, still in the hash map)? (a set of block ids)",
        _cached_free,
        lambda s: [
            "A freed block keeps its hash until it is reused; a block some table holds has ref_cnt 1 or more.",
            "Compare `cached()` with `ref_cnts` of the pool: `pool.blocks[b].ref_cnt`.",
        ],
        kind="set",
        explain="Freed blocks keep their hashes until allocation reuses (evicts) them.",
        code="kv/prefix.py the caching pool: free keeps a block's hash until it is reused",
    ),
    Prediction(
        "04-E-hits",
        "E sends A's exact prompt with cache_salt={salt!r}. How many of its prompt tokens will hit the cache?",
        lambda s, prompt, salt: lookup(s, prompt, _greedy(), cache_salt=salt),
        lambda s, prompt, salt: [
            "The salt is an extra key of the first block's hash, and every later hash chains through it.",
            "A lookup stops at the first hash it does not find.",
        ],
        kind="int",
        explain="A different first hash changes every hash after it: nothing hits.",
        code="kv/hashing.py hash_block_tokens (the salt is the first block's extra key)",
    ),
]

NOTEBOOK_05 = [
    Prediction(
        "05-first-fed",
        "How many tokens will the first step feed to request {rid}?",
        _fed,
        lambda s, rid: [
            f"The step's budget is {_engine(s).config.max_num_batched_tokens} tokens and no chunk is longer than "
            f"{_engine(s).config.long_prefill_token_threshold} (when more than one request is queued).",
            "Nothing runs yet, so the budget goes to the waiting queue in order: the requests before it come first.",
            "A request is fed at most what its prompt needs: `requests[rid].num_prompt_tokens`.",
        ],
        kind="int",
        explain="Each request ahead of it took a chunk; it gets what is left of the budget, at most a chunk.",
        code="sched/continuous.py ContinuousScheduler._schedule_waiting",
    ),
    Prediction(
        "05-next-admitted",
        "Which waiting requests will the next step admit? (a set of request ids; set() for none)",
        _admitted,
        lambda s: [
            "Running requests are served first, each what its prompt still needs, capped at a chunk.",
            "What is left of the budget goes to the head of the waiting queue, while seats (max_num_seqs) last and "
            "the free blocks hold its whole prompt.",
        ],
        kind="set",
        explain="The running requests are served first; the rest of the budget goes to the head of the queue, as "
        "long as seats and blocks allow.",
        code="sched/continuous.py ContinuousScheduler.schedule (running first, then waiting)",
    ),
    Prediction(
        "05-victim",
        "A running request needs a new block in the next step and the pool is empty. Who will be preempted? (a set "
        "of ids)",
        _preempted,
        lambda s: [
            "Under FCFS the victim is the newest running request, the last to arrive.",
            "`engine.scheduler.running` lists the running requests in the order they were admitted.",
        ],
        kind="set",
        explain="Under FCFS the newest running request gives its seat back.",
        code="sched/continuous.py _preempt_until_it_fits, sched/queue.py (the victim rule)",
    ),
    Prediction(
        "05-admitted-when-preempting",
        "The preemption frees some blocks. How many waiting requests will that same step admit?",
        lambda s: len(_admitted(s)),
        lambda s: [
            "Admitting while the pool is so short that someone was just preempted would make the next "
            "preemption likelier.",
            "Read what `schedule` does with the waiting queue in a step that preempted (sched/continuous.py).",
        ],
        kind="int",
        explain="A step that preempts admits nobody, although blocks were freed.",
        code="sched/continuous.py ContinuousScheduler.schedule (no admission in a step that preempted)",
    ),
    Prediction(
        "05-admitted-after",
        "The preemption left free blocks and a free seat. Which waiting requests will the next step admit? (a set; "
        "set() for none)",
        _admitted,
        lambda s: [
            "The running requests are served first, and the ones whose last block is full take a block each.",
            "A waiting request is admitted only if the budget has tokens left and the free blocks hold its whole "
            "prompt (less its cache hits).",
            "The preempted request went back to the front of the queue.",
        ],
        kind="set",
        explain="The head of the queue is admitted only if the free blocks hold its whole prompt, and nobody may "
        "pass it (head-of-line: the queue's order is the policy).",
        code="sched/continuous.py ContinuousScheduler._schedule_waiting",
    ),
]

PREDICTIONS: dict[str, list[Prediction]] = {"02": NOTEBOOK_02, "03": NOTEBOOK_03, "04": NOTEBOOK_04, "05": NOTEBOOK_05}
BY_NAME: dict[str, Prediction] = {p.name: p for group in PREDICTIONS.values() for p in group}


def answer(name: str, state, **given) -> Any:
    """For teachers: the true answer of prediction `name` in this state."""
    return BY_NAME[name].truth(state, **given)


def _same(kind: str, guess, truth) -> bool:
    try:
        if kind == "set":  # {3} and {"3"} name the same request
            return {str(x) for x in guess} == {str(x) for x in truth}
        if kind == "int":
            return int(guess) == truth and not isinstance(guess, bool)
        return list(guess) == list(truth) if isinstance(truth, list) else guess == truth
    except (TypeError, ValueError):
        return False


def _words(truth) -> list[str]:
    """The texts that would give `truth` away in a hint."""
    if isinstance(truth, set | frozenset):
        return [str(sorted(truth, key=str)), str(truth)] if truth else ["set()"]
    return [str(truth)]


def _show(truth) -> str:
    if isinstance(truth, set | frozenset):
        return "{" + ", ".join(map(repr, sorted(truth, key=str))) + "}" if truth else "set()"
    return repr(truth)


# --- asking, then answering ----------------------------------------------------------------------------------


NOT_ANSWERED = object()


@dataclass
class Question:
    """One prediction point as asked: its truth and hints worked out from the state at `ask`, then kept."""

    prediction: Prediction
    truth: Any  # what the engine will do (computed from the state it was asked about)
    hints: list[str]  # the hint's sentences for that state, less any that would give the answer away
    text: str  # the question as asked (its placeholders filled)
    guess: Any = NOT_ANSWERED  # the learner's last answer
    verdicts: list[str] = field(default_factory=list)  # "right" or "wrong", one per answer given

    @property
    def answered(self) -> bool:
        return self.guess is not NOT_ANSWERED

    def answer(self, guess=...) -> str:
        """Judge `guess` against the truth of the state this question was asked about, and reveal it: ✓ or ✗,
        the answer, why, and where in the code. `...` (the placeholder) asks for an answer instead."""
        if guess is ...:
            guess = supplied_answer(self)
        if guess is ... or guess is None:
            message = f"{self.prediction.name}: {PLACEHOLDER}"
        else:
            right = _same(self.prediction.kind, guess, self.truth)
            self.guess = guess
            self.verdicts.append("right" if right else "wrong")
            message = self._reveal(right)
        print(message)
        return self.verdicts[-1] if self.verdicts else "missing"

    def _reveal(self, right: bool) -> str:
        p = self.prediction
        head = "✓ right" if right else f"✗ not quite (you said {_show(self.guess)}): {' '.join(self.hints) or NO_HINT}"
        where = f" Read: {p.code}." if p.code else ""
        return f"{p.name}: {head}\n   the engine: {_show(self.truth)}. {p.explain}{where}".rstrip()

    @contextlib.contextmanager
    def hidden(self):
        """Show what the block prints and draws only once this question is answered; before that, one line
        saying so (the block still runs: the engine steps on)."""
        import matplotlib.pyplot as plt

        out, figures = io.StringIO(), set(plt.get_fignums())
        with contextlib.redirect_stdout(out):
            yield
        if self.answered:
            print(out.getvalue(), end="")
            return
        for number in set(plt.get_fignums()) - figures:
            plt.close(number)  # a drawing of the state would give the answer away
        print(HIDDEN.format(name=self.prediction.name))


_ASKED: dict[tuple[str, int], tuple[int, Question]] = {}  # (name, engine id) -> (its step then, the question)


def ask(name: str, state, **given) -> Question:
    """Pose prediction `name` about `state` (an LLM, its engine, or the beams' engine; `given`: what the question
    names, a request id or a prompt): print the question and keep its truth. Asked again before the engine has
    moved, it is the same question (a re-run is judged the same); asked after, it is asked about the new state."""
    engine = _engine(state)
    key, now = (name, id(engine)), _steps(engine)
    if key in _ASKED and _ASKED[key][0] == now:
        question = _ASKED[key][1]
    else:
        question = pose(name, state, **given)
        _ASKED[key] = (now, question)
    print(f"{name}: {question.text}")
    return question


def pose(name: str, state, **given) -> Question:
    """Prediction `name` about `state`, its truth and hints worked out now; nothing printed, nothing kept (the live
    lab asks each question of a fresh engine: lessons/lab_browser.py)."""
    prediction = BY_NAME[name]
    truth = prediction.truth(state, **given)
    hints = _hint_sentences(prediction.hints(state, **given), truth)
    return Question(prediction, truth, hints, prediction.question.format(**given))


def _steps(engine) -> int:
    stats = getattr(engine, "stats", None)
    return stats.num_steps if stats is not None else len(getattr(engine, "trace", ()) or ())


def supplied_answer(question: Question):
    """The answer CI gives for `...`: PAGEDLAB_ANSWERS = "right" | "wrong" | a JSON file {name: answer}."""
    how = os.environ.get("PAGEDLAB_ANSWERS", "")
    if how == "right":
        return question.truth
    if how == "wrong":
        return wrong_answer(question.truth)
    if how:
        with open(how, encoding="utf-8") as f:
            return json.load(f).get(question.prediction.name, ...)
    return ...


def wrong_answer(truth):
    """A value of the truth's kind that is not the truth."""
    if isinstance(truth, bool) or not isinstance(truth, int | set | frozenset | list):
        return "not this"
    if isinstance(truth, int):
        return truth + 1
    if isinstance(truth, set | frozenset):
        return set(truth) ^ ({-1} if all(isinstance(x, int) for x in truth) else {"no such request"})
    return [*truth, -1]


def _hint_sentences(sentences: list[str], truth) -> list[str]:
    """The hint's sentences less any that contains the answer's text."""
    pattern = re.compile("|".join(rf"(?<!\w){re.escape(w)}(?!\w)" for w in _words(truth)))
    return [s for s in sentences if not pattern.search(s)]
