"""Stage 5: the differential test: the same random workloads through pagedlab's scheduler and vLLM 0.33.0's own.

Eight families x 20 seeds (lessons/differential.py), each a recording replayed through pagedlab's stage 5
(engine/replay.py) and through vLLM's v1 Scheduler in its own process (lessons/vllm_peer.py: one launch for all
of them; importing vLLM takes most of the time). Every step's decisions are compared (viz/compare.py): the
requests scheduled and their token counts, the preemptions, the finish order and reasons, the cached tokens
per request, then the block tables and the number of free blocks. Each run must be equal, or part from vLLM
only where a ledger row says so; and with that ledger row's difference emulated (vLLM's index, which keeps a
second block cached under a hash it already has), every run must be equal on every field.

Needs `pagedlab fetch vllm` (never downloads): skipped without it, a failure under PAGEDLAB_REQUIRE_VLLM=1 (CI).
"""

from __future__ import annotations

from collections import Counter

import pytest

from pagedlab.engine.replay import ReplayEngine
from pagedlab.kv.hashing import HashChainIndex
from pagedlab.lessons import vllm_peer
from pagedlab.lessons.differential import FAMILIES, suite
from pagedlab.viz.compare import BLOCK_FIELDS, LEDGER, SCHEDULE_FIELDS, as_trace, divergences
from pagedlab.viz.trace import to_trace
from tests.conftest import need_vllm
from tests.sched.test_vllm_repros import window_hits_outnumber_the_cap

SEEDS = 20
REPROS = {"window hits outnumber the cap": window_hits_outnumber_the_cap()}  # found beside vLLM, kept as cases
pytestmark = [pytest.mark.stage5, pytest.mark.slow]


class VllmLikeIndex(HashChainIndex):
    """vLLM's BlockHashToBlockMap: a block computed under a hash already cached is cached too (a lookup finds the
    first); evicting one block of a hash leaves the others. Chapter 4's ledger row says why pagedlab keeps one."""

    def __init__(self):
        super().__init__()
        self.more: dict = {}  # block hash -> the other blocks cached under it, oldest first

    def insert(self, block, block_hash, parent=None) -> bool:
        block.block_hash = block_hash
        if block_hash in self.cached_block_hash_to_block:
            self.more.setdefault(block_hash, []).append(block)
        else:
            self.cached_block_hash_to_block[block_hash] = block
        return True

    def evict(self, block) -> None:
        block_hash, block.block_hash = block.block_hash, None
        if block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block_hash) is not block:
            self.more[block_hash].remove(block)
        elif self.more.get(block_hash):
            self.cached_block_hash_to_block[block_hash] = self.more[block_hash].pop(0)
        else:
            del self.cached_block_hash_to_block[block_hash]

    def check_invariants(self, pool_blocks) -> None:
        pass  # two blocks may carry one hash


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    """Every workload: its family, seed, pagedlab's trace (as is, and with VllmLikeIndex) and vLLM's trace."""
    need_vllm()
    cases = suite(SEEDS) + [("repro", name, recording) for name, recording in REPROS.items()]
    results = vllm_peer.run_vllm([recording for _, _, recording in cases])
    out = []
    for (family, seed, recording), result in zip(cases, results):
        assert result["error"] is None, f"{family} seed {seed}: vLLM failed: {result['error']}"
        ours = to_trace(ReplayEngine(recording).run())
        emulated = to_trace(ReplayEngine(recording, prefix_index=VllmLikeIndex).run())
        out.append({"family": family, "seed": seed, "ours": ours, "emulated": emulated,
                    "vllm": as_trace(result["steps"], ours)})  # fmt: skip
    return out


def counts(runs: list[dict]) -> dict[str, Counter]:
    """Per family: workloads, schedule-equal, block-equal, and divergences by ledger row."""
    table: dict[str, Counter] = {family: Counter() for family in FAMILIES}
    for run in (r for r in runs if r["family"] in table):
        found, row = divergences(run["ours"], run["vllm"]), table[run["family"]]
        row["workloads"] += 1
        row["same_schedule"] += not any(d["field"] in SCHEDULE_FIELDS for d in found)
        row["same_blocks"] += not any(d["field"] in BLOCK_FIELDS for d in found)
        if found:
            row[found[0]["ledger"] or "unexplained"] += 1
    return table


@pytest.mark.parametrize("family", FAMILIES)
def test_every_workload_equals_vllm_or_parts_where_a_ledger_row_says(runs, family):
    for run in (r for r in runs if r["family"] == family):
        found = divergences(run["ours"], run["vllm"])
        unexplained = [d for d in found if d["ledger"] is None]
        assert not unexplained, f"{family} seed {run['seed']}: first unexplained divergence {unexplained[0]}"
        assert all(d["ledger"] in LEDGER for d in found)


@pytest.mark.parametrize("family", FAMILIES)
def test_with_the_ledgers_difference_emulated_every_field_is_equal(runs, family):
    # The duplicate-cached-blocks row explains every divergence left: emulate it, and nothing is left at all.
    for run in (r for r in runs if r["family"] == family):
        found = divergences(run["emulated"], run["vllm"])
        assert not found, f"{family} seed {run['seed']}: {found[0]}"


@pytest.mark.parametrize("name", REPROS)
def test_every_repro_equals_vllm_on_every_field(runs, name):
    run = next(r for r in runs if r["family"] == "repro" and r["seed"] == name)
    assert not divergences(run["ours"], run["vllm"])


def test_the_suite_covers_every_family_and_prints_its_counts(runs, capsys):
    table = counts(runs)
    with capsys.disabled():
        print("\nfamily      workloads  same schedule  same block ids  first divergence explained by")
        for family, row in table.items():
            rows = ", ".join(f"{k}: {v}" for k, v in row.items() if k in LEDGER or k == "unexplained") or "-"
            print(f"{family:<11} {row['workloads']:>9}  {row['same_schedule']:>13}  {row['same_blocks']:>14}  {rows}")
    assert all(row["workloads"] == SEEDS for row in table.values())
    assert all(row["same_schedule"] >= SEEDS - 3 for row in table.values())  # the rest: the ledger's row
