"""Stage 5: the four places the differential test (tests/engine/test_vllm_differential.py) found pagedlab's scheduler
parting from vLLM 0.33.0's, each as the smallest run that shows it. The expected steps are what vLLM's own Scheduler
decided on the same recording (lessons/vllm_driver.py); pagedlab now decides the same, with no vLLM installed.

Each run is a recording (engine/replay.py) replayed through the stage-5 scheduler with the recorded tokens.
"""

import pytest

from pagedlab.engine.replay import ReplayEngine
from pagedlab.kv.block_pool import BlockPool
from pagedlab.viz.trace import to_trace

pytestmark = pytest.mark.stage5


def config(**given) -> dict:
    base = {"block_size": 4, "num_kv_blocks": 4, "max_num_seqs": 8, "max_num_batched_tokens": 64,
            "max_model_len": 128, "long_prefill_token_threshold": 0, "enable_prefix_caching": False,
            "preemption_mode": "recompute", "num_swap_blocks": 0, "scheduling_policy": "fcfs",
            "sliding_window": 0}  # fmt: skip
    return base | given


def request(rid: str, num_prompt: int, max_tokens: int, arrival: int = 1, priority: int = 0, first: int = 10) -> dict:
    return {"id": rid, "prompt_token_ids": list(range(first, first + num_prompt)), "output_token_ids": [5] * max_tokens,
            "max_tokens": max_tokens, "arrival_step": arrival, "priority": priority, "eos_token_ids": [2],
            "ignore_eos": True, "stop_token_ids": []}  # fmt: skip


def replay(cfg: dict, *requests: dict) -> list[dict]:
    return to_trace(ReplayEngine({"config": cfg, "requests": list(requests), "ends": []}).run())["steps"]


def schedule(steps: list[dict]) -> list[dict]:
    return [s["scheduled"] for s in steps]


def test_a_waiting_request_is_admitted_only_if_its_whole_prompt_fits():
    # 3 blocks of 4, a budget of 2 tokens: r00 (5 tokens) takes block 0, then block 1 for its fifth token at step
    # 3. One token of budget is left for r01, and its first chunk (1 token) would fit in the last free block, but
    # its whole prompt (5 tokens: 2 blocks) does not: vLLM's scheduler_reserve_full_isl keeps it waiting.
    steps = replay(config(num_kv_blocks=3, max_num_seqs=2, max_num_batched_tokens=2),
                   request("r00", 5, 1), request("r01", 5, 1, first=30))  # fmt: skip
    assert schedule(steps) == [{"r00": 2}, {"r00": 2}, {"r00": 1}, {"r01": 2}, {"r01": 2}, {"r01": 1}]
    assert steps[2]["waiting"] == ["r01"] and steps[2]["pool"]["free"] == [2]


def test_a_request_alone_is_not_capped_by_the_long_prefill_threshold():
    # The threshold (8) keeps one long prefill from starving the others; alone, r00 starves nobody: all 40 at once.
    steps = replay(config(block_size=8, num_kv_blocks=16, long_prefill_token_threshold=8), request("r00", 40, 2))
    assert schedule(steps) == [{"r00": 40}, {"r00": 1}]


def test_the_threshold_still_caps_a_prefill_with_company():
    # With r01 waiting too, r00's chunk is capped at 8; r01 ends in that step, and r00, alone again, takes the rest.
    steps = replay(config(block_size=8, num_kv_blocks=16, long_prefill_token_threshold=8),
                   request("r00", 40, 2), request("r01", 3, 1, first=60))  # fmt: skip
    assert schedule(steps)[:2] == [{"r00": 8, "r01": 3}, {"r00": 32}]


def test_under_priority_a_request_that_preempts_itself_lets_the_next_one_run():
    # 3 blocks. r00 (priority 2) holds blocks 0-1, r01 (priority 0, more urgent) block 2. At step 6 r00 needs a
    # third block: the victim is r00 itself, the least urgent. Its two blocks are freed, and r01, after it in the
    # running list, still runs this step in one of them (pagedlab used to end the pass there: an empty step).
    steps = replay(config(num_kv_blocks=3, scheduling_policy="priority"),
                   request("r00", 4, 8, priority=2), request("r01", 1, 8, arrival=2, priority=0, first=40))  # fmt: skip
    assert steps[5]["preempted"] == ["r00"] and steps[5]["scheduled"] == {"r01": 1}
    assert steps[5]["tables"] == {"r01": [2, 1]} and steps[5]["pool"]["free"] == [0]
    assert steps[9]["scheduled"] == {"r00": 9}  # r01 done: r00 recomputes its 9 tokens


def test_freed_blocks_without_a_cached_prefix_are_reused_first():
    # r00 (9 tokens) fills blocks 0 and 1 (cached) and starts block 2 (not full: no hash). Freed tail first, block
    # 2 goes to the free queue's head and 1, 0 to its tail, so r01 gets block 2 back at once (vLLM's prepend_n).
    steps = replay(config(num_kv_blocks=8, enable_prefix_caching=True),
                   request("r00", 9, 1), request("r01", 3, 1, arrival=3, first=50))  # fmt: skip
    assert steps[1]["tables"] == {"r01": [2]}
    assert steps[1]["pool"]["free"] == [3, 4, 5, 6, 7, 1, 0]


def test_without_caching_every_freed_block_goes_to_the_head():
    pool = BlockPool(6)
    a = pool.allocate(3)
    pool.free(reversed(a))  # the table's last block first: it is reused first
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [2, 1, 0, 3, 4, 5]


def test_a_windowed_prompt_longer_than_the_pool_is_admitted_for_the_blocks_it_can_hold():
    # Window 8, blocks of 4, a budget of 16: a request never holds more than the window's last 7 tokens plus one
    # step's 16, cdiv(23, 4) + 1 = 7 blocks (vLLM's max_admission_blocks_per_request). Its 40-token prompt would
    # need 10, more than the 9 the pool has besides the null block: admitted for 7, it runs, freeing behind it.
    steps = replay(config(num_kv_blocks=10, max_num_batched_tokens=16, sliding_window=8), request("r00", 40, 2))
    assert schedule(steps) == [{"r00": 16}, {"r00": 16}, {"r00": 8}, {"r00": 1}]
    assert steps[1]["tables"] == {"r00": [0, 0, 3, 4, 2, 1, 5, 6]}  # blocks 1, 2 freed behind the window, reused
    assert max(sum(b != 0 for b in s["tables"]["r00"]) for s in steps) <= 7


def window_hits_outnumber_the_cap() -> dict:
    """Window 32, blocks of 8, 8 blocks (the null block and 7), two seats, a budget of 4, caching on. r00 (48
    tokens) computes the prompt that r01 (its first 32 and one more) and r02 (all 48 and one more) share."""
    r00 = request("r00", 48, 1)
    r01 = request("r01", 33, 1, arrival=2) | {"prompt_token_ids": r00["prompt_token_ids"][:32] + [3]}
    r02 = request("r02", 49, 1, arrival=5) | {"prompt_token_ids": r00["prompt_token_ids"] + [4]}
    cfg = config(block_size=8, num_kv_blocks=8, max_num_seqs=2, max_num_batched_tokens=4,
                 enable_prefix_caching=True, sliding_window=32)  # fmt: skip
    return {"config": cfg, "requests": [r00, r01, r02], "ends": []}


def test_a_windowed_request_is_admitted_only_if_its_chunk_fits_too():
    # At step 13 r00 is done and r01 is admitted on a 32-token hit (blocks 0-3) plus a new block. r02 hits 6
    # blocks: 2 behind its window (null), 2 that r01 holds, 2 free cached ones it would revive, and its chunk
    # needs a seventh. Capped by the window (at most 6 blocks held at once), its whole length needs no new block,
    # so the capped count said 2 = the 2 free blocks, and admitting it crashed ("no room although ..."). vLLM
    # also checks the chunk, uncapped: 3 > 2, so r02 waits one step, until r01 ends.
    steps = to_trace(ReplayEngine(window_hits_outnumber_the_cap()).run())["steps"]
    assert schedule(steps) == [{"r00": 4}] * 12 + [{"r01": 1}, {"r02": 1}]
    assert steps[12]["waiting"] == ["r02"] and len(steps[12]["pool"]["free"]) == 2
