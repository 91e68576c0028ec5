"""Stage 4: the host tier (kv/tier.py): a bounded, exclusive second pool of evicted cached blocks' hashes."""

import pytest

from pagedlab.kv.tier import HostTier

pytestmark = pytest.mark.stage4


def test_demoted_hashes_are_kept_oldest_dropped_first_and_promoted_once():
    tier = HostTier(2)
    for h in ("a", "b", "c"):  # the pool evicted a, then b, then c: a no longer fits
        tier.demote(h)
    assert "a" not in tier and len(tier) == 2 and tier.num_dropped == 1
    assert tier.promote("b") and "b" not in tier, "promoted: back to a GPU block, out of the tier (exclusive)"
    assert not tier.promote("b") and not tier.promote("zzz")
    tier.forget("c")  # computed again in the pool: the tier's copy is not needed
    assert len(tier) == 0


def test_a_tier_of_zero_blocks_keeps_nothing_and_bad_sizes_are_refused():
    tier = HostTier(0)
    tier.demote("a")
    assert len(tier) == 0 and tier.num_dropped == 0
    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="tier_blocks must be an integer >= 0"):
            HostTier(bad)
