"""EngineConfig: stage names and numbers, model-dependent defaults, and fields a stage does not use."""

import re

import pytest

from pagedlab.config import STAGE_NAMES, EngineConfig, parse_stage
from pagedlab.stages import describe, get_preset

KV_BYTES = 2048  # the bundled model: 2 x 4 layers x 2 KV heads x 32 x 4 bytes


@pytest.mark.parametrize("stage", [1, "1", "contiguous"])
def test_stage_by_number_string_or_name(stage):
    assert parse_stage(stage) == 1


@pytest.mark.parametrize("stage", [0, 7, "7", "pagd", True, None])
def test_unknown_stage(stage):
    with pytest.raises(ValueError, match="stage: unknown stage"):
        parse_stage(stage)


def test_defaults_for_the_bundled_model():
    cfg = EngineConfig.create(1, 1024, KV_BYTES)
    assert (cfg.block_size, cfg.max_model_len, cfg.max_num_seqs) == (16, 1024, 32)
    assert cfg.max_num_batched_tokens == 2048
    assert cfg.num_kv_blocks == 32 * 64  # max_num_seqs regions of max_model_len
    assert not cfg.enable_prefix_caching


def test_default_pool_is_capped_by_memory():
    cfg = EngineConfig.create(1, 1024, kv_bytes_per_token=2**20)  # 1 MiB per token
    assert cfg.num_kv_blocks == 512 * 2**20 // (2**20 * 16)


@pytest.mark.parametrize(
    "field, value, first",
    [
        ("enable_prefix_caching", True, "stage 4 (prefix)"),
        ("long_prefill_token_threshold", 8, "stage 5 (continuous)"),
        ("preemption_mode", "swap", "stage 5 (continuous)"),
        ("num_swap_blocks", 4, "stage 5 (continuous)"),
        ("scheduling_policy", "priority", "stage 5 (continuous)"),
    ],
)
def test_a_field_the_stage_does_not_use(field, value, first):
    with pytest.raises(ValueError, match=rf"{field}: stage 1 \(contiguous\) does not use it; .*{re.escape(first)}"):
        EngineConfig.create(1, 1024, KV_BYTES, **{field: value})


def test_triton_backend_needs_stage_6():
    with pytest.raises(ValueError, match="attention_backend: 'triton' is introduced by stage 6"):
        EngineConfig.create(1, 1024, KV_BYTES, attention_backend="triton")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block_size": 0}, "block_size: must be a positive integer"),
        ({"max_model_len": 4096}, "max_model_len: 4096 exceeds"),
        ({"dtype": "int8"}, "dtype: 'int8' is not one of"),
        ({"blocksize": 8}, "blocksize: not an engine setting"),
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "max_num_batched_tokens: 32 is below max_num_seqs"),
    ],
)
def test_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.create(1, 1024, KV_BYTES, **kwargs)


def test_every_stage_has_a_preset_named_as_the_table():
    for number, name in STAGE_NAMES.items():
        preset = get_preset(number)
        assert (preset.number, preset.name) == (number, name)


@pytest.mark.parametrize(
    "stage, parts",
    [
        (1, ("ContiguousKVCacheManager", "StaticScheduler", "ContiguousAttention")),
        (2, ("PagedKVCacheManager", "StaticScheduler", "PagedAttention", "vllm/v1/core/block_pool.py")),
    ],
)
def test_describe_names_the_parts(stage, parts):
    text = describe(stage)
    for part in parts:
        assert part in text
