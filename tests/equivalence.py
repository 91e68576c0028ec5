"""The chapters/97-architecture.md, Invariants comparison rule, shared by every equivalence test.

Float32 on CPU is not bit-identical across batch shapes, so a mismatch is
accepted only if, at the first differing position, the oracle's top-2 logit
gap is below 1e-4 (the gap is printed either way).
"""

from __future__ import annotations

from pagedlab.oracle import NEAR_TIE, OracleOutput


def assert_matches_oracle(got: list[int], expected: OracleOutput, label: str = "") -> None:
    ref = expected.token_ids
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            gap = expected.top2_gaps[i]
            print(f"{label}: first mismatch at output {i}: got {a}, oracle {b}, oracle top-2 gap {gap:.2e}")
            assert gap < NEAR_TIE, f"{label}: mismatch at output {i} with top-2 gap {gap:.2e} >= {NEAR_TIE}"
            return
    assert len(got) == len(ref), f"{label}: {len(got)} tokens, oracle {len(ref)} (same prefix)"
