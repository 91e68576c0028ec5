"""Course: incident drills: a copy of the engine with one realistic fault planted, a ticket, a grader.

Builds on: course/drills/catalog.py (the drills: fault, ticket, post-mortem), course/drills/grading.py.
Read with: chapters/98-assignments.md (Incident drills).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    """One planted fault: in the file `path` (relative to src/pagedlab), the text `old` (found exactly once in the
    reference) becomes `new`. `kind` says what sort of slip it is (for the mutation grader's report)."""

    path: str
    old: str
    new: str
    kind: str = "drill fault"

    def apply(self, text: str) -> str:
        """The reference's text of `path` with the fault planted; a ValueError if `old` is not there exactly once."""
        if text.count(self.old) != 1:
            raise ValueError(f"fault: {self.path} holds its text {text.count(self.old)} times, not once")
        return text.replace(self.old, self.new)


def faults(stage: int) -> list[Fault]:
    """The drills' faults planted in stage `stage`'s code: the stage of the task the drill's grader aims at (the
    mutation grader adds them to its mutants)."""
    from pagedlab.course.drills.catalog import DRILLS

    return [d.fault for d in DRILLS if d.fault_stage == stage]
