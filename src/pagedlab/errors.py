"""Foundation: the exception for pagedlab's own bugs, an invariant that does not hold.

Builds on: nothing.
Read with: chapters/01-contiguous-static.md (Pitfalls).

Two kinds of failure, kept apart on purpose:
- a user's mistake (a bad prompt, field or folder) is a `ValueError` naming the
  field, raised at the door before any state changes;
- a broken invariant (a block freed twice, a budget overrun, a region outgrown)
  means pagedlab itself is wrong, and carrying on could hand one request another
  request's K/V. It raises `InvariantError`.

Those checks are never plain `assert` statements: `python -O` strips every
`assert`, and with it the check (and, worse, any call written inside one).
`InvariantError` subclasses `AssertionError`: it is an assertion that survives -O.
"""

from __future__ import annotations


class InvariantError(AssertionError):
    """An internal invariant does not hold: a bug in pagedlab (or in a student's stage), never bad input."""


def check(condition: bool, message: str) -> None:
    """`assert condition, message` that survives `python -O` (for checks whose message costs nothing to build)."""
    if not condition:
        raise InvariantError(message)
