"""kv/cache_groups.py: a hybrid model's layers in KV cache groups, as vLLM v1 forms them (one block table per group)."""

from __future__ import annotations

import json
import subprocess

import pytest

from pagedlab.kv.cache_groups import KVCacheGroup, kv_cache_groups
from tests.conftest import need_vllm

F, S = None, 8  # a full-attention layer, a sliding layer of window 8

PATTERNS = {
    "llama (all full)": [F] * 4,
    "mistral (all sliding)": [S] * 4,
    "gpt-oss (alternating, from a sliding layer)": [S, F] * 12,
    "gemma 3 (5 sliding : 1 full)": ([S] * 5 + [F]) * 4,
    "qwen2 max_window_layers=1": [F] + [S] * 3,
    "12 full + 13 sliding (pad to 13)": [F] * 12 + [S] * 13,
    "20 full + 30 sliding (2 x 10 + padding)": [F] * 20 + [S] * 30,
    "two windows and full": [4, F, 8, 4, F, 8],
}


def test_one_kind_is_one_group_of_every_layer():
    assert kv_cache_groups([F] * 3) == [KVCacheGroup(None, (0, 1, 2), 3)]
    assert kv_cache_groups([S] * 2) == [KVCacheGroup(8, (0, 1), 2)]


def test_gemma_3s_five_to_one_gives_six_groups_each_spanning_the_depth():
    groups = kv_cache_groups(PATTERNS["gemma 3 (5 sliding : 1 full)"])
    assert [g.kind for g in groups] == ["sliding-8"] * 5 + ["full"]  # sliding first: layer 0 is sliding
    assert groups[0].layers == (0, 6, 12, 18) and groups[-1].layers == (5, 11, 17, 23)
    assert {g.size for g in groups} == {4} and not any(g.num_padding for g in groups)


def test_nearly_equal_kinds_are_padded_to_the_larger_not_cut():
    full, sliding = kv_cache_groups(PATTERNS["12 full + 13 sliding (pad to 13)"])
    assert (full.size, full.num_padding, len(sliding.layers)) == (13, 1, 13)


def test_a_kind_that_does_not_divide_gets_a_padded_group():
    groups = kv_cache_groups(PATTERNS["20 full + 30 sliding (2 x 10 + padding)"])
    assert [(g.kind, len(g.layers), g.num_padding) for g in groups] == [
        ("full", 20, 0), ("sliding-8", 15, 5), ("sliding-8", 15, 5)]  # fmt: skip


def test_no_layer_is_lost_or_doubled_and_a_group_has_one_kind():
    for pattern in PATTERNS.values():
        groups = kv_cache_groups(pattern)
        assert sorted(layer for g in groups for layer in g.layers) == list(range(len(pattern)))
        assert all(pattern[layer] == g.window for g in groups for layer in g.layers)
        assert len({g.size for g in groups}) == 1  # one page size: any block can serve any group


def test_a_model_has_layers():
    with pytest.raises(ValueError, match="^layer_windows:"):
        kv_cache_groups([])


# vLLM 0.33.0's own grouping, run in its environment (`pagedlab fetch vllm`): the same layers in the same groups.
VLLM_GROUPS = """
import json, sys, torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size
out = {}
for name, windows in json.load(sys.stdin).items():
    specs = {f"layer.{i}": FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32)
             if w is None else SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float32,
                                                 sliding_window=w)
             for i, w in enumerate(windows)}
    groups = _get_kv_cache_groups_uniform_page_size(specs)
    out[name] = [[getattr(g.kv_cache_spec, "sliding_window", None), [int(n.split(".")[1]) for n in g.layer_names]]
                 for g in groups]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_groups_are_vllms():
    need_vllm()
    from pagedlab.lessons.vllm_peer import peer_environment, venv_python

    hybrid = {name: p for name, p in PATTERNS.items() if len(set(p)) > 1}  # one kind: vLLM takes another path
    done = subprocess.run([str(venv_python()), "-c", VLLM_GROUPS], input=json.dumps(hybrid), capture_output=True,
                          text=True, env=peer_environment(), timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {name: [[g.window, list(g.layers)] for g in kv_cache_groups(p)] for name, p in hybrid.items()}
    assert ours == theirs
