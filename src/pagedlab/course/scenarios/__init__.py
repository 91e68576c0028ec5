"""Course: the scenarios that grade each task, as plain-data observations the grader compares with the reference's.

Builds on: course/scenarios/common.py; each stage's module (stage1.py .. stage6.py) imports the parts it drives.
Read with: chapters/98-assignments.md (Scenarios, The boundary).

A task's scenarios are a few fixed, visible cases and one seeded case run
`num_seeded` times with seeds drawn when grading starts. Each case is a
function of a random.Random that exercises the task's component and returns
what it observed: return values, block ids, queue orders, ref counts, hashes,
tensors as rounded numbers. The grader runs every case twice, once on the
student's code in a sandbox and once on the teacher's reference in its own
process, and a case passes when the observations are equal:

    free-queue   fixed: pops_from_the_head, removes_from_the_middle, ...   seeded: program-1 .. program-4
                 student's FreeKVCacheBlockQueue  ->  [["popleft", 0, ["ok", 0], [[1, 2, 3], [1, 2, 3]], 3], ...]
                 reference's                      ->  the same? the case passes

A task's scenarios run the teacher's code for every other task of its stage
(`builds_on` names those it uses), so each task earns its points alone.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable
from dataclasses import dataclass

NUM_SEEDED = 4  # seeded cases per task (stage 6's kernels, slow under the interpreter, run fewer)


@dataclass(frozen=True)
class TaskScenarios:
    """The cases that grade one task."""

    task: str  # the task id of its region ("free-queue")
    builds_on: tuple[str, ...]  # the stage's other tasks its cases run (always the teacher's code for those)
    fixed: tuple[Callable, ...]  # the visible cases: fn(rng) -> observation, rng seeded by the case's name
    seeded: Callable  # fn(rng) -> observation, run `num_seeded` times with seeds drawn at grading time
    num_seeded: int = NUM_SEEDED
    warm: tuple[str, ...] = ()  # modules to import before the first case (torch: its import is not the case's time)

    def case_names(self, seeded: bool = True) -> list[str]:
        names = [fn.__name__ for fn in self.fixed]
        return names + ([f"seeded-{i + 1}" for i in range(self.num_seeded)] if seeded else [])


def stage_scenarios(stage: int | str) -> dict[str, TaskScenarios]:
    """The stage's scenarios by task id (the stage's module is imported only now: stage 6's imports Triton); a name
    ("drills") is a suite of its own, course/scenarios/drills.py."""
    name = stage if isinstance(stage, str) else f"stage{stage}"
    module = importlib.import_module(f"pagedlab.course.scenarios.{name}")
    return {s.task: s for s in module.SCENARIOS}


def run_case(scenarios: TaskScenarios, name: str, seed: int | None):
    """The observation of one case; a seeded case needs the grading's seed (None: only the fixed ones exist)."""
    fixed = {fn.__name__: fn for fn in scenarios.fixed}
    if name in fixed:
        return fixed[name](random.Random(f"{scenarios.task}:{name}"))
    if seed is None or not name.startswith("seeded-"):
        raise KeyError(f"{scenarios.task}: no case {name!r}")
    return scenarios.seeded(random.Random(f"{seed}:{scenarios.task}:{name}"))
