"""model/gguf_checks.py: a GGUF file is believed only as far as its own size and its own metadata allow.

Two kinds of file: raw headers written byte by byte (a count that cannot fit, a tensor past the end),
and a tiny float32 Llama written with llama.cpp's GGUFWriter whose metadata one test at a time
makes disagree with itself (block_count, the vocabulary, a token id, a head count).
"""

import signal
import struct

import numpy as np
import pytest

from pagedlab import load_model
from pagedlab.model.gguf import convert_gguf

gguf = pytest.importorskip("gguf")
T = gguf.GGUFValueType
TOKENS = ["<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("a") + 38)]  # 40 tokens
E, FF, H, KVH, D, V = 32, 64, 4, 2, 8, 40  # hidden, MLP width, heads, KV heads, head dim, vocab


@pytest.fixture(autouse=True)
def deadline():
    """llama.cpp's reader looped for ever on some of these files: fail instead of hanging."""

    def expired(*_):
        raise TimeoutError("the GGUF file was read for too long")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# -- raw headers -----------------------------------------------------------------------------------


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _header(num_tensors: int, num_kv: int, body: bytes = b"", version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, num_tensors, num_kv) + body


def _tensor(name: str, dims: list[int], kind: int = 0, offset: int = 0) -> bytes:
    return _str(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)


U8_ARRAY = _str("x") + struct.pack("<IIQ", T.ARRAY, T.UINT8, 2**62)
HEADERS = {
    # the 60-byte file of the report: an array of 2**62 bytes (the reader looped, growing ~70 MiB/s)
    "huge-u8-array": (
        _header(0, 1, U8_ARRAY).ljust(60, b"\0"),
        r"x: 4611686018427387904 items cannot be in the 11 bytes",
    ),
    "huge-string-array": (_header(0, 1, _str("x") + struct.pack("<IIQ", T.ARRAY, T.STRING, 2**62)), "x: 4611"),
    "huge-string": (_header(0, 1, _str("x") + struct.pack("<IQ", T.STRING, 2**62)), r"x: needs 4611\d+ bytes"),
    "huge-key": (_header(0, 1, struct.pack("<Q", 2**40)).ljust(64, b"\0"), r"GGUF key 0: needs 1099511627776 bytes"),
    "huge-kv-count": (_header(0, 2**40), r"GGUF.kv_count: 1099511627776 items cannot be"),
    "huge-tensor-count": (_header(2**40, 0), r"GGUF.tensor_count: 1099511627776 items cannot be"),
    "duplicate-key": (_header(0, 2, (_str("k") + struct.pack("<IB", T.UINT8, 1)) * 2), "k: the key appears twice"),
    "not-utf8-key": (_header(0, 1, _str(b"\xff\xfe") + struct.pack("<IB", T.UINT8, 1)), "GGUF key 0: a string that"),
    "unknown-type": (_header(0, 1, _str("k") + struct.pack("<IB", 77, 1)), "k: unknown value type 77"),
    "nested-too-deep": (
        _header(0, 1, _str("k") + struct.pack("<I", T.ARRAY) + struct.pack("<IQ", T.ARRAY, 1) * 6 + bytes(64)),
        "k: array item type 9 is unknown or nested too deeply",
    ),
    "bad-alignment": (
        _header(0, 1, _str("general.alignment") + struct.pack("<II", T.UINT32, 3)),
        "general.alignment: must be a UINT32 power of two, got 3",
    ),
    "five-dims": (_header(1, 0, _tensor("t", [1, 1, 1, 1, 1])), r"t: 5 dimensions \(a tensor has 1 to 4\)"),
    "zero-dim": (_header(1, 0, _tensor("t", [0])), r"t: dims \[0\]"),
    "unknown-tensor-type": (_header(1, 0, _tensor("t", [4], kind=99)), "t: unknown tensor type 99"),
    # 2**32 x 2**32 float32s: numpy's uint64 product wraps to 0, so the reader saw an empty tensor
    "wrapping-dims": (_header(1, 0, _tensor("t", [2**32, 2**32])).ljust(96, b"\0"), r"t: bytes 0\.\.\d+ of the data"),
    "past-the-end": (
        _header(1, 0, _tensor("t", [8])).ljust(64 + 16, b"\0"),
        r"t: bytes 0\.\.32 of the data, which has",
    ),
    "unaligned": (_header(1, 0, _tensor("t", [1], offset=4)).ljust(128, b"\0"), "t: offset 4 is not a multiple of"),
    "overlapping": (
        _header(2, 0, _tensor("a", [8]) + _tensor("b", [8], offset=0)).ljust(192, b"\0"),
        r"b: bytes 0\.\.32 overlap tensor a's",
    ),
    "duplicate-tensor": (
        _header(2, 0, _tensor("a", [8]) + _tensor("a", [8], offset=32)).ljust(256, b"\0"),
        "a: the tensor appears twice",
    ),
    "short": (b"GGUF\3\0\0\0", "GGUF.magic: .* is too short"),
}


@pytest.mark.parametrize("name", list(HEADERS))
def test_a_count_or_extent_the_file_cannot_hold_is_refused_before_reading(tmp_path, name):
    data, message = HEADERS[name]
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=rf"{name}.gguf: not a readable GGUF file \({message}"):
        convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- a tiny float32 Llama whose metadata disagrees with itself ---------------------------------------

BASE = {
    "llama.block_count": (1, T.UINT32),
    "llama.context_length": (64, T.UINT32),
    "llama.embedding_length": (E, T.UINT32),
    "llama.feed_forward_length": (FF, T.UINT32),
    "llama.attention.head_count": (H, T.UINT32),
    "llama.attention.head_count_kv": (KVH, T.UINT32),
    "llama.rope.freq_base": (10000.0, T.FLOAT32),
    "llama.attention.layer_norm_rms_epsilon": (1e-5, T.FLOAT32),
    "tokenizer.ggml.model": ("gpt2", T.STRING),
    "tokenizer.ggml.pre": ("default", T.STRING),
    "tokenizer.ggml.bos_token_id": (0, T.UINT32),
    "tokenizer.ggml.eos_token_id": (1, T.UINT32),
}
LAYER = {
    "attn_norm": (E,),
    "ffn_norm": (E,),
    "attn_q": (H * D, E),
    "attn_k": (KVH * D, E),
    "attn_v": (KVH * D, E),
    "attn_output": (E, H * D),
    "ffn_gate": (FF, E),
    "ffn_up": (FF, E),
    "ffn_down": (E, FF),
}


def write_llama(path, meta=None, drop=(), shapes=None, tokens=TOKENS):
    """A 1-layer tied Llama; `meta` overrides (None deletes) keys, `drop` leaves tensors out, `shapes` resizes."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (BASE | (meta or {})).items():
        if value is not None:
            writer.add_key_value(key, *value)
    if tokens is not None:
        writer.add_key_value("tokenizer.ggml.tokens", tokens, T.ARRAY, sub_type=T.STRING)
    tensors = {"token_embd.weight": (V, E), "output_norm.weight": (E,)}
    tensors |= {f"blk.0.{k}.weight": s for k, s in LAYER.items()}
    rng = np.random.default_rng(0)
    for name, shape in (tensors | (shapes or {})).items():  # numpy's (HF's) order: outermost first
        if name not in drop:
            writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_tiny_llama_converts_and_loads(tmp_path):
    folder = convert_gguf(write_llama(tmp_path / "ok.gguf"), tmp_path / "hf")
    assert load_model(folder).config.vocab_size == V
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left


DISAGREEING = {
    "head-count-0": (
        dict(meta={"llama.attention.head_count": (0, T.UINT32)}),
        "llama.attention.head_count: must be a positive integer, got 0",
    ),
    "head-count-a-float": (
        dict(meta={"llama.attention.head_count": (4.0, T.FLOAT32)}),
        "llama.attention.head_count: must be a positive integer, got 4.0",
    ),
    "kv-heads-do-not-divide": (
        dict(meta={"llama.attention.head_count_kv": (3, T.UINT32)}),
        r"llama.attention.head_count_kv: 3 does not divide head_count \(4\)",
    ),
    "no-epsilon": (
        dict(meta={"llama.attention.layer_norm_rms_epsilon": None}),
        "llama.attention.layer_norm_rms_epsilon: missing",
    ),
    "epsilon-0": (
        dict(meta={"llama.attention.layer_norm_rms_epsilon": (0.0, T.FLOAT32)}),
        "llama.attention.layer_norm_rms_epsilon: must be a positive number",
    ),
    "more-blocks-than-tensors": (
        dict(meta={"llama.block_count": (2**40, T.UINT64)}),
        "llama.block_count: 1099511627776 layers of 9 tensors, but the file has 11",
    ),
    "a-layer-tensor-missing": (
        dict(drop=("blk.0.ffn_down.weight",)),
        r"blk.0.ffn_down.weight: missing from the file, although llama.block_count is 1",
    ),
    "a-layer-beyond-block-count": (dict(shapes={"blk.1.attn_norm.weight": (E,)}), "blk.1.attn_norm.weight: not a"),
    "vocab-size-disagrees": (
        dict(meta={"llama.vocab_size": (50, T.UINT32)}),
        "llama.vocab_size: 50, but tokenizer.ggml.tokens lists 40 tokens",
    ),
    "embedding-rows-disagree": (
        dict(shapes={"token_embd.weight": (V - 1, E)}),
        r"token_embd.weight: shape \(32, 39\) \(GGUF order\), but the vocabulary's size",
    ),
    "a-misshapen-layer": (dict(shapes={"blk.0.ffn_up.weight": (FF, E + 32)}), r"blk.0.ffn_up.weight: shape \(64, 64\)"),
    "eos-outside-the-vocabulary": (
        dict(meta={"tokenizer.ggml.eos_token_id": (40, T.UINT32)}),
        "tokenizer.ggml.eos_token_id: 40 is not a token id of the 40-token vocabulary",
    ),
    "bos-negative": (dict(meta={"tokenizer.ggml.bos_token_id": (-1, T.INT32)}), "tokenizer.ggml.bos_token_id: -1"),
    "pad-outside": (dict(meta={"tokenizer.ggml.padding_token_id": (99, T.UINT32)}), "tokenizer.ggml.padding_token_id"),
    "no-tokens": (dict(tokens=None), "tokenizer.ggml.tokens: missing from the GGUF metadata"),
    "types-disagree": (
        dict(meta={"tokenizer.ggml.token_type": ([1] * 3, T.ARRAY, T.INT32)}),
        "tokenizer.ggml.token_type: must be an array of 40 integers",
    ),
    "a-merge-without-a-space": (
        dict(meta={"tokenizer.ggml.merges": (["ab"], T.ARRAY, T.STRING)}),
        r"tokenizer.ggml.merges: item 0 \('ab'\) is not two tokens",
    ),
    "odd-head-dim": (dict(meta={"llama.attention.key_length": (7, T.UINT32)}), "llama.rope.dimension_count|odd"),
}


@pytest.mark.parametrize("name", list(DISAGREEING))
def test_metadata_that_disagrees_with_itself_names_the_key_or_tensor(tmp_path, name):
    kwargs, message = DISAGREEING[name]
    path = write_llama(tmp_path / f"{name}.gguf", **kwargs)
    with pytest.raises(ValueError, match=message):
        convert_gguf(path, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{name}.gguf"]  # nothing written, not even a staging


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_conversion_that_fails_while_writing_leaves_no_folder(tmp_path, monkeypatch, error):
    path = write_llama(tmp_path / "ok.gguf")
    written = []

    def write_json(file, obj):  # the weights are written by now; the second JSON file fails
        written.append(file.name)
        if len(written) == 2:
            raise error
        file.write_text("{}")

    monkeypatch.setattr("pagedlab.model.gguf._write_json", write_json)
    with pytest.raises(type(error)):
        convert_gguf(path, tmp_path / "hf")
    assert written == ["config.json", "generation_config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.gguf"]  # neither hf nor .hf.partial-*


def test_an_existing_folder_is_never_overwritten(tmp_path):
    path = write_llama(tmp_path / "ok.gguf")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("keep")
    with pytest.raises(ValueError, match="out_dir: .* already exists and is not an empty folder"):
        convert_gguf(path, tmp_path / "hf")
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["mine.txt"]
    (tmp_path / "empty").mkdir()
    assert (convert_gguf(path, tmp_path / "empty") / "config.json").is_file()  # an empty one is filled
