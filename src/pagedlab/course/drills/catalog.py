"""Course: the incident drills (filled in by the drills work)."""

from __future__ import annotations

DRILLS: list = []
