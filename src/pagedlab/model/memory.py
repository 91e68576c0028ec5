"""Foundation: what a device can hold: the bytes free on it now, and the check that refuses what would not fit.

Builds on: config.py (format_bytes).
Read with: chapters/01-contiguous-static.md (Pitfalls).

The loader checks a model's weights here before building it, and the engine its
weights, KV pool, swap pool and block tables before allocating them, so that a
size that cannot fit is a ValueError saying how much it would take, not minutes
of work and then an allocator's crash (or the kernel's out-of-memory killer).
"""

from __future__ import annotations

import os
from pathlib import Path

from pagedlab.config import format_bytes


def check_memory(parts: dict, device: str) -> None:
    """Refuse what cannot fit: parts is {field to blame: (bytes, what)}; the largest part names the field.

    A lower bound (activations come on top), so it never refuses what could have run.
    """
    available = available_memory(device)
    total = sum(size for size, _ in parts.values())
    if available is None or total <= available:
        return
    field, (size, what) = max(parts.items(), key=lambda item: item[1][0])
    raise ValueError(
        f"{field}: {what} take {format_bytes(size)}, {format_bytes(total)} in all with the rest, "
        f"but {device} has {format_bytes(available)} available"
    )


def available_memory(device: str) -> int | None:
    """Bytes free on `device` now (None where it cannot be told)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    if device != "cpu":
        return None
    limits = [_meminfo_available(), _cgroup_available()]
    known = [b for b in limits if b is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    """Linux's MemAvailable, or free pages where sysconf knows them (other Unix systems)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """A container's memory limit minus its use (cgroup v2), when it has one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)
