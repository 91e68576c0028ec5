"""EngineConfig: stage names and numbers, model-dependent defaults, and fields a stage does not use."""

import re

import pytest

from pagedlab.stages import STAGE_NAMES, describe, engine_config, get_preset, parse_stage

KV_BYTES = 2048  # the bundled model: 2 x 4 layers x 2 KV heads x 32 x 4 bytes


@pytest.mark.parametrize("stage", [1, "1", "contiguous"])
def test_stage_by_number_string_or_name(stage):
    assert parse_stage(stage) == 1


@pytest.mark.parametrize("stage", [0, 7, "7", "pagd", True, None])
def test_unknown_stage(stage):
    with pytest.raises(ValueError, match="stage: unknown stage"):
        parse_stage(stage)


def test_defaults_for_the_bundled_model():
    cfg = engine_config(1, 1024, KV_BYTES)
    assert (cfg.block_size, cfg.max_model_len, cfg.max_num_seqs) == (16, 1024, 32)
    assert cfg.max_num_batched_tokens == 2048
    assert cfg.num_kv_blocks == 32 * 64  # max_num_seqs regions of max_model_len
    assert not cfg.enable_prefix_caching


def test_default_pool_is_capped_by_memory():
    cfg = engine_config(1, 1024, kv_bytes_per_token=2**20)  # 1 MiB per token
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
        engine_config(1, 1024, KV_BYTES, **{field: value})


def test_triton_backend_needs_stage_6():
    with pytest.raises(ValueError, match="attention_backend: 'triton' is introduced by stage 6"):
        engine_config(1, 1024, KV_BYTES, attention_backend="triton")


def test_backends_are_chosen_by_name_among_the_stages_own():
    """BACKENDS (attention/backends.py): "torch" is the preset's first torch backend; a stage-4 engine may time
    the tiled decode of stage 5; the names a stage cannot run say which stage introduces them."""
    assert [engine_config(n, 1024, KV_BYTES).attention_backend for n in (1, 2, 3, 4, 5)] == [
        "contiguous", "reference", "reference", "reference", "tiled",
    ]  # fmt: skip
    assert engine_config(4, 1024, KV_BYTES, attention_backend="tiled").attention_backend == "tiled"
    assert engine_config(5, 1024, KV_BYTES, attention_backend="torch").attention_backend == "tiled"
    with pytest.raises(ValueError, match="attention_backend: 'tiled' is introduced by stage 2"):
        engine_config(1, 1024, KV_BYTES, attention_backend="tiled")
    with pytest.raises(ValueError, match="attention_backend: 'cuda' is not one of"):
        engine_config(2, 1024, KV_BYTES, attention_backend="cuda")


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
        engine_config(1, 1024, KV_BYTES, **kwargs)


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


def test_kv_cache_memory_sizes_the_pool_and_caps_max_model_len():
    from pagedlab.config import parse_bytes

    assert parse_bytes("512MiB", "x") == 512 * 2**20 and parse_bytes("2GB", "x") == 2 * 10**9
    assert parse_bytes("4096", "x") == 4096 and parse_bytes(" 1.5 KiB ", "x") == 1536
    per_token = 1000  # bytes of K and V per token
    cfg = engine_config(2, 8192, per_token, kv_cache_memory="1MiB", block_size=16)
    assert cfg.num_kv_blocks == 2**20 // (16 * per_token) == 65
    assert cfg.max_model_len == 65 * 16  # the model allows 8192, but the pool holds 1040 tokens
    assert engine_config(2, 8192, per_token, kv_cache_memory=2**20).num_kv_blocks == 65
    explicit = engine_config(2, 8192, per_token, kv_cache_memory="1MiB", max_model_len=4096)
    assert explicit.max_model_len == 4096  # what the user asks for is kept (a request that long waits forever)
    default = engine_config(2, 8192, per_token)
    assert default.max_model_len == 8192  # the model's own length when the default pool holds it


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(kv_cache_memory="lots"), "kv_cache_memory: 'lots' is not a size"),
        (dict(kv_cache_memory="12 parsecs"), "kv_cache_memory: '12 parsecs' is not a size"),
        (dict(kv_cache_memory=-1), "kv_cache_memory: expected bytes >= 0"),
        (dict(kv_cache_memory=100), "kv_cache_memory: 100 B is less than one block"),
        (dict(kv_cache_memory="1MiB", num_kv_blocks=8), "kv_cache_memory: give it or num_kv_blocks, not both"),
        (dict(kv_cache_memory=1.5), "kv_cache_memory: expected"),
    ],
)
def test_bad_kv_cache_memory_is_a_value_error_naming_it(settings, message):
    with pytest.raises(ValueError, match=message):
        engine_config(2, 8192, 1000, **settings)
