"""Stage 5: the exercises of chapter 5 (continuous batching), and the run that answers them.

Builds on: llm.py (a traced stage-5 engine), lessons/stage5.py (the figures' workload and pool),
lessons/exercises/core.py.
Read with: chapters/05-continuous-batching.md (Exercises, Solutions).
"""

from __future__ import annotations

import functools

from pagedlab.lessons.exercises.core import Exercise
from pagedlab.lessons.stage5 import STAGE5_POOL, stage5_workload
from pagedlab.llm import LLM


@functools.cache
def step_3() -> dict:
    engine = LLM(stage=5, record_trace=True, **STAGE5_POOL).engine
    for i, (prompt, params) in enumerate(zip(*stage5_workload())):
        engine.add_request(str(i), prompt, params)
    engine.step()
    engine.step()
    live = {r.request_id: r for r in (*engine.scheduler.running, *engine.scheduler.waiting)}
    outputs = {rid: r.num_output_tokens for rid, r in live.items()}
    engine.step()
    before, step = engine.trace[1], engine.trace[2]
    gained = {rid: table[len(before.block_tables.get(rid, [])) :] for rid, table in step.block_tables.items()}
    return {
        "fed": dict(step.scheduled),
        "new_blocks": {rid: blocks for rid, blocks in gained.items() if blocks},
        "samples": {rid for rid, r in live.items() if r.num_output_tokens > outputs[rid]},
    }


EXERCISES = [
    Exercise(
        "05.1",
        "Step 3 by hand",
        step_3,
        parts=("fed", "new_blocks", "samples"),
        form='{"fed": {"0": n, ...}, "new_blocks": {"0": [...], ...}, "samples": {request ids}}',
        hints={
            "fed": (
                "Running requests first, in order: a request still in its prompt takes min(what its prompt "
                "still needs, the chunk threshold, the budget left); a decode takes one token.",
                "What is left of the budget goes to the head of the waiting queue, if a seat is free.",
            ),
            "new_blocks": (
                "A request needs cdiv(computed + fed, block_size) blocks; it takes the difference from "
                "the head of the free queue, in batch order.",
            ),
            "samples": (
                "A request samples only when what it is fed reaches the end of its tokens: a prompt's last "
                "chunk, or a decode.",
            ),
        },
        graded="one continuous step (budget, chunks, blocks, sampling) exactly; vary the budget or the threshold",
        explain="Request 1 is past its prompt, so it decodes one token; the chunks share the rest of the budget.",
        code="sched/continuous.py ContinuousScheduler._schedule_running, _chunk, _schedule_waiting",
    ),
    Exercise("05.2", "A budget below the decodes", solution=True),
    Exercise(
        "05.3",
        "Waiting for the victim",
        solution=True,
        graded="a schedule() of one's own, measured; why two rules agree under FCFS and part under priority",
    ),
    Exercise("05.4", "Swap or recompute?", solution=True),
    Exercise("05.5", "Priority and starvation", solution=True),
    Exercise("05.6", "Read vLLM", solution=True),
]
