"""Course: stage 2's scenarios: the free queue, the pool, on-demand blocks, the slot mapping, the paged gather.

Builds on: kv/block_pool.py, kv/paged.py, worker/runner.py, attention/paged.py, course/scenarios/common.py.
Read with: chapters/98-assignments.md (Scenarios), chapters/02-paged-blocks.md.
"""

from __future__ import annotations

from pagedlab.course.scenarios import TaskScenarios
from pagedlab.course.scenarios.common import attempt, floats, random_arrivals, story
from pagedlab.kv.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from pagedlab.kv.paged import PagedKVCacheManager
from pagedlab.request import Request
from pagedlab.sampling_params import SamplingParams

NO_FREE = "No free blocks available"

# -- free-queue ---------------------------------------------------------------------------------------------------


def walk(queue, limit: int) -> list[list[int]]:
    """The queue head to tail through the next links, and tail to head through the prev links (reversed): the
    same list when the links agree. At most `limit` + 1 steps each, so a broken (cyclic) queue still ends."""
    ahead, block = [], queue.head.next_free_block
    while block is not None and block is not queue.tail and len(ahead) <= limit:
        ahead.append(block.block_id)
        block = block.next_free_block
    back, block = [], queue.tail.prev_free_block
    while block is not None and block is not queue.head and len(back) <= limit:
        back.append(block.block_id)
        block = block.prev_free_block
    return [ahead, back[::-1]]


def queue_program(num_blocks: int, ops: list) -> list:
    """Run (op, arg) on a fresh queue of blocks 0 .. num_blocks - 1; after each: its result, the queue both ways,
    num_free_blocks, and whether the block it named is unlinked."""
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    queue = FreeKVCacheBlockQueue(blocks)
    calls = {
        "popleft": lambda _: queue.popleft().block_id,
        "popleft_n": lambda n: [b.block_id for b in queue.popleft_n(n)],
        "append": lambda i: queue.append(blocks[i]),
        "remove": lambda i: queue.remove(blocks[i]),
    }
    seen = []
    for op, arg in ops:
        result = attempt(calls[op], arg, messages=(NO_FREE,))
        unlinked = None if op.startswith("popleft") else blocks[arg].prev_free_block is None
        seen.append([op, arg, result, walk(queue, num_blocks), queue.num_free_blocks, unlinked])
    return seen


def pops_from_the_head_and_appends_at_the_tail(rng):
    return queue_program(5, [("popleft", None), ("popleft", None), ("append", 0), ("popleft", None), ("append", 1)])


def removes_from_the_middle_and_both_ends(rng):
    return queue_program(6, [("remove", 3), ("remove", 0), ("remove", 5), ("append", 3), ("popleft_n", 2)])


def an_empty_queue_says_so(rng):
    return queue_program(2, [("popleft", None), ("popleft", None), ("popleft", None), ("append", 1), ("popleft", None)])


def misuse_is_an_invariant_error(rng):
    return queue_program(3, [("remove", 1), ("remove", 1), ("append", 0), ("append", 1), ("append", 1)])


def queue_random_program(rng):
    n = rng.randrange(2, 10)
    queued, ops = list(range(n)), []
    for _ in range(24):
        op = rng.choice(["popleft", "append", "remove", "remove", "popleft_n"])
        if op == "popleft" or (op == "remove" and not queued):
            ops.append(("popleft", None))
            queued = queued[1:]
        elif op == "popleft_n":
            k = rng.randrange(0, len(queued) + 1)
            ops.append(("popleft_n", k))
            queued = queued[k:]
        elif op == "append":  # now and then a block already queued: an InvariantError
            i = rng.randrange(n) if rng.random() < 0.15 else rng.choice([b for b in range(n) if b not in queued] or [0])
            ops.append(("append", i))
            queued += [] if i in queued else [i]
        else:
            i = rng.choice(queued)
            ops.append(("remove", i))
            queued.remove(i)
    return queue_program(n, ops)


# -- pool-allocate-free -------------------------------------------------------------------------------------------


def pool_program(num_blocks: int, ops: list) -> list:
    """(op, arg) on a fresh BlockPool: allocate(n), free(block ids, in order), share(k) (a second holder of the
    k-th block held now, by id, as stage 3's fork makes: never of a free block, which would corrupt the pool and
    leave the rest of the case undefined); after each: its result, the free queue, every ref_cnt, num_free."""
    pool = BlockPool(num_blocks)
    calls = {
        "allocate": lambda n: [b.block_id for b in pool.allocate(n)],
        "free": lambda ids: pool.free([pool.blocks[i] for i in ids]),
    }
    seen = []
    for op, arg in ops:
        if op == "share":
            held = [b for b in pool.blocks if b.ref_cnt > 0]
            if held:
                held[arg % len(held)].ref_cnt += 1
            result = ["ok", None]
        else:
            short = f"Cannot get {arg} free blocks from the pool"
            result = attempt(calls[op], arg, says=("freed twice",), messages=(short,))
        free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
        seen.append([op, arg, result, free, [b.ref_cnt for b in pool.blocks], pool.num_free])
    return seen


def allocates_from_the_head_and_frees_to_the_tail(rng):
    return pool_program(6, [("allocate", 2), ("allocate", 3), ("free", [1, 0]), ("allocate", 3), ("allocate", 0)])


def a_block_returns_only_at_ref_cnt_zero(rng):
    return pool_program(3, [("allocate", 1), ("share", 0), ("free", [0]), ("free", [0]), ("free", [0])])


def asking_for_too_many(rng):
    return pool_program(3, [("allocate", 4), ("allocate", 2), ("allocate", 2), ("free", [1]), ("allocate", 2)])


def pool_random_program(rng):
    n = rng.randrange(1, 12)
    held, ops = [], []
    for _ in range(20):
        roll = rng.random()
        if roll < 0.45:
            k = rng.randrange(0, n + 2)
            ops.append(("allocate", k))
            free = [i for i in range(n) if i not in held]
            held += free[:k] if k <= len(free) else []  # the model's guess of which ids: only their count matters
        elif roll < 0.6 and held:
            ops.append(("share", rng.randrange(len(held))))
        elif held:
            ids = rng.sample(held, rng.randrange(1, len(held) + 1))
            ops.append(("free", ids))
            held = [i for i in held if i not in ids or rng.random() < 0.1]  # sometimes freed again later
    return pool_program(n, ops)


# -- allocate-slots -----------------------------------------------------------------------------------------------


def manager_program(block_size: int, num_blocks: int, ops: list) -> list:
    """(who, n) on a PagedKVCacheManager: n > 0 schedules n tokens for request `who` (allocate_slots; on success
    the tokens count as computed), n == 0 frees it and starts a new request under a new id."""
    kv = PagedKVCacheManager(num_blocks, block_size, max_model_len=512)
    live: dict[int, Request] = {}
    seen = []
    for who, n in ops:
        r = live.setdefault(who, Request(f"r{who}-{len(seen)}", [2] * 3, SamplingParams(max_tokens=4), 4))
        if n == 0:
            result = attempt(kv.free, r)
            del live[who]
        else:
            result = attempt(kv.allocate_slots, r, n)
            if result[0] == "ok" and result[1] is not None:
                r.num_computed_tokens += n
        tables = {q.request_id: kv.get_block_ids(q) for q in live.values()}
        free = [b.block_id for b in kv.pool.free_block_queue.get_all_free_blocks()]
        seen.append([who, n, result, tables, free, kv.num_used_blocks])
    return seen


def blocks_come_one_at_a_time(rng):
    return manager_program(4, 8, [(0, 5), (1, 3), (0, 1), (0, 1), (0, 1), (0, 1), (0, 0), (1, 6)])


def none_when_the_pool_is_short(rng):
    return manager_program(4, 2, [(0, 8), (0, 1), (1, 1), (0, 0), (1, 1), (1, 4), (1, 4)])


def a_static_batch_on_paged_blocks(rng):
    arrivals = random_arrivals(rng, 2, 5, 64)
    return story(2, arrivals, block_size=4, num_kv_blocks=24, max_num_seqs=3)


def allocate_slots_random(rng):
    if rng.random() < 0.5:
        arrivals = random_arrivals(rng, 2, rng.randrange(3, 8), 64)
        blocks = rng.randrange(20, 40)
        seats = rng.randrange(2, 5)
        return story(2, arrivals, block_size=rng.choice((1, 2, 4)), num_kv_blocks=blocks, max_num_seqs=seats)
    ops = [(rng.randrange(4), rng.choice((0, 1, 1, 1, 2, 3, 5, 9))) for _ in range(30)]
    return manager_program(rng.choice((1, 2, 4, 16)), rng.randrange(3, 14), ops)


# -- slot-mapping -------------------------------------------------------------------------------------------------


def slots(block_size: int, table: list, req_idx: list, positions: list) -> list:
    """The runner's slot_mapping for these tokens: the slots, and their dtype."""
    from types import SimpleNamespace

    import numpy as np

    from pagedlab.worker.runner import ModelRunner

    runner = SimpleNamespace(config=SimpleNamespace(block_size=block_size))
    got = ModelRunner.slot_mapping(runner, np.array(table, dtype=np.int32), np.array(req_idx), np.array(positions))
    return [np.asarray(got).tolist(), str(np.asarray(got).dtype)]


def a_mixed_step(rng):
    return slots(4, [[7, 3, 0], [5, 2, 0]], [0, 1, 1, 1, 1], [5, 2, 3, 4, 5])


def block_size_one_is_the_table(rng):
    return slots(1, [[4, 9, 1]], [0, 0, 0], [0, 1, 2])


def slots_random(rng):
    block_size = rng.choice((1, 2, 4, 16))
    rows, width = rng.randrange(1, 5), rng.randrange(1, 5)
    table = [rng.sample(range(64), width) for _ in range(rows)]
    n = rng.randrange(1, 13)
    req_idx = [rng.randrange(rows) for _ in range(n)]
    return slots(block_size, table, req_idx, [rng.randrange(width * block_size) for _ in range(n)])


# -- paged-gather -------------------------------------------------------------------------------------------------


def gather(rng, seq_lens: list[int], q_lens: list[int], block_size: int) -> dict:
    """Every context slot PagedAttention.context_slots names, and the torch paged reference's output."""
    import torch

    from pagedlab.attention.metadata import metadata_for
    from pagedlab.attention.paged import PagedAttention, paged_reference

    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    per = [-(-n // block_size) for n in seq_lens]
    perm = torch.randperm(sum(per) + 2, generator=g).tolist()
    table = torch.zeros(len(seq_lens), max(per), dtype=torch.int32)
    for b, n in enumerate(per):
        table[b, :n] = torch.tensor([perm.pop() for _ in range(n)], dtype=torch.int32)
    qsl = [0]
    for n in q_lens:
        qsl.append(qsl[-1] + n)
    meta = metadata_for(qsl, seq_lens, table, block_size)
    rows = torch.tensor([b for b, n in enumerate(seq_lens) for _ in range(n)])
    positions = torch.tensor([p for n in seq_lens for p in range(n)])
    got = PagedAttention(None, 2, 8).context_slots(meta, rows, positions)
    kv_heads, heads, d = 1, 2, 8
    k = torch.randn(sum(per) + 2, block_size, kv_heads, d, generator=g)
    v = torch.randn(sum(per) + 2, block_size, kv_heads, d, generator=g)
    q = torch.randn(qsl[-1], heads, d, generator=g)
    out = paged_reference(q, k, v, table, seq_lens, qsl)
    return {"slots": got.tolist(), "out": floats(out.flatten().tolist(), 2e-5)}


def a_prefill_and_a_decode(rng):
    return gather(rng, [9, 5], [9, 1], 4)


def blocks_of_one(rng):
    return gather(rng, [3, 6, 2], [1, 2, 2], 1)


def gather_random(rng):
    reqs = rng.randrange(1, 4)
    seq_lens = [rng.randrange(1, 30) for _ in range(reqs)]
    return gather(rng, seq_lens, [rng.randrange(1, n + 1) for n in seq_lens], rng.choice((1, 2, 4, 16)))


SCENARIOS = [
    TaskScenarios(
        "free-queue",
        (),
        (pops_from_the_head_and_appends_at_the_tail, removes_from_the_middle_and_both_ends, an_empty_queue_says_so,
         misuse_is_an_invariant_error),
        queue_random_program,
    ),
    TaskScenarios(
        "pool-allocate-free",
        ("free-queue",),
        (allocates_from_the_head_and_frees_to_the_tail, a_block_returns_only_at_ref_cnt_zero, asking_for_too_many),
        pool_random_program,
    ),
    TaskScenarios(
        "allocate-slots",
        ("free-queue", "pool-allocate-free"),
        (blocks_come_one_at_a_time, none_when_the_pool_is_short, a_static_batch_on_paged_blocks),
        allocate_slots_random,
    ),
    TaskScenarios("slot-mapping", (), (a_mixed_step, block_size_one_is_the_table), slots_random,
                  warm=("pagedlab.worker.runner",)),
    TaskScenarios("paged-gather", (), (a_prefill_and_a_decode, blocks_of_one), gather_random,
                  warm=("pagedlab.attention.paged",)),
]  # fmt: skip
