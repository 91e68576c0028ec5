"""Course: a planted fault: a text of the reference that becomes another.

Builds on: nothing of pagedlab.
Read with: course/drills/catalog.py.
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
