"""Five honest, differently written solutions of stage 2, and two copies (for the grade-all and similarity tests).

Each honest solution is correct (it scores 100) and written in its own style; `copied_reference` is the
teacher's bodies with names changed and the code reflowed, `copied_alice` is alice's with the same disguise.
The bodies are the regions' code as a student writes it, indented for their class.
"""

from __future__ import annotations

import textwrap

HONEST = {
    # alice: guards first, one helper per link operation
    "alice": {
        "free-queue": '''
def popleft(self) -> KVCacheBlock:
    """The head block, unlinked; ValueError("No free blocks available") when empty."""
    first = self.head.next_free_block
    if first is self.tail:
        raise ValueError("No free blocks available")
    self.remove(first)
    return first

def remove(self, block: KVCacheBlock) -> None:
    """Unlink block in O(1)."""
    before, after = block.prev_free_block, block.next_free_block
    if before is None or after is None:
        raise InvariantError(f"{block} is not queued")
    before.next_free_block = after
    after.prev_free_block = before
    block.prev_free_block = None
    block.next_free_block = None
    self.num_free_blocks = self.num_free_blocks - 1

def append(self, block: KVCacheBlock) -> None:
    """At the tail."""
    if block.prev_free_block is not None or block.next_free_block is not None:
        raise InvariantError(f"{block} is queued already")
    last = self.tail.prev_free_block
    last.next_free_block = block
    block.prev_free_block = last
    block.next_free_block = self.tail
    self.tail.prev_free_block = block
    self.num_free_blocks = self.num_free_blocks + 1
''',
        "pool-allocate-free": '''
def allocate(self, n: int) -> list[KVCacheBlock]:
    """n blocks from the head, ref_cnt 1."""
    taken = self.free_block_queue.popleft_n(n)
    for block in taken:
        if block.ref_cnt:
            raise InvariantError(f"{block} had holders")
        block.ref_cnt = 1
    return taken

def free(self, blocks: Iterable[KVCacheBlock]) -> None:
    """One reference less each; at zero, uncached ones to the head (in order), cached ones to the tail."""
    head, tail = [], []
    try:
        for block in blocks:
            if block.ref_cnt < 1:
                raise InvariantError(f"{block} freed twice")
            block.ref_cnt -= 1
            if not block.ref_cnt:
                (tail if block.block_hash is not None else head).append(block)
    finally:
        self.free_block_queue.prepend_n(head)
        self.free_block_queue.append_n(tail)
''',
        "allocate-slots": '''
def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
    """New block ids, or None when short."""
    table = self.req_to_blocks.setdefault(request.request_id, [])
    self.window.free_skipped(table, request.num_computed_tokens)
    total = request.num_computed_tokens + num_new_tokens
    missing = cdiv(total, self.block_size) - len(table)
    if missing <= 0:
        return []
    if missing > self.pool.num_free:
        return None
    fresh = self.pool.allocate(missing)
    table += fresh
    return [b.block_id for b in fresh]

def free(self, request: Request) -> None:
    """Tail first."""
    table = self.req_to_blocks.pop(request.request_id, [])
    self.pool.free(self.window.held(table[::-1]))
''',
        "slot-mapping": '''
def slot_mapping(self, block_table: np.ndarray, req_idx: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """One slot per token."""
    size = self.config.block_size
    blocks = block_table[req_idx, positions // size].astype(np.int64)
    return blocks * size + positions % size
''',
        "paged-gather": '''
def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Through the table."""
    size = meta.block_size
    return meta.block_table[rows, positions // size].long() * size + positions % size
''',
    },
    # bob: while loops and explicit counters, the pool's check by hand
    "bob": {
        "free-queue": '''
def popleft(self) -> KVCacheBlock:
    """Head."""
    if self.num_free_blocks == 0:
        raise ValueError("No free blocks available")
    node = self.head.next_free_block
    self.head.next_free_block = node.next_free_block
    node.next_free_block.prev_free_block = self.head
    node.next_free_block = node.prev_free_block = None
    self.num_free_blocks -= 1
    return node

def remove(self, block: KVCacheBlock) -> None:
    """Anywhere."""
    if block.next_free_block is None:
        raise InvariantError("not in the queue")
    if block.prev_free_block is None:
        raise InvariantError("not in the queue")
    nxt = block.next_free_block
    prv = block.prev_free_block
    prv.next_free_block, nxt.prev_free_block = nxt, prv
    block.next_free_block = block.prev_free_block = None
    self.num_free_blocks -= 1

def append(self, block: KVCacheBlock) -> None:
    """Tail."""
    if block.next_free_block is not None or block.prev_free_block is not None:
        raise InvariantError("already queued")
    prv = self.tail.prev_free_block
    block.prev_free_block, block.next_free_block = prv, self.tail
    prv.next_free_block = block
    self.tail.prev_free_block = block
    self.num_free_blocks += 1
''',
        "pool-allocate-free": '''
def allocate(self, n: int) -> list[KVCacheBlock]:
    """From the head."""
    if n > self.free_block_queue.num_free_blocks:
        raise ValueError(f"Cannot get {n} free blocks from the pool")
    out = []
    while len(out) < n:
        block = self.free_block_queue.popleft()
        if block.ref_cnt != 0:
            raise InvariantError("a queued block was held")
        block.ref_cnt += 1
        out.append(block)
    return out

def free(self, blocks: Iterable[KVCacheBlock]) -> None:
    """Decrement."""
    items, zeros = list(blocks), []
    i = 0
    while i < len(items):
        block = items[i]
        if block.ref_cnt == 0:
            self._give_back(zeros)  # the ones freed before it stay freed
            raise InvariantError(f"block {block.block_id} freed twice")
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            zeros.append(block)
        i += 1
    self._give_back(zeros)

def _give_back(self, zeros: list[KVCacheBlock]) -> None:
    """Blocks at ref_cnt 0: those without a hash are reused first, those with one kept longest."""
    self.free_block_queue.prepend_n([b for b in zeros if b.block_hash is None])
    for b in zeros:
        if b.block_hash is not None:
            self.free_block_queue.append(b)
''',
        "allocate-slots": '''
def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
    """On demand."""
    if request.request_id not in self.req_to_blocks:
        self.req_to_blocks[request.request_id] = []
    table = self.req_to_blocks[request.request_id]
    self.window.free_skipped(table, request.num_computed_tokens)
    want = request.num_computed_tokens + num_new_tokens
    count = 0
    while (len(table) + count) * self.block_size < want:
        count += 1
    if count == 0:
        return []
    if self.pool.num_free < count:
        return None
    ids = []
    for block in self.pool.allocate(count):
        table.append(block)
        ids.append(block.block_id)
    return ids

def free(self, request: Request) -> None:
    """Last block first."""
    if request.request_id in self.req_to_blocks:
        table = self.req_to_blocks.pop(request.request_id)
        self.pool.free(self.window.held(list(reversed(table))))
''',
        "slot-mapping": '''
def slot_mapping(self, block_table: np.ndarray, req_idx: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Token by token."""
    bs = self.config.block_size
    out = np.empty(len(positions), dtype=np.int64)
    for t in range(len(positions)):
        row, pos = req_idx[t], positions[t]
        out[t] = int(block_table[row][pos // bs]) * bs + int(pos) % bs
    return out
''',
        "paged-gather": '''
def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Block, then offset."""
    logical = torch.div(positions, meta.block_size, rounding_mode="floor")
    offset = positions - logical * meta.block_size
    physical = meta.block_table[rows, logical].to(torch.int64)
    return physical * meta.block_size + offset
''',
    },
    # carol: functional style, the table grown by a comprehension
    "carol": {
        "free-queue": '''
def popleft(self) -> KVCacheBlock:
    """Head of the list."""
    head = self.head.next_free_block
    if head is self.tail:
        raise ValueError("No free blocks available")
    return self._take(head)

def remove(self, block: KVCacheBlock) -> None:
    """Anywhere in the list."""
    self._take(block)

def append(self, block: KVCacheBlock) -> None:
    """Before the tail sentinel."""
    if (block.prev_free_block, block.next_free_block) != (None, None):
        raise InvariantError("double append")
    self._splice(self.tail.prev_free_block, block, self.tail)
    self.num_free_blocks += 1

def _take(self, block: KVCacheBlock) -> KVCacheBlock:
    """Unlink and count."""
    if None in (block.prev_free_block, block.next_free_block):
        raise InvariantError("not linked")
    block.prev_free_block.next_free_block = block.next_free_block
    block.next_free_block.prev_free_block = block.prev_free_block
    block.prev_free_block = block.next_free_block = None
    self.num_free_blocks -= 1
    return block

def _splice(self, left: KVCacheBlock, middle: KVCacheBlock, right: KVCacheBlock) -> None:
    """left <-> middle <-> right."""
    left.next_free_block, middle.prev_free_block = middle, left
    middle.next_free_block, right.prev_free_block = right, middle
''',
        "pool-allocate-free": '''
def allocate(self, n: int) -> list[KVCacheBlock]:
    """Popped, then held once."""
    blocks = self.free_block_queue.popleft_n(n)
    if any(b.ref_cnt for b in blocks):
        raise InvariantError("queued blocks must be unheld")
    return [self._hold(b) for b in blocks]

def free(self, blocks: Iterable[KVCacheBlock]) -> None:
    """Released one by one, then queued: uncached at the head, cached at the tail."""
    released = []
    try:
        for item in map(self._release, blocks):
            if item is not None:
                released.append(item)
    finally:
        self.free_block_queue.prepend_n([r for r in released if r.block_hash is None])
        self.free_block_queue.append_n([r for r in released if r.block_hash is not None])

def _hold(self, block: KVCacheBlock) -> KVCacheBlock:
    """ref_cnt 1."""
    block.ref_cnt = 1
    return block

def _release(self, block: KVCacheBlock) -> KVCacheBlock | None:
    """The block if nobody holds it any more."""
    if block.ref_cnt <= 0:
        raise InvariantError(f"{block!r} freed twice")
    block.ref_cnt -= 1
    return None if block.ref_cnt else block
''',
        "allocate-slots": '''
def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
    """Just enough blocks."""
    table = self.req_to_blocks.get(request.request_id) or []
    self.req_to_blocks[request.request_id] = table
    self.window.free_skipped(table, request.num_computed_tokens)
    need = max(0, -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - len(table))
    if need > self.pool.num_free:
        return None
    added = self.pool.allocate(need) if need else []
    table.extend(added)
    return list(map(lambda b: b.block_id, added))

def free(self, request: Request) -> None:
    """Reversed."""
    self.pool.free(self.window.held(reversed(self.req_to_blocks.pop(request.request_id, []))))
''',
        "slot-mapping": '''
def slot_mapping(self, block_table: np.ndarray, req_idx: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Vectorized with divmod."""
    quotient, remainder = np.divmod(positions, self.config.block_size)
    return np.asarray(block_table[req_idx, quotient], dtype=np.int64) * self.config.block_size + remainder
''',
        "paged-gather": '''
def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Via flat indexing."""
    width = meta.block_table.shape[1]
    flat = meta.block_table.reshape(-1)[rows * width + positions // meta.block_size]
    return flat.long() * meta.block_size + positions.remainder(meta.block_size)
''',
    },
    # dave: everything through the two sentinels, no early return, the allocation built by index
    "dave": {
        "free-queue": '''
def popleft(self) -> KVCacheBlock:
    """Take the first real node."""
    if self.head.next_free_block is self.tail:
        raise ValueError("No free blocks available")
    chosen = self.head.next_free_block
    self.remove(chosen)
    return chosen

def remove(self, block: KVCacheBlock) -> None:
    """Detach."""
    linked = block.prev_free_block is not None and block.next_free_block is not None
    if not linked:
        raise InvariantError("remove: block not in the free queue")
    p, q = block.prev_free_block, block.next_free_block
    p.next_free_block = q
    q.prev_free_block = p
    block.prev_free_block, block.next_free_block = None, None
    self.num_free_blocks += -1

def append(self, block: KVCacheBlock) -> None:
    """Attach before the tail."""
    linked = block.prev_free_block is not None or block.next_free_block is not None
    if linked:
        raise InvariantError("append: block already in the free queue")
    p, q = self.tail.prev_free_block, self.tail
    p.next_free_block, block.prev_free_block, block.next_free_block, q.prev_free_block = block, p, q, block
    self.num_free_blocks += 1
''',
        "pool-allocate-free": '''
def allocate(self, n: int) -> list[KVCacheBlock]:
    """Index by index."""
    if self.num_free < n:
        raise ValueError(f"Cannot get {n} free blocks from the pool")
    result = [None] * n
    for k in range(n):
        result[k] = self.free_block_queue.popleft()
        if result[k].ref_cnt != 0:
            raise InvariantError("allocated a held block")
        result[k].ref_cnt = 1
    return result

def free(self, blocks: Iterable[KVCacheBlock]) -> None:
    """Each drops a holder."""
    done = []
    try:
        for b in blocks:
            remaining = b.ref_cnt - 1
            if remaining < 0:
                raise InvariantError(f"block {b.block_id} was freed twice")
            b.ref_cnt = remaining
            if remaining == 0:
                done.append(b)
    finally:
        cached = [b for b in done if b.block_hash is not None]
        self.free_block_queue.prepend_n([b for b in done if b.block_hash is None])
        self.free_block_queue.append_n(cached)
''',
        "allocate-slots": '''
def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
    """By index."""
    rid = request.request_id
    self.req_to_blocks[rid] = self.req_to_blocks.get(rid, [])
    self.window.free_skipped(self.req_to_blocks[rid], request.num_computed_tokens)
    have = len(self.req_to_blocks[rid])
    last = (request.num_computed_tokens + num_new_tokens - 1) // self.block_size
    new = [] if last < have else list(range(have, last + 1))
    if len(new) > self.pool.num_free:
        return None
    for block in self.pool.allocate(len(new)):
        self.req_to_blocks[rid].append(block)
    return [b.block_id for b in self.req_to_blocks[rid][have:]]

def free(self, request: Request) -> None:
    """Tail to head."""
    blocks = self.req_to_blocks.pop(request.request_id, [])
    order = [blocks[i] for i in range(len(blocks) - 1, -1, -1)]
    self.pool.free(self.window.held(order))
''',
        "slot-mapping": '''
def slot_mapping(self, block_table: np.ndarray, req_idx: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Gather rows, then columns."""
    rows = block_table.astype(np.int64)[req_idx]
    cols = positions // self.config.block_size
    return rows[np.arange(len(positions)), cols] * self.config.block_size + positions - cols * self.config.block_size
''',
        "paged-gather": '''
def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Gather along the table's columns."""
    cols = (positions // meta.block_size).unsqueeze(1)
    physical = torch.gather(meta.block_table[rows].long(), 1, cols).squeeze(1)
    return physical * meta.block_size + positions % meta.block_size
''',
    },
    # erin: compact, the queue edited through a pair of neighbours, generators
    "erin": {
        "free-queue": '''
def popleft(self) -> KVCacheBlock:
    """First."""
    b = self.head.next_free_block
    if b is self.tail:
        raise ValueError("No free blocks available")
    self.remove(b)
    return b

def remove(self, block: KVCacheBlock) -> None:
    """Middle."""
    a, c = block.prev_free_block, block.next_free_block
    if a is None or c is None:
        raise InvariantError(f"{block}: not free")
    a.next_free_block, c.prev_free_block, block.prev_free_block, block.next_free_block = c, a, None, None
    self.num_free_blocks -= 1

def append(self, block: KVCacheBlock) -> None:
    """Last."""
    if block.prev_free_block or block.next_free_block:
        raise InvariantError(f"{block}: free already")
    a = self.tail.prev_free_block
    a.next_free_block, block.prev_free_block = block, a
    block.next_free_block, self.tail.prev_free_block = self.tail, block
    self.num_free_blocks += 1
''',
        "pool-allocate-free": '''
def allocate(self, n: int) -> list[KVCacheBlock]:
    """Head n."""
    got = self.free_block_queue.popleft_n(n)
    for b in got:
        if b.ref_cnt:
            raise InvariantError("held")
        b.ref_cnt += 1
    return got

def free(self, blocks: Iterable[KVCacheBlock]) -> None:
    """Zero goes back: the head if it holds nothing cached."""
    front, back = [], []
    for b in blocks:
        if not b.ref_cnt > 0:
            self.free_block_queue.prepend_n(front)
            self.free_block_queue.append_n(back)
            raise InvariantError("freed twice")
        b.ref_cnt -= 1
        b.ref_cnt or (back if b.block_hash else front).append(b)
    self.free_block_queue.prepend_n(front)
    self.free_block_queue.append_n(back)
''',
        "allocate-slots": '''
def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
    """Compact."""
    t = self.req_to_blocks.setdefault(request.request_id, [])
    self.window.free_skipped(t, request.num_computed_tokens)
    k = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(t)
    if k > self.pool.num_free:
        return None
    got = self.pool.allocate(max(k, 0))
    t.extend(got)
    return [b.block_id for b in got]

def free(self, request: Request) -> None:
    """Give back."""
    self.pool.free(self.window.held(b for b in reversed(self.req_to_blocks.pop(request.request_id, ()))))
''',
        "slot-mapping": '''
def slot_mapping(self, block_table: np.ndarray, req_idx: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Raveled."""
    bs = self.config.block_size
    index = np.ravel_multi_index((req_idx, positions // bs), block_table.shape)
    return block_table.ravel()[index].astype(np.int64) * bs + positions % bs
''',
        "paged-gather": '''
def context_slots(self, meta: AttentionMetadata, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Slots."""
    q, r = positions // meta.block_size, positions % meta.block_size
    return meta.block_table[rows, q].to(torch.long) * meta.block_size + r
''',
    },
}


def indented(body: str) -> list[str]:
    """The body as region lines: inside the class, four spaces in."""
    return textwrap.indent(textwrap.dedent(body).strip("\n"), "    ").splitlines()


def disguise(lines: list[str], renames: dict[str, str]) -> list[str]:
    """A copier's disguise: names changed, comments added, a blank line dropped here and there."""
    import re

    out = []
    for line in lines:
        for old, new in renames.items():
            line = re.sub(rf"\b{old}\b", new, line)
        out.append(line)
    return [line for i, line in enumerate(out) if line.strip() or i % 3]


RENAMES = {"block": "blk", "b": "item", "table": "tbl", "first": "front", "taken": "got_blocks", "bs": "size",
           "last": "prev_last", "missing": "shortfall", "new_blocks": "fresh_ones", "needed": "need"}  # fmt: skip
