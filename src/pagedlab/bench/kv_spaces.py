"""Benchmarks: the KV memories `pagedlab bench memory` compares, contiguous regions (first fit) and paged blocks.

Builds on: kv/paged.py (the stage-2 manager, used as is), request.py.
Read with: chapters/97-architecture.md (Benchmarks), chapters/02-paged-blocks.md.

Each system is a KVSpace: the KV managers' `allocate_slots` / `free` vocabulary,
counted in slots so that contiguous regions and paged blocks compare directly.

    system             a request holds                                  class
    contiguous-max     one region of max_model_len                      ContiguousSpace, its regions
    contiguous-pow2    one region: the next power of two >= final len   carved by a FirstFitAllocator
    contiguous-oracle  one region of exactly its final length
    paged              blocks, allocated as its tokens arrive           PagedSpace (the stage-2 manager)

Contiguous regions are reserved whole at admission and carved first fit from
the pool's holes; freeing one coalesces it with its neighbours. When no hole
fits a region although enough slots are free in all: external fragmentation.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

from pagedlab.errors import InvariantError
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.request import Request

SYSTEMS = ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged")


class FirstFitAllocator:
    """Free slots of a pool as holes (start, length); a request's region is carved from the first hole that fits.

    Invariant: holes are sorted by start, disjoint and never adjacent (free coalesces neighbours), and
    holes + allocated regions tile the pool exactly.

        pool:  [ A A A | . . | B B B B | . . . . . . ]      holes [(3, 2), (9, 6)]
        allocate(4) skips the hole of 2 and takes slots 9..12: first fit, not best fit
    """

    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self.holes: list[tuple[int, int]] = [(0, num_slots)]  # (start, length), sorted by start
        self.allocated: dict[int, int] = {}  # start -> length of each region handed out

    @property
    def num_free(self) -> int:
        return sum(length for _, length in self.holes)

    def allocate(self, size: int) -> int | None:
        """Start of a region of `size` slots from the lowest hole that fits; None if no hole is big enough."""
        if size < 1:
            raise InvariantError(f"a region needs at least one slot, got {size}")
        for i, (start, length) in enumerate(self.holes):
            if length >= size:
                if length == size:
                    del self.holes[i]
                else:
                    self.holes[i] = (start + size, length - size)
                self.allocated[start] = size
                return start
        return None

    def free(self, start: int) -> None:
        """Return the region starting at `start`, merging it with the holes on either side."""
        if start not in self.allocated:
            raise InvariantError(f"no region starts at slot {start} (freed twice?)")
        size = self.allocated.pop(start)
        i = bisect.bisect(self.holes, (start, 0))
        if i > 0 and sum(self.holes[i - 1]) == start:  # the hole before ends where we start
            i -= 1
            start, size = self.holes[i][0], self.holes.pop(i)[1] + size
        if i < len(self.holes) and self.holes[i][0] == start + size:  # the hole after starts where we end
            size += self.holes.pop(i)[1]
        self.holes.insert(i, (start, size))


class KVSpace(Protocol):
    """What the simulation needs of a KV memory: the KV managers' `allocate_slots` / `free` vocabulary, in slots."""

    pool_slots: int

    def allocate_slots(self, request: Request, num_new_tokens: int) -> object | None: ...
    def free(self, request: Request) -> None: ...
    def slots_held(self, request: Request) -> int: ...
    @property
    def num_free_slots(self) -> int: ...


class ContiguousSpace:
    """Orca-style: one contiguous region per request, sized at admission by `region_len`, placed first fit.

    Invariant: a request holds exactly one region from admission until it is freed, and never outgrows it.
    """

    def __init__(self, pool_slots: int, region_len: Callable[[Request], int]):
        self.pool_slots = pool_slots
        self.region_len = region_len  # request -> slots reserved for its whole life
        self.allocator = FirstFitAllocator(pool_slots)
        self.region_of: dict[str, tuple[int, int]] = {}  # request_id -> (start, length)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> range | None:
        """Slots newly reserved: the whole region on the first call, nothing later; None if no hole fits."""
        new = range(0)
        if request.request_id not in self.region_of:
            size = self.region_len(request)
            start = self.allocator.allocate(size)
            if start is None:
                return None
            self.region_of[request.request_id] = (start, size)
            new = range(start, start + size)
        start, size = self.region_of[request.request_id]
        if request.num_computed_tokens + num_new_tokens > size:
            raise InvariantError(f"{request.request_id} outgrew its region")
        return new

    def free(self, request: Request) -> None:
        start, _ = self.region_of.pop(request.request_id)
        self.allocator.free(start)

    def slots_held(self, request: Request) -> int:
        return self.region_of.get(request.request_id, (0, 0))[1]

    @property
    def num_free_slots(self) -> int:
        return self.allocator.num_free


class PagedSpace(PagedKVCacheManager):
    """The stage-2 paged manager, unchanged, measured in slots instead of blocks."""

    @property
    def pool_slots(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def num_free_slots(self) -> int:
        return self.num_free_blocks * self.block_size


def make_space(system: str, pool_slots: int, max_model_len: int = 2048, block_size: int | None = None) -> KVSpace:
    """The KV memory of one of SYSTEMS over a pool of `pool_slots` slots."""
    region_lens = {
        "contiguous-max": lambda r: max_model_len,
        "contiguous-pow2": lambda r: 1 << (r.max_num_tokens - 1).bit_length(),  # next power of two >= final length
        "contiguous-oracle": lambda r: r.max_num_tokens,
    }
    if system in region_lens:
        return ContiguousSpace(pool_slots, region_lens[system])
    if system != "paged":
        raise ValueError(f"system must be one of {SYSTEMS}, got {system!r}")
    if block_size is None or pool_slots % block_size:
        raise ValueError(f"paged needs a block_size that divides pool_slots={pool_slots}, got {block_size}")
    return PagedSpace(pool_slots // block_size, block_size, max_model_len)
