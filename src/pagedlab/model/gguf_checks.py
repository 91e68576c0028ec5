"""Foundation: what a GGUF file must be before the converter (model/gguf.py) believes it.

Builds on: nothing (the `gguf` package's type tables).
Read with: chapters/07-real-model.md.

llama.cpp's `GGUFReader` believes every count it reads: a 60-byte file that declares an array of
2**62 items makes it loop for ever, its memory growing, and a tensor's offset may point past the
end of the file or into another tensor. So `check_layout` walks the file's header first, with each
count and length bounded by the bytes left before it is used:

    "GGUF" version tensor_count kv_count | kv_count x (key, type, value) |
    tensor_count x (name, n_dims, dims, type, offset) | padding to `general.alignment` | data

and each tensor's bytes must lie, aligned, inside the data, overlapping no other. Then the typed
readers (`count`, `number`, `token_id`) and `check_tensors` make the metadata agree with itself:
every layer of `block_count` has its tensors and no more, each of the shape the sizes imply (the
embedding's rows are the vocabulary), and the special tokens' ids are tokens of it. Every refusal is
a ValueError that starts with the key or the tensor at fault.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ARRAY_ITEMS = 1 << 22  # metadata arrays: the largest vocabularies and merge lists have < 10**6 items
MAX_DEPTH = 4  # arrays of arrays
# GGUF value types -> struct format; 8 STRING and 9 ARRAY have a length before them.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MIN_SIZE = {**{t: struct.calcsize(f) for t, f in _SCALARS.items()}, _STRING: 8, _ARRAY: 12}


class _Cursor:
    """Reads the header front to back; nothing is read that the bytes left cannot hold."""

    def __init__(self, buf, order: str):
        self.buf, self.order, self.pos = buf, order, 0

    def take(self, n: int, what: str) -> int:
        """The position of the next `n` bytes, which must be in the file."""
        if n > len(self.buf) - self.pos:
            raise ValueError(f"{what}: needs {n} bytes at offset {self.pos}, the file has {len(self.buf) - self.pos}")
        self.pos += n
        return self.pos - n

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(self.order + fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        start = self.take(n, what)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what}: a string that is not UTF-8, at offset {start}") from None

    def count(self, what: str, item_size: int, limit: int | None = None) -> int:
        """A u64 count of items of at least `item_size` bytes each: bounded by the bytes left (and `limit`)."""
        n = self.scalar("Q", what)
        left = len(self.buf) - self.pos
        if n * item_size > left or (limit is not None and n > limit):
            raise ValueError(f"{what}: {n} items cannot be in the {left} bytes left of the file")
        return n


def check_layout(path: Path) -> None:
    """The header of the GGUF file at `path`, walked with every count bounded; a ValueError names the field."""
    import gguf

    with open(path, "rb") as f:
        if f.seek(0, 2) < 24:
            raise ValueError(f"GGUF.magic: {path.name} is too short to be a GGUF file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF":
                raise ValueError(f"GGUF.magic: {path.name} does not start with 'GGUF'")
            cur = _Cursor(buf, "<")
            cur.take(4, "GGUF.magic")
            version = cur.scalar("I", "GGUF.version")
            if version & 0xFFFF == 0:  # written on a machine of the other byte order (the reader swaps too)
                cur.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
            if version not in (2, 3):
                raise ValueError(f"GGUF.version: {version} is not supported (2 or 3)")
            num_tensors = cur.count("GGUF.tensor_count", 32)  # the smallest tensor info is 32 bytes
            num_kv = cur.count("GGUF.kv_count", 13)  # the smallest pair: a key's length, a type, one byte
            alignment = _walk_metadata(cur, num_kv)
            tensors = [_tensor_info(cur, gguf.GGML_QUANT_SIZES) for _ in range(num_tensors)]
            data_start = -(-cur.pos // alignment) * alignment
            _check_extents(tensors, alignment, len(buf) - data_start)


def _walk_metadata(cur: _Cursor, num_kv: int) -> int:
    """Walk the key/value pairs (each key once); returns general.alignment (32 when absent)."""
    seen, alignment = set(), 32
    for i in range(num_kv):
        key = cur.string(f"GGUF key {i}")
        if key in seen:
            raise ValueError(f"{key}: the key appears twice")
        seen.add(key)
        kind = cur.scalar("I", key)
        if key == "general.alignment":
            alignment = cur.scalar("I", key) if kind == _UINT32 else 0
            if alignment == 0 or alignment & (alignment - 1):
                raise ValueError(f"{key}: must be a UINT32 power of two, got {alignment} (type {kind})")
        else:
            _skip_value(cur, kind, key, 0)
    return alignment


def _skip_value(cur: _Cursor, kind: int, key: str, depth: int) -> None:
    if kind in _SCALARS:
        cur.take(_MIN_SIZE[kind], key)
    elif kind == _STRING:
        cur.string(key)
    elif kind == _ARRAY:
        item = cur.scalar("I", key)
        if item not in _MIN_SIZE or (item == _ARRAY and depth == MAX_DEPTH):
            raise ValueError(f"{key}: array item type {item} is unknown or nested too deeply")
        n = cur.count(key, _MIN_SIZE[item], MAX_ARRAY_ITEMS)
        if item in _SCALARS:
            cur.take(n * _MIN_SIZE[item], key)  # fixed-size items: no need to visit them
        else:
            for _ in range(n):
                _skip_value(cur, item, key, depth + 1)
    else:
        raise ValueError(f"{key}: unknown value type {kind}")


def _tensor_info(cur: _Cursor, quant_sizes: dict) -> tuple[str, int, int]:
    """One tensor's (name, offset, bytes), its dims and type checked."""
    name = cur.string("GGUF tensor name")
    n_dims = cur.scalar("I", name)
    if not 1 <= n_dims <= MAX_DIMS:
        raise ValueError(f"{name}: {n_dims} dimensions (a tensor has 1 to {MAX_DIMS})")
    dims = [cur.scalar("Q", name) for _ in range(n_dims)]
    kind = cur.scalar("I", name)
    sizes = next((v for k, v in quant_sizes.items() if int(k) == kind), None)
    if sizes is None:
        raise ValueError(f"{name}: unknown tensor type {kind}")
    block, type_size = sizes
    if min(dims) < 1 or dims[0] % block:
        raise ValueError(f"{name}: dims {dims} (each >= 1, the first a multiple of the type's {block}-weight block)")
    return name, cur.scalar("Q", name), math.prod(dims) // block * type_size


def _check_extents(tensors: list[tuple[str, int, int]], alignment: int, data_size: int) -> None:
    """Each tensor's bytes: aligned, inside the data, overlapping no other (and each name once)."""
    seen = set()
    for name, _, _ in tensors:
        if name in seen:
            raise ValueError(f"{name}: the tensor appears twice")
        seen.add(name)
    end, previous = 0, None
    for name, offset, size in sorted(tensors, key=lambda t: t[1]):
        if offset % alignment:
            raise ValueError(f"{name}: offset {offset} is not a multiple of general.alignment ({alignment})")
        if offset + size > data_size:
            raise ValueError(f"{name}: bytes {offset}..{offset + size} of the data, which has {max(data_size, 0)}")
        if offset < end:
            raise ValueError(f"{name}: bytes {offset}..{offset + size} overlap tensor {previous}'s")
        end, previous = offset + size, name


# -- the metadata's values -------------------------------------------------------------------------

_MISSING = object()


def count(meta: dict, key: str, default=_MISSING) -> int:
    """A positive integer field (a head count, a size): a float, a list or 0 names the key."""
    value = meta.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{key}: missing from the GGUF metadata")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}: must be a positive integer, got {value!r:.80}")
    return value


def number(meta: dict, key: str, default=_MISSING) -> float:
    """A positive, finite number (an epsilon, a RoPE base)."""
    value = meta.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{key}: missing from the GGUF metadata")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{key}: must be a positive number, got {value!r:.80}")
    return value


def token_id(meta: dict, key: str, num_tokens: int) -> int | None:
    """A special token's id (None when absent): one of the vocabulary's."""
    value = meta.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_tokens):
        raise ValueError(f"{key}: {value!r:.80} is not a token id of the {num_tokens}-token vocabulary")
    return value


def string_list(meta: dict, key: str, default=_MISSING) -> list[str]:
    value = meta.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{key}: missing from the GGUF metadata")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key}: must be an array of strings")
    if not value and default is _MISSING:
        raise ValueError(f"{key}: must not be empty")
    return value


# -- the tensors -----------------------------------------------------------------------------------

_LAYER_SHAPES = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Llama GGUF with this config.json, in GGUF's order of dims (innermost first)."""
    e, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    layer = dict(zip(_LAYER_SHAPES, [(e,), (e,), (e, q), (e, kv), (e, kv), (q, e), (e, i), (e, i), (i, e)]))
    shapes = {"token_embd.weight": (e, v), "output_norm.weight": (e,)}
    if not config["tie_word_embeddings"]:
        shapes["output.weight"] = (e, v)
    for n in range(config["num_hidden_layers"]):
        shapes |= {f"blk.{n}.{kind}.weight": shape for kind, shape in layer.items()}
    return shapes


def check_shapes(tensors, config: dict, block_count_key: str) -> None:
    """The file's tensors are exactly those of `config` (every layer of block_count, no more), each of its shape."""
    per_layer = len(_LAYER_SHAPES)
    if config["num_hidden_layers"] * per_layer > len(tensors):
        raise ValueError(f"{block_count_key}: {config['num_hidden_layers']} layers of {per_layer} tensors, "
                         f"but the file has {len(tensors)} tensors")  # fmt: skip
    expected = expected_shapes(config)
    for tensor in tensors:
        shape = tuple(int(d) for d in tensor.shape)
        if tensor.name in expected and shape != expected[tensor.name]:
            what = "the vocabulary's size" if tensor.name in ("token_embd.weight", "output.weight") else "the sizes"
            raise ValueError(f"{tensor.name}: shape {shape} (GGUF order), but {what} in the metadata imply "
                             f"{expected[tensor.name]}")  # fmt: skip
    missing = sorted(set(expected) - {t.name for t in tensors})
    if missing:
        raise ValueError(f"{missing[0]}: missing from the file, although {block_count_key} is "
                         f"{config['num_hidden_layers']} ({len(missing)} missing)")  # fmt: skip


def head_dim(meta: dict, arch: str, hidden: int, heads: int) -> int:
    """D, as llama.cpp reads it: key_length (else embedding_length / head_count), rotated whole and even."""
    if hidden < heads:
        raise ValueError(f"{arch}.embedding_length: {hidden} is smaller than {arch}.attention.head_count ({heads})")
    dim = count(meta, f"{arch}.attention.key_length", default=hidden // heads)
    if count(meta, f"{arch}.rope.dimension_count", default=dim) != dim:
        raise ValueError(f"{arch}.rope.dimension_count: partial rotary embeddings are not supported")
    if count(meta, f"{arch}.attention.value_length", default=dim) != dim:
        raise ValueError(f"{arch}.attention.value_length: differs from key_length ({dim}); a Llama has one head_dim")
    if dim % 2:
        raise ValueError(f"{arch}.attention.key_length: {dim} is odd; RoPE rotates pairs of a head's dims")
    return dim


def tokenizer_tokens(meta: dict) -> list[str]:
    """The vocabulary, once it has one token type per token and merges of two tokens' text each ("a b")."""
    tokens = string_list(meta, "tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    if not isinstance(types, list) or len(types) != len(tokens) or not all(type(t) is int for t in types):
        raise ValueError(f"tokenizer.ggml.token_type: must be an array of {len(tokens)} integers, one per token")
    merges = string_list(meta, "tokenizer.ggml.merges", default=[])
    bad = next((i for i, m in enumerate(merges) if " " not in m), None)
    if bad is not None:
        raise ValueError(f"tokenizer.ggml.merges: item {bad} ({merges[bad]!r:.40}) is not two tokens with a space")
    return tokens
