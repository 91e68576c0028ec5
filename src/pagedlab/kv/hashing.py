"""Stage 4: chained block hashes name a full block by its tokens and everything before it; the index finds it.

Builds on: request.py, kv/block_pool.py (KVCacheBlock, its block_hash).
Read with: chapters/04-prefix-caching.md.

    hash(block i) = H(hash(block i-1) or NONE_HASH, tokens of block i, extra keys)

Because each hash folds in its parent's, equal hashes mean equal *prefixes*,
not just equal blocks: "the cat" after "ROMEO:" and after "JULIET:" are
different blocks. Only full blocks are hashed; the partly filled last block
of a request is never shared through the cache.

H is SHA-256 over a stable serialization by default. A cache keyed by hashes
returns another request's K/V on a collision, so with untrusted tenants a
weak hash lets one tenant craft prompts that read or poison another's cache;
vLLM switched its default to SHA-256 for that reason. `hash_algo="builtin"`
(Python's hash of a tuple) is faster and fine for a single trusted user.

Because a hash covers the whole prefix, one flat dict finds the longest cached
prefix of a prompt: look its block hashes up in order until one misses.

    request: [h0] [h1] [h2] [h3]         index: h0 -> block 4, h1 -> block 9, h3 -> block 2
    hits:    block 4, block 9            (h2 misses: h3's block is never reached through this prompt)

The caching pool (kv/prefix.py) holds one index and asks it three things:
`get` a hash, `insert` a block that has just filled (with its parent's hash),
`evict` a block that is reused for other tokens. Which free block is reused
first is the eviction policy, the free queue's order (kv/block_pool.py: least
recently used first, as vLLM's; its siblings in kv/eviction.py). Another index,
a tree of blocks that evicts leaves first (kv/radix.py, SGLang's idea), is a
sibling class with these methods in its own file, named by a stage preset's
`kv_parts` (stages.py).
vLLM: vllm/v1/core/kv_cache_utils.py (hash_block_tokens, NONE_HASH, generate_block_hash_extra_keys),
vllm/v1/core/block_pool.py (BlockHashToBlockMap, cached_block_hash_to_block).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import KVCacheBlock
from pagedlab.request import Request

BlockHash = bytes | int


def make_none_hash(seed: int = 0) -> bytes:
    """The parent hash of every first block; seeded so that separate deployments do not share hashes."""
    return hashlib.sha256(f"pagedlab NONE_HASH {seed}".encode()).digest()


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple = (), algo: str = "sha256"):
    """Hash one full block, chained to its parent's hash."""
    key = (parent, tuple(token_ids), extra_keys)
    if algo == "builtin":
        return hash(key)
    return hashlib.sha256(repr(key).encode()).digest()  # repr of ints, bytes and str is stable across runs


def block_extra_keys(request: Request, block_index: int) -> tuple:
    """What besides tokens decides whether K/V can be shared: the tenant's salt, on the first block.

    The salt is folded into block 0 only; the chain carries it to every later block.
    (LoRA adapter names or multimodal inputs would be added here too.)
    """
    if block_index == 0 and request.cache_salt is not None:
        return (("cache_salt", request.cache_salt),)
    return ()


# BEGIN SOLUTION
# TASK block-hashing (25 pts): chained block hashing: hash each newly full block with its parent's hash, once, as tokens
# arrive.
def update_block_hashes(request: Request, block_size: int, none_hash: bytes, algo: str = "sha256") -> None:
    """Append to request.block_hashes the hash of each block of request.all_token_ids that is full and not hashed
    yet: hash_block_tokens(parent, its block_size tokens, block_extra_keys(request, i), algo), where parent is the
    previous block's hash (none_hash for block 0). A partly filled block is not hashed; earlier hashes never change."""
    hashes = request.block_hashes
    tokens = request.all_token_ids
    for i in range(len(hashes), len(tokens) // block_size):
        parent = hashes[i - 1] if i else none_hash
        chunk = tokens[i * block_size : (i + 1) * block_size]
        hashes.append(hash_block_tokens(parent, chunk, block_extra_keys(request, i), algo))


# END SOLUTION


class HashChainIndex:
    """block hash -> the block holding that prefix. Invariant: it maps exactly the blocks whose block_hash is
    set, each under its own hash; one block per hash."""

    def __init__(self):
        self.cached_block_hash_to_block: dict = {}  # block_hash -> its block (vLLM's name)

    # BEGIN SOLUTION
    # TASK prefix-index (20 pts): the prefix index: find a cached block by its hash, register a block that
    # has just filled (once per hash), forget a block's hash when the block is reused.
    def get(self, block_hash) -> KVCacheBlock | None:
        """The block registered under `block_hash`, or None."""
        return self.cached_block_hash_to_block.get(block_hash)

    def insert(self, block: KVCacheBlock, block_hash, parent=None) -> bool:
        """Register a just-filled block: set block.block_hash, map the hash to the block, return True. If the hash
        is already mapped (another block holds this prefix), change nothing and return False. `parent`: the hash
        of the block before it (None for a first block); a chained hash already names the whole prefix, so this
        index ignores it (a tree of blocks, kv/radix.py, hangs the block under it)."""
        if block_hash in self.cached_block_hash_to_block:
            return False  # computed twice in one step: keep the first, this one stays uncached
        block.block_hash = block_hash
        self.cached_block_hash_to_block[block_hash] = block
        return True

    def evict(self, block: KVCacheBlock) -> None:
        """The block is being reused for other tokens: unmap its hash and set block.block_hash to None (a block
        without a hash: nothing to do)."""
        if block.block_hash is not None:
            del self.cached_block_hash_to_block[block.block_hash]
            block.block_hash = None

    # END SOLUTION

    def attach(self, free_queue) -> None:
        """The pool's free queue, given as the pool is built: a flat map lets the eviction policy take any free
        block (a tree of blocks, kv/radix.py, asks it to keep a block whose children are cached)."""

    def reset(self) -> None:
        """Forget every hash (vLLM's reset_prefix_cache)."""
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()

    def __len__(self) -> int:
        return len(self.cached_block_hash_to_block)

    def blocks(self):
        return self.cached_block_hash_to_block.values()

    def check_invariants(self, pool_blocks: list[KVCacheBlock]) -> None:
        for block_hash, block in self.cached_block_hash_to_block.items():
            if block.block_hash != block_hash:
                raise InvariantError(f"{block} is mapped under a hash it does not carry")
        if sum(1 for b in pool_blocks if b.block_hash is not None) != len(self):
            raise InvariantError("a block carries a hash the cache forgot")
