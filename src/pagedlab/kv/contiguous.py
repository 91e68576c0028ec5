"""Stage 1: a contiguous KV cache, one fixed region of blocks reserved per request at admission.

Builds on: request.py.
Read with: chapters/01-contiguous-static.md.

Before PagedAttention, serving systems (the paper's "Orca" baselines, Hugging
Face's static cache) gave each request one contiguous stretch of KV memory
big enough for the longest sequence it might become. The pool here is cut into
regions of R = ceil(max_model_len / block_size) blocks:

    pool:    | region 0 (R blocks) | region 1 (R blocks) | region 2 ... | leftover |
    request A holds region 0 for its whole life, using maybe 40 of R*block_size slots

Blocks are only the unit of size here (so stage 2 can be compared block for
block); a request's slots are simply region_start + position. Everything a
request will never use is reserved anyway: that is the waste stage 2 removes.

Invariant: every region is either free or owned by exactly one request.
"""

from __future__ import annotations

import heapq
import math

from pagedlab.errors import InvariantError, check
from pagedlab.kv.window import NoWindow
from pagedlab.request import Request


class ContiguousKVCacheManager:
    """Reserves one region of `region_size` blocks per request; first fit (lowest free region)."""

    prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache (none before stage 4)
    prefix_cache_hits = 0  # of those, tokens found cached
    window = NoWindow()  # no sliding window before stage 2

    def __init__(self, num_kv_blocks: int, block_size: int, max_model_len: int):
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.region_size = math.ceil(max_model_len / block_size)  # R, in blocks
        self.num_regions = num_kv_blocks // self.region_size
        self.free_regions = list(range(self.num_regions))  # a heap: first fit = lowest index
        self.region_of: dict[str, int] = {}  # request_id -> its region

    @classmethod
    def from_config(cls, config) -> ContiguousKVCacheManager:
        return cls(config.num_kv_blocks, config.block_size, config.max_model_len)

    # BEGIN SOLUTION
    # TASK contiguous-reservation (50 pts): static admission (can_admit) and the contiguous reservation (allocate_slots,
    # free).
    def can_admit(self, group: list[Request], running: list[Request]) -> bool:
        """Static admission: True if every request of `group` can get a whole free region after the requests of
        `running` that have no region yet (admitted, not yet allocated) take theirs."""
        pending = sum(1 for r in running if r.request_id not in self.region_of)
        return pending + len(group) <= len(self.free_regions)

    def can_ever_admit(self, group: list[Request]) -> bool:
        """True if an empty pool has a region for every request of `group`."""
        return len(group) <= self.num_regions

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """The first call for a request reserves the lowest free region whole and returns its block ids
        (region * region_size up to (region + 1) * region_size - 1); later calls return [] (the room is there).
        None when no region is free. Raises InvariantError with "outgrew" in its message when
        num_computed_tokens + num_new_tokens exceeds the region's region_size * block_size slots."""
        region = self.region_of.get(request.request_id)
        if region is not None:
            if request.num_computed_tokens + num_new_tokens > self.region_size * self.block_size:
                raise InvariantError(f"{request.request_id} outgrew its region")
            return []
        if not self.free_regions:
            return None
        region = heapq.heappop(self.free_regions)
        self.region_of[request.request_id] = region
        return list(range(region * self.region_size, (region + 1) * self.region_size))

    def free(self, request: Request) -> None:
        """Give the request's region back (the lowest free region is the next reserved); a request without one
        (never admitted, or freed already) is a no-op."""
        region = self.region_of.pop(request.request_id, None)
        if region is not None:
            heapq.heappush(self.free_regions, region)

    # END SOLUTION

    def take_block_copies(self) -> list:
        return []  # regions are never shared

    def lookup_prefix(self, request: Request) -> int:
        return 0  # no prefix cache: every prompt token is computed

    def reset_prefix_cache(self) -> bool:
        """Nothing is cached; as in vLLM, refused (False) while any region is in use."""
        return not self.region_of

    def get_block_ids(self, request: Request) -> list[int]:
        region = self.region_of.get(request.request_id)
        return [] if region is None else list(range(region * self.region_size, (region + 1) * self.region_size))

    def slots_held(self, request: Request) -> int:
        """KV slots this request holds (used or not)."""
        return self.region_size * self.block_size if request.request_id in self.region_of else 0

    @property
    def num_used_blocks(self) -> int:
        return len(self.region_of) * self.region_size

    @property
    def num_free_blocks(self) -> int:
        return self.num_kv_blocks - self.num_used_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_kv_blocks

    def check_invariants(self) -> None:
        owned = sorted(self.region_of.values())
        check(len(owned) == len(set(owned)), "a region is owned twice")
        check(not set(owned) & set(self.free_regions), "an owned region is also free")
        check(len(owned) + len(self.free_regions) == self.num_regions, "a region leaked")
