"""Course: incident drills: a copy of the engine with one realistic fault planted, a ticket, a grader.

Builds on: course/drills/fault.py (Fault), catalog.py (the drills: fault, ticket, post-mortem), grading.py.
Read with: chapters/98-assignments.md (Incident drills).
"""

from __future__ import annotations

from pagedlab.course.drills.catalog import DRILLS
from pagedlab.course.drills.fault import Fault

__all__ = ["DRILLS", "Fault", "faults"]


def faults(stage: int) -> list[Fault]:
    """The drills' faults planted in stage `stage`'s code: the stage of the task the drill's grader aims at (the
    mutation grader adds them to its mutants)."""
    return [d.fault for d in DRILLS if d.fault_stage == stage]
