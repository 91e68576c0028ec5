"""Stage 2: predict, then check: the prediction points of notebooks 02 to 05.

Builds on: sched/ (a copy of the scheduler, stepped once, says what the next step will do), kv/ (block tables,
the free queue, the prefix cache), engine/engine.py (`process_inputs`: a request built without queueing it).
Read with: chapters/98-assignments.md (Prediction points), the notebooks 02_paged_blocks to 05_continuous_batching.

A notebook poses a question, the learner writes an answer into a variable, and `check(name, answer, state)`
compares it with the truth, computed from the engine at that moment, never written down:

    guess = ...  # your answer
    check("02-next-block", guess, llm)     ✓ right: ...        or   ✗ not quite: <a hint>

A question about the *next* step is answered by a lookahead: a deep copy of the scheduler (and so of its KV
manager and requests) runs `schedule()` once. Scheduling needs no model: which blocks are allocated, copied or
freed, who is admitted or preempted, depends only on token counts. The live engine is never touched.

A hint says something true and useful about the question; any sentence of it that would give the answer away
(one that contains the answer's text) is dropped. Teachers get the answer with `answer(name, state)`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedlab.lessons.stage4 import STAGE4_PREFIX
from pagedlab.sampling_params import SamplingParams

STALE = "this question is about the engine right after the cell above it: run the notebook again up to here"
NO_HINT = "look again at the state printed above."
PLACEHOLDER = "write your answer into the variable first (replace the `...`), then run this cell again"


@dataclass(frozen=True)
class Prediction:
    """One prediction point. `truth` and `hints` read the state they are given and change nothing."""

    name: str  # "02-next-block": the notebook's number, then what it asks
    question: str  # as the notebook poses it
    truth: Callable[[Any], Any]  # state (an LLM or its engine) -> the true answer, now
    hints: Callable[[Any], list[str]]  # state -> sentences that help without telling
    kind: str = "exact"  # "exact" (a list or a value), "set" (order does not matter) or "int"
    explain: str = ""  # shown after a right answer


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


def _free_after_step(state) -> list[int]:
    """The free queue after the next step, once the requests it finishes have freed their blocks (the notebooks
    set ignore_eos: a request ends when it samples its max_tokens-th token)."""
    scheduler, out = ahead(state)
    for request in out.scheduled:
        fed = request.num_computed_tokens + out.num_scheduled_tokens[request.request_id]
        if fed >= request.num_tokens and request.num_output_tokens + 1 >= request.max_tokens:
            scheduler.kv.free(request)
    return [b.block_id for b in scheduler.kv.pool.free_block_queue.get_all_free_blocks()]


def _admitted(state) -> set[str]:
    running = {r.request_id for r in _engine(state).scheduler.running}
    scheduler, _ = ahead(state)
    return {r.request_id for r in scheduler.running} - running


def _gained(state) -> set[int]:
    """The blocks that the next step adds to the running requests' tables."""
    engine = _engine(state)
    before = {b for r in engine.scheduler.running for b in engine.kv_manager.get_block_ids(r)}
    scheduler, _ = ahead(state)
    return {b for r in scheduler.running for b in scheduler.kv.get_block_ids(r)} - before


def _slots_in_last_block(state, rid: str) -> int:
    engine = _engine(state)
    n, size = _find(engine.scheduler, rid).num_computed_tokens, engine.kv_manager.block_size
    return n - (n - 1) // size * size if n else 0


def _num_copies(state) -> int:
    return len(ahead(state)[1].block_copies)


def _fed(rid: str) -> Callable:
    return lambda state: ahead(state)[1].num_scheduled_tokens.get(rid, 0)


def _max_blocks(state) -> str:
    engine = _engine(state)
    return ", ".join(f"{r.request_id}: {engine.kv_manager.max_blocks(r)}" for r in engine.scheduler.waiting)


def _greedy(max_tokens: int = 3) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _cached_free(state) -> set[int]:
    pool = _engine(state).kv_manager.pool
    return {b.block_id for b in pool.cached_block_hash_to_block.values() if b.ref_cnt == 0}


def _b_arrives(state):
    return ahead(state, (("B", STAGE4_PREFIX + "hark", _greedy(), None),))


def _hits_of_b(state) -> int:
    scheduler, _ = _b_arrives(state)
    return scheduler.kv.prefix_cache_hits - _engine(state).kv_manager.prefix_cache_hits


def _preempted(state) -> set[str]:
    return set(ahead(state)[1].preempted_req_ids)


# --- the predictions, by notebook -----------------------------------------------------------------------

_SLOT = "slot = block_table[pos // block_size] * block_size + pos % block_size."
_HEAD = (
    "A block a table lacks comes from the head of the free queue, and requests earlier in the batch take theirs first."
)

NOTEBOOK_02 = [
    Prediction(
        "02-admitted",
        "Which of A to E will step 1 admit? (a set of request ids)",
        _admitted,
        lambda s: [
            f"Admission is static and by worst case; the worst cases in blocks are {_max_blocks(s)}.",
            f"The pool has {_engine(s).kv_manager.pool.num_blocks} blocks, and requests are admitted in arrival "
            "order until the next worst case no longer fits.",
        ],
        kind="set",
        explain="Their worst cases add up to the whole pool; the rest wait for the batch to empty.",
    ),
    Prediction(
        "02-next-block",
        "In step 2, which physical block will B's next token land in?",
        lambda s: _new_slot(s, "B") // _engine(s).kv_manager.block_size,
        lambda s: [
            "B's next position is its number of computed tokens: which logical block is it in (pos // block_size)?",
            f"B's table is {_engine(s).kv_manager.get_block_ids(_find(_engine(s).scheduler, 'B'))}.",
            _HEAD,
        ],
        kind="int",
        explain="B's last block was full, so allocate_slots took the block at the head of the free queue.",
    ),
    Prediction(
        "02-free-after-finish",
        "B produces its last token in step 3. What will the free queue be after step 3, head to tail?",
        _free_after_step,
        lambda s: [
            "Before anyone finishes, a request whose last block is full takes a block from the head of the queue.",
            "`free` then gives a finished request's blocks to the head (nothing is cached at stage 2), last block "
            "first, so that the last one freed is the first reused.",
        ],
        explain="Freed last block first, each to the head: B's blocks are reused before any other (vLLM's order).",
    ),
    Prediction(
        "02-E-table",
        "E is admitted in step 7. What will its block table be?",
        lambda s: ahead(s)[0].kv.get_block_ids(_find(ahead(s)[0], "E")),
        lambda s: [
            f"E's prompt has {_find(_engine(s).scheduler, 'E').num_prompt_tokens} tokens: cdiv(that, block_size) "
            "blocks, for the prompt only.",
            "They are taken one by one from the head of `free_queue()`, in the order it lists them.",
        ],
        explain="The head of the queue held A's old blocks, freed last block first: a table need not be in order.",
    ),
    Prediction(
        "02-next-slot",
        "In step 8, which slot of the pool will receive the K/V of E's next token?",
        lambda s: _new_slot(s, "E"),
        lambda s: [
            _SLOT,
            "E's next position is its number of computed tokens: does its table have that logical block yet?",
            _HEAD,
        ],
        kind="int",
        explain="E's next token opened a new logical block, taken from the head of the queue: its offset 0.",
    ),
]

NOTEBOOK_03 = [
    Prediction(
        "03-leader-feeds",
        "How many tokens will the leader 0_A feed in step 1?",
        _fed("0_A"),
        lambda s: [
            "The group prefills the prompt once, in the leader, but each child must feed one prompt token itself, "
            "to sample its own first token from it.",
            f"0_A has {_find(_engine(s).scheduler, '0_A').num_prompt_tokens} prompt tokens.",
        ],
        kind="int",
        explain="All but the last prompt token: each child feeds that one itself, after the fork.",
    ),
    Prediction(
        "03-copies-step2",
        "Step 2 forks 1_A and 2_A from the leader, then every child writes its next token. How many block copies "
        "will step 2 make?",
        _num_copies,
        lambda s: [
            "Right after the fork all three children hold the leader's table: every block has three holders.",
            "Only the block a child writes into can need a copy, and only while someone else holds it too.",
            "The last holder of a shared block finds it no longer shared and writes in place.",
        ],
        kind="int",
        explain="The children that write while others still hold the block copy it; the last holder writes in place.",
    ),
    Prediction(
        "03-shared-after-step2",
        "After step 2, which blocks will all three children still share? (a set of block ids)",
        lambda s: set.intersection(*(set(ahead(s)[0].kv.get_block_ids(r)) for r in ahead(s)[0].running)),
        lambda s: [
            "A full block is never written again, so nobody copies it.",
            "The leader's block table and its number of computed tokens say which of its blocks are full.",
        ],
        kind="set",
        explain="Only the full block stays shared; the one being written was copied.",
    ),
    Prediction(
        "03-last-block-slots",
        "After step 2, how many slots of 0_A's last block hold keys and values?",
        lambda s: _slots_in_last_block(s, "0_A"),
        lambda s: [
            "0_A has K/V for its first num_computed_tokens positions: the ones its copy brought and the one it "
            "wrote itself.",
            "Position p lives in logical block p // block_size, at offset p % block_size.",
        ],
        kind="int",
        explain="The copy brought the prompt's slots of the shared block; 0_A then wrote its own next token.",
    ),
    Prediction(
        "03-copies-step3",
        "In step 3 each child writes its next token. How many block copies will step 3 make?",
        _num_copies,
        lambda s: [
            "A block is copied only when a request is about to write into it while its ref_cnt is above 1.",
            "Which block does each child write into now, and who else holds it? `ref_cnts()` says.",
        ],
        kind="int",
        explain="After a copy-on-write each child writes into a block of its own.",
    ),
    Prediction(
        "03-beam-new-blocks",
        "In step 2 every beam writes position 12. Which blocks will the beams' tables gain? (a set of block ids)",
        _gained,
        lambda s: [
            "The prompt is 12 tokens and a block holds 4: is there room for position 12 in a shared block?",
            "A block a table lacks comes from the head of the free queue, one per beam, in batch order.",
        ],
        kind="set",
        explain="The prompt ended on a block boundary: each beam took a fresh block, nothing to copy.",
    ),
]

NOTEBOOK_04 = [
    Prediction(
        "04-B-hits",
        'B = PREFIX + "hark" arrives now. How many of its prompt tokens will hit the cache?',
        _hits_of_b,
        lambda s: [
            "Only full blocks are cached, and a lookup walks the request's block hashes from the first one to "
            "the first miss.",
            "A block's hash covers its tokens and every token before it: which of B's blocks hold exactly what "
            "A's held, after the same tokens?",
        ],
        kind="int",
        explain="B's hashes equal A's up to the first block that differs; the lookup stops there.",
    ),
    Prediction(
        "04-B-table",
        "And what will B's block table be after its first step?",
        lambda s: _b_arrives(s)[0].kv.get_block_ids(_find(_b_arrives(s)[0], "B")),
        lambda s: [
            "A hit keeps the block id it was cached in: `cached()` lists them.",
            "The blocks B still needs come from the head of `free_queue()`, after the hits have left it.",
        ],
        explain="The hits keep their block ids; the new block comes from the head of the free queue.",
    ),
    Prediction(
        "04-C-lookup",
        "C sends exactly A's prompt, and all 4 of its blocks are cached. If C were looked up now, how many of its "
        "prompt tokens would hit?",
        lambda s: lookup(s, STAGE4_PREFIX + "soft", _greedy()),
        lambda s: [
            "C's first output token is sampled from the logits of its last prompt token.",
            "Logits come only from a forward pass: `get_computed_blocks` stops at (num_tokens - 1) // block_size.",
        ],
        kind="int",
        explain="The last prompt token's logits are needed, so the block holding it is computed again.",
    ),
    Prediction(
        "04-cached-free",
        "C is running. Which blocks are cached but free right now (ref_cnt 0, still in the hash map)?",
        _cached_free,
        lambda s: [
            "A freed block keeps its hash until it is reused; a block some table holds has ref_cnt 1 or more.",
            "Compare `cached()` with `ref_cnts` of the pool: `pool.blocks[b].ref_cnt`.",
        ],
        kind="set",
        explain="Freed blocks keep their hashes until allocation reuses (evicts) them.",
    ),
    Prediction(
        "04-E-hits",
        'E sends A\'s exact prompt with cache_salt="tenant-b". How many of its prompt tokens will hit the cache?',
        lambda s: lookup(s, STAGE4_PREFIX + "soft", _greedy(), cache_salt="tenant-b"),
        lambda s: [
            "The salt is an extra key of the first block's hash, and every later hash chains through it.",
            "A lookup stops at the first hash it does not find.",
        ],
        kind="int",
        explain="A different first hash changes every hash after it: nothing hits.",
    ),
]

NOTEBOOK_05 = [
    Prediction(
        "05-step1-fed",
        "How many tokens will step 1 feed to request 2?",
        _fed("2"),
        lambda s: [
            f"The step's budget is {_engine(s).config.max_num_batched_tokens} tokens and no chunk is longer than "
            f"{_engine(s).config.long_prefill_token_threshold}.",
            "Nothing runs yet, so the budget goes to the waiting queue in order: requests 0 and 1 come first.",
            "A request is fed at most what its prompt needs: `requests[rid].num_prompt_tokens`.",
        ],
        kind="int",
        explain="Requests 0 and 1 take a full chunk each; request 2 gets what is left of the budget.",
    ),
    Prediction(
        "05-step2-admitted",
        "Which waiting requests will step 2 admit? (a set of request ids; set() for none)",
        _admitted,
        lambda s: [
            "Running requests are served first, each what its prompt still needs, capped at a chunk.",
            "What is left of the budget goes to the head of the waiting queue, while seats (max_num_seqs) last.",
        ],
        kind="set",
        explain="The running requests took most of the budget; the rest went to the head of the queue.",
    ),
    Prediction(
        "05-preempted-step10",
        "Request 0 needs a new block in step 10 and the pool is empty. Who will be preempted? (a set of ids)",
        _preempted,
        lambda s: [
            "Under FCFS the victim is the newest running request, the last to arrive.",
            "`engine.scheduler.running` lists the running requests in the order they were admitted.",
        ],
        kind="set",
        explain="Under FCFS the newest running request gives its seat back.",
    ),
    Prediction(
        "05-admitted-step10",
        "The preemption frees some blocks. How many waiting requests will step 10 admit?",
        lambda s: len(_admitted(s)),
        lambda s: [
            "Admitting while the pool is so short that someone was just preempted would make the next "
            "preemption likelier.",
            "Read what `schedule` does with the waiting queue in a step that preempted (sched/continuous.py).",
        ],
        kind="int",
        explain="A step that preempts admits nobody, although blocks were freed.",
    ),
    Prediction(
        "05-step11-admitted",
        "Step 10 left free blocks and a free seat. Which waiting requests will step 11 admit? (a set; set() for none)",
        _admitted,
        lambda s: [
            "The running requests are served first, and the ones whose last block is full take a block each.",
            "A waiting request is admitted only if the budget has tokens left and the free blocks cover its whole "
            "prompt (less its cache hits), not just its first chunk.",
            "The preempted request went back to the front of the queue.",
        ],
        kind="set",
        explain="The head of the queue finds too few free blocks for its whole prompt, and nobody may "
        "pass it (head-of-line: the queue's order is the policy).",
    ),
]

PREDICTIONS: dict[str, list[Prediction]] = {"02": NOTEBOOK_02, "03": NOTEBOOK_03, "04": NOTEBOOK_04, "05": NOTEBOOK_05}
BY_NAME: dict[str, Prediction] = {p.name: p for group in PREDICTIONS.values() for p in group}


# --- checking -------------------------------------------------------------------------------------------


def answer(name: str, state) -> Any:
    """For teachers: the true answer of prediction `name` in this state."""
    return BY_NAME[name].truth(state)


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
        return [str(sorted(truth)), str(truth)] if truth else ["set()"]
    return [str(truth)]


def hint(name: str, state) -> str:
    """The hint of prediction `name`: its sentences, less any that contains the answer's text."""
    words = _words(BY_NAME[name].truth(state))
    pattern = re.compile("|".join(rf"(?<!\w){re.escape(w)}(?!\w)" for w in words))
    kept = [s for s in BY_NAME[name].hints(state) if not pattern.search(s)]
    return " ".join(kept) or NO_HINT


def _show(truth) -> str:
    if isinstance(truth, set | frozenset):
        return "{" + ", ".join(map(repr, sorted(truth))) + "}" if truth else "set()"
    return repr(truth)


def verdict(name: str, guess, state) -> tuple[str, str]:
    """("right" | "wrong" | "missing" | "stale", the message check prints)."""
    prediction = BY_NAME[name]
    if guess is ... or guess is None:
        return "missing", PLACEHOLDER
    try:
        truth = prediction.truth(state)
    except (KeyError, IndexError):  # the engine has moved past this point
        return "stale", STALE
    if _same(prediction.kind, guess, truth):
        return "right", f"✓ right: {_show(truth)}. {prediction.explain}".rstrip()
    return "wrong", f"✗ not quite: {hint(name, state)}"


def check(name: str, guess, state) -> None:
    """Print whether `guess` answers prediction `name` in this state, with a hint if not."""
    print(f"{name}: {verdict(name, guess, state)[1]}")
