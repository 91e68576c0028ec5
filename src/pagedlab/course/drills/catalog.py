"""Course: the incident drills: for each, the fault planted, the symptom's scenarios and those aimed at the fault.

Builds on: course/drills/fault.py (Fault), course/scenarios/drills.py (symptoms), course/scenarios/stage2..5.py.
Read with: chapters/98-assignments.md (Incident drills); each drill's ticket and post-mortem: course/drills/NAME.md.

A drill is named for its symptom, never its cause: the name is on the student's copy. Its `aimed` cases are those
a fix at the fault passes and a fix that only masks the symptom elsewhere does not: the scenarios of the task whose
region holds the fault (the unit-level cases an assignment grades it by), or a case of course/scenarios/drills.py
for a fault outside every region.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pagedlab.course.drills.fault import Fault

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Drill:
    """One incident: the fault, where the grader aims, and the ticket a user would write."""

    name: str  # the symptom, in a few words: "stale-hits" (never the cause)
    stage: int  # the stage whose engine the ticket's user runs
    title: str  # the ticket's subject line
    fault: Fault
    symptom: str  # its symptom's scenarios: course/scenarios/drills.py's "symptom-<symptom>"
    aimed: tuple[tuple[str, str], ...]  # (suite, task): stage-N task scenarios, or ("drills", "aimed-...")

    @property
    def fault_stage(self) -> int:
        """The stage whose code holds the fault: its aimed task's (a drill's own aimed case: the drill's stage)."""
        suite = self.aimed[0][0]
        return int(suite) if suite.isdigit() else self.stage

    @property
    def texts(self) -> dict[str, str]:
        """{"ticket": ..., "postmortem": ...}, from course/drills/<name>.md."""
        return _texts(self.name)

    @property
    def ticket(self) -> str:
        return self.texts["ticket"]

    @property
    def postmortem(self) -> str:
        return self.texts["postmortem"]

    @property
    def repro(self) -> str:
        """The ticket's script (its one ```python block), as the user attached it."""
        text = self.ticket
        start = text.index("```python\n") + len("```python\n")
        return text[start : text.index("```", start)]


@cache
def _texts(name: str) -> dict[str, str]:
    text = (HERE / f"{name}.md").read_text()
    ticket, _, postmortem = text.partition("\n## Post-mortem\n")
    if not postmortem:
        raise ValueError(f"drill {name}: {name}.md has no '## Post-mortem' section")
    return {"ticket": ticket.strip() + "\n", "postmortem": "## Post-mortem\n" + postmortem.strip() + "\n"}


def _task(stage: int, *tasks: str) -> tuple[tuple[str, str], ...]:
    return tuple((str(stage), t) for t in tasks)


DRILLS: list[Drill] = [
    Drill(
        "garbled-after-sixteen", 2, "Stage 2 answers go wrong once a sequence passes 16 tokens (stage 1 is fine)",
        Fault("worker/runner.py", "return block_table[req_idx, positions // bs]",
              "return block_table[req_idx, (positions - 1) // bs]", "off-by-one"),
        "past-first-block", _task(2, "slot-mapping"),
    ),
    Drill(
        "hangs-when-full", 5, "A request that fits the pool exactly never finishes; the engine spins at 100 % CPU",
        Fault("kv/paged.py", "if needed > self.pool.num_free:", "if needed >= self.pool.num_free:",
              "comparison off by one"),
        "room-for-exactly-one", _task(2, "allocate-slots"),
    ),
    Drill(
        "odd-length-garbage", 2, "Prompts of odd lengths get answers that belong to nobody",
        Fault("kv/paged.py", "needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size)",
              "needed = (request.num_computed_tokens + num_new_tokens) // self.block_size", "rounding"),
        "odd-lengths", _task(2, "allocate-slots"),
    ),
    Drill(
        "siblings-disagree", 3, "n=2 with a seed: each completion differs from the same seed asked alone",
        Fault("kv/cow.py", "        blocks[index] = new\n", "", "dropped statement"),
        "sampled-siblings", _task(3, "fork-cow"),
    ),
    Drill(
        "freed-twice", 3, "InvariantError 'freed twice' when the children of an n>1 request finish",
        Fault("kv/cow.py", "        for block in self.window.held(blocks):  # (a sliding window's null block is "
              "nobody's)\n            block.ref_cnt += 1\n", "", "dropped statement"),
        "siblings-finish", _task(3, "fork-cow"),
    ),
    Drill(
        "cache-mixes-prompts", 4, "With prefix caching on, some answers differ from caching off",
        Fault("kv/hashing.py", "parent = hashes[i - 1] if i else none_hash", "parent = none_hash",
              "dropped dependency"),
        "shared-middles", _task(4, "block-hashing"),
    ),
    Drill(
        "tenants-share-cache", 4, "Tenant isolation: bob's first request hits alice's cached blocks",
        Fault("kv/hashing.py", "if block_index == 0 and request.cache_salt is not None:",
              "if block_index == 1 and request.cache_salt is not None:", "off-by-one"),
        "two-tenants", _task(4, "block-hashing"),
    ),
    Drill(
        "wrong-after-warmup", 4, "Answers are right for the first minutes, then wrong once the pool has wrapped around",
        Fault("kv/prefix.py", "            self.index.evict(block)  # reused for other tokens: its prefix is gone\n",
              "            pass\n", "dropped statement"),
        "cache-under-pressure", _task(4, "caching-pool"),
    ),
    Drill(
        "hits-under-pressure", 4, "Cache hits under memory pressure: garbled answers, then an InvariantError",
        Fault("kv/prefix.py",
              "            if block.ref_cnt == 0:\n                self.free_block_queue.remove(block)\n", "",
              "dropped statement"),
        "cache-under-pressure", _task(4, "caching-pool"),
    ),
    Drill(
        "repeat-hangs", 4, "Sending the same prompt twice: the second request never finishes",
        Fault("kv/prefix.py", "limit = (request.num_tokens - 1) // self.block_size",
              "limit = request.num_tokens // self.block_size", "off-by-one"),
        "repeated-prompt", _task(4, "lookup"),
    ),
    Drill(
        "urgent-starves", 5, "Under load, priority-0 requests finish last and are preempted over and over",
        Fault("sched/queue.py", "return max(running, key=lambda r: (r.priority, r.arrival_time, r.group_id))",
              "return min(running, key=lambda r: (r.priority, r.arrival_time, r.group_id))", "reversed choice"),
        "urgent-requests", _task(5, "victim"),
    ),
    Drill(
        "priority-ignored", 5, "scheduling_policy='priority' has no effect: requests run in arrival order",
        Fault("sched/queue.py", "(first.priority, first.arrival_time, first.group_id, next(self._seq), list(group))",
              "(first.arrival_time, first.priority, first.group_id, next(self._seq), list(group))", "swapped key"),
        "priority-order", (("drills", "aimed-queue-order"),),
    ),
    Drill(
        "leak-on-disconnect", 5, "KV usage never returns to zero after clients disconnect; later requests queue",
        Fault("sched/base.py", "        for request in ended:\n            self._finish(request, status)\n",
              "        for request in ended:\n"
              "            (self.running if request in self.running else self.waiting).remove(request)\n"
              "            request.status = status\n"
              "            self.finished_req_ids.add(request.request_id)\n"
              "            self.requests.end(request)\n", "forgotten release"),
        "clients-disconnect", (("drills", "aimed-abort-frees-blocks"),),
    ),
    Drill(
        "swap-scrambles", 5, "With preemption_mode='swap', answers go wrong under load (recompute is fine)",
        Fault("kv/swap.py", "return [(c, b.block_id) for c, b in zip(cpu, blocks)]",
              "return [(c, b.block_id) for c, b in zip(cpu, reversed(blocks))]", "wrong mapping"),
        "swapping", _task(5, "swap"),
    ),
    Drill(
        "preempted-crash", 5, "InvariantError '...: preempted, yet sent to the runner' under load with n=2",
        Fault("sched/continuous.py", "            out.new_block_tables.pop(request.request_id, None)\n", "",
              "dropped statement"),
        "forks-under-pressure", (*_task(5, "preempt"), ("drills", "aimed-forks-preempted")),
    ),
]  # fmt: skip

BY_NAME = {d.name: d for d in DRILLS}


def drill(name: str) -> Drill:
    """The drill called `name`; a ValueError naming the known ones otherwise."""
    if name not in BY_NAME:
        raise ValueError(f"drill: no drill {name!r} (pagedlab drill list: {', '.join(BY_NAME)})")
    return BY_NAME[name]
