"""Stage 4: a radix tree of cached blocks: the prefix index as a tree that evicts leaves first (SGLang's idea).

Builds on: kv/hashing.py (HashChainIndex: the same methods, get / insert / evict), kv/eviction.py (a free queue
that can keep a block for now).
Read with: chapters/04-prefix-caching.md (Real traffic).

The hash chain's index is a flat map: a block can be evicted while blocks
after it stay cached. A lookup stops at the first miss, so those blocks can
never be reached again, yet they hold pool space until they are evicted in
turn (dead weight). A tree of blocks cannot do that:

    root ── [h0] ──┬── [h1] ── [h2]            each node one cached block, under the block before it
                   └── [h3]                    leaves: h2 and h3; h0 is kept while h1 or h3 is cached

- `insert(block, h, parent)` hangs the block under its parent's node, and
  refuses one whose parent is not cached (it could never be reached);
- the pool's eviction policy picks among the leaves only: the index asks the
  free queue to `keep` a block with cached children, and `unpark`s it when
  its last child goes (then it is a leaf, and takes its place in the order);
  a block taken for reuse leaves the tree at once (`on_take`), not after the
  whole allocation, so that the same allocation can take its parent next.

With chained hashes a node's hash names its whole path, so a lookup walks
the tree with one map lookup per block (`get`), as the hash chain does.
SGLang's RadixCache keys its tree on the tokens themselves and compresses a
run of single-child nodes into one node (split when a new branch appears);
here every node is one block, the unit the pool allocates and evicts.
SGLang: python/sglang/srt/mem_cache/radix_cache.py (RadixCache: match_prefix, insert, evict from a heap of
evictable leaves).
"""

from __future__ import annotations

from pagedlab.errors import InvariantError
from pagedlab.kv.block_pool import KVCacheBlock


class RadixIndex:
    """block hash -> the block holding that prefix, each under its parent's. Invariants: the index maps exactly
    the blocks whose block_hash is set; every cached block's parent is cached; `children` lists exactly the
    cached blocks under each hash (None: the root)."""

    def __init__(self):
        self.cached_block_hash_to_block: dict = {}  # block_hash -> its block (the hash chain's name)
        self.parent: dict = {}  # block_hash -> its parent's hash (None under the root)
        self.children: dict = {None: set()}  # block_hash (None: the root) -> the cached hashes under it
        self.queue = None  # the pool's free queue, which keeps the blocks with cached children

    def attach(self, free_queue) -> None:
        """Leaves first: the free queue skips a block whose children are cached (kv/eviction.py's policies)."""
        if not hasattr(free_queue, "keep"):
            raise ValueError(
                f"prefix_index: a radix tree evicts leaves first, and the free queue "
                f"{type(free_queue).__name__} cannot keep a block: use a policy of kv/eviction.py"
            )
        free_queue.keep = self.has_cached_children
        free_queue.on_take = self.evict  # at once: the next pop may take the parent, a leaf now
        self.queue = free_queue

    def has_cached_children(self, block: KVCacheBlock) -> bool:
        return bool(self.children.get(block.block_hash))

    def get(self, block_hash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def insert(self, block: KVCacheBlock, block_hash, parent=None) -> bool:
        """Hang a just-filled block under its parent; False if this prefix is cached already, or if its parent is
        not (the tree only grows from a cached node: a block no lookup could reach is not kept)."""
        if block_hash in self.cached_block_hash_to_block or (
            parent is not None and parent not in self.cached_block_hash_to_block
        ):
            return False
        block.block_hash = block_hash
        self.cached_block_hash_to_block[block_hash] = block
        self.parent[block_hash] = parent
        self.children[parent].add(block_hash)
        self.children[block_hash] = set()
        return True

    def evict(self, block: KVCacheBlock) -> None:
        """The block is reused for other tokens: its node goes. Normally a leaf; should the policy have had
        nothing else to give (only parents were free), its subtree goes first, so that no node loses its parent."""
        block_hash = block.block_hash
        if block_hash is None:
            return
        for child in list(self.children[block_hash]):
            self.evict(self.cached_block_hash_to_block[child])
        del self.cached_block_hash_to_block[block_hash], self.children[block_hash]
        block.block_hash = None
        parent = self.parent.pop(block_hash)
        siblings = self.children[parent]
        siblings.discard(block_hash)
        if parent is not None and not siblings and self.queue is not None:
            parent_block = self.cached_block_hash_to_block[parent]
            if parent_block.ref_cnt == 0:
                self.queue.unpark(parent_block)  # a leaf now: it takes its place in the eviction order

    def reset(self) -> None:
        """Forget every hash (vLLM's reset_prefix_cache)."""
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        self.parent.clear()
        self.children = {None: set()}

    def __len__(self) -> int:
        return len(self.cached_block_hash_to_block)

    def blocks(self):
        return self.cached_block_hash_to_block.values()

    def check_invariants(self, pool_blocks: list[KVCacheBlock]) -> None:
        for block_hash, block in self.cached_block_hash_to_block.items():
            if block.block_hash != block_hash:
                raise InvariantError(f"{block} is mapped under a hash it does not carry")
            parent = self.parent[block_hash]
            if parent is not None and parent not in self.cached_block_hash_to_block:
                raise InvariantError(f"{block} is cached but its parent is not")
            if block_hash not in self.children[parent]:
                raise InvariantError(f"{block} is missing from its parent's children")
        if sum(len(c) for c in self.children.values()) != len(self):
            raise InvariantError("the tree lists a child that is not cached")
        if sum(1 for b in pool_blocks if b.block_hash is not None) != len(self):
            raise InvariantError("a block carries a hash the cache forgot")
