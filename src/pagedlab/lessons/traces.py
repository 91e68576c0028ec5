"""Stage 4: real request traces (Mooncake's, FAST'25): each request's arrival, lengths, and prompt as block hashes.

Builds on: model/files.py (read_bounded: a regular file, read no further than a limit).
Read with: chapters/04-prefix-caching.md (Real traffic); src/pagedlab/data/traces/README.md (format, provenance).

One JSON object per line:

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ..., 13]}

`hash_ids` is the prompt cut into blocks of 512 tokens, the last one partly
filled, each named by an id: equal ids mean the same prefix (the trace's own
hash chain, remapped to small integers). No text and no token ids.

`load_trace` checks every line (a ValueError names the line and the field)
and that the ids form a tree: an id always follows the same id. The bundled
traces are gzipped package data; a path to a trace of the same format, gzipped
or not, is read the same way, through the bounded reader. What a file can make
the reader hold is bounded: the file's bytes (FILE_LIMIT), every gzip member's
text together (TEXT_LIMIT), a line (LINE_LIMIT), and each number (LIMITS), so
that no count in a line (an answer of 10**12 tokens) becomes blocks nobody can
hold. Lines end at "\n" only, as JSON Lines says (U+2028 is text in a string).
A trace is parsed once per content: the cache is keyed by the sha256 of the
bytes read, so a rewritten file is read again, whatever its size and mtime.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pagedlab.kv.block_pool import cdiv
from pagedlab.model.files import read_bounded

TRACE_BLOCK_SIZE = 512  # tokens per hash id (Mooncake's block)
TRACES = {  # the bundled traces, by name
    "conversation": "mooncake_conversation_trace.jsonl.gz",  # 12,031 requests: an hour of real chat traffic
    "synthetic": "mooncake_synthetic_trace.jsonl.gz",  # 3,993 requests from public datasets, Poisson arrivals
}
FILE_LIMIT = 16 << 20  # bytes of a trace file, gzipped or not
# bytes of a trace once unzipped (a zip bomb stops here): 21 x the conversation trace's 3.0 MB; parsed, a trace
# takes about 9 x its text in memory at its peak (the conversation trace: 28 MB), so at most about 600 MB
TEXT_LIMIT = 64 << 20
TOKEN_LIMIT = 1 << 24  # tokens of a prompt, or of an answer: 16.8 M, above any model's context (the traces': 191 K)
ID_LIMIT = 1 << 64  # a hash id is a remapped block hash: 0 <= id < 2**64
# characters of a line: a prompt of TOKEN_LIMIT tokens is 32,768 ids of at most 20 digits (the traces': 2,698)
LINE_LIMIT = 1 << 20
LIMITS = {"timestamp": (0, (1 << 63) - 1), "input_length": (1, TOKEN_LIMIT), "output_length": (0, TOKEN_LIMIT)}
FIELDS = (*LIMITS, "hash_ids")
JSON_SPACE = " \t\r\n"  # JSON's whitespace, and only it: str.strip() would also drop U+2028 or \x1c
CACHE_SIZE = 4  # traces kept parsed, by content (the bench replays two, many times each)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace."""

    timestamp: int  # arrival, milliseconds from the trace's start
    input_length: int  # prompt tokens
    output_length: int  # tokens generated
    hash_ids: tuple[int, ...]  # the prompt's blocks of TRACE_BLOCK_SIZE tokens (the last partly filled), by id

    @property
    def num_blocks(self) -> int:
        """Blocks it holds at its end: its prompt's and its answer's (the last sampled token gets no K/V, as in
        the engine), never fewer than its prompt's."""
        total = cdiv(self.input_length + self.output_length - 1, TRACE_BLOCK_SIZE)
        return max(total, len(self.hash_ids))


def trace_path(name: str) -> Path:
    """A bundled trace's file, by name."""
    if name not in TRACES:
        raise ValueError(f"trace: {name!r} is not a bundled trace; known: {', '.join(TRACES)} (or a file's path)")
    return Path(str(resources.files("pagedlab") / "data" / "traces" / TRACES[name]))


_cache: OrderedDict[bytes, tuple[TraceRequest, ...]] = OrderedDict()  # sha256 of a file's bytes -> its trace


def load_trace(name_or_path: str) -> tuple[TraceRequest, ...]:
    """A bundled trace by name ("conversation", "synthetic"), or a trace file's path; in arrival order. The file is
    read at each call; it is parsed again only if its bytes changed (CACHE_SIZE traces are kept, by content)."""
    if not isinstance(name_or_path, (str, Path)):
        raise ValueError(f"trace: expected a name or a path, got {type(name_or_path).__name__}")
    bundled = str(name_or_path) in TRACES or not str(name_or_path).endswith((".jsonl", ".gz"))
    path = trace_path(str(name_or_path)) if bundled else Path(name_or_path)
    data = read_bounded(path, "trace", FILE_LIMIT)
    key = hashlib.sha256(data).digest()
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    trace = parse_trace(data, path)
    _cache[key] = trace
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return trace


def parse_trace(data: bytes, path) -> tuple[TraceRequest, ...]:
    """A trace file's bytes (gzipped or not), every line checked; in arrival order."""
    requests = [parse_line(line, path, n) for n, line in enumerate(_lines(data, path), 1) if line.strip(JSON_SPACE)]
    if not requests:
        raise ValueError(f"{path}: no requests in the trace")
    check_tree(requests, path)
    return tuple(sorted(requests, key=lambda r: r.timestamp))  # stable: equal arrivals keep their order


def _lines(data: bytes, path) -> list[str]:
    if data[:2] == b"\x1f\x8b":  # gzip's magic
        data = gunzip(data, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: a trace is UTF-8 text ({e.reason} at byte {e.start})") from None
    # "\n" only: str.splitlines() also ends a line at U+2028, U+2029, \x85, \x1c..\x1e, \v and \f, which JSON
    # allows raw inside a string (and "\r\n" leaves a "\r" that JSON reads as whitespace)
    return text.split("\n")


def gunzip(data: bytes, path) -> bytes:
    """Every member of a gzip file, joined, as the gzip command and Python's gzip module read it (`cat a.gz b.gz`
    is one file to both; zero bytes after the last member are padding), unzipped no further than TEXT_LIMIT."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            text = f.read(TEXT_LIMIT + 1)  # each member inflated piece by piece: a bomb stops here
    except EOFError:
        raise ValueError(f"{path}: not a readable gzip file (it ends early)") from None
    except (OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError: trailing bytes that are not a member
        raise ValueError(f"{path}: not a readable gzip file ({e})") from None
    if len(text) > TEXT_LIMIT:
        raise ValueError(f"{path}: over {_size(TEXT_LIMIT)} once unzipped, the limit for a trace")
    return text


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def parse_line(line: str, path, n: int) -> TraceRequest:
    """One request, every field checked: a ValueError names the file, the line and the field."""
    where = f"{path}, line {n}"
    if len(line) > LINE_LIMIT:  # before json.loads: a line of 100 MB would be parsed into gigabytes of ints
        raise ValueError(f"{where}: {len(line):,} characters, over the {LINE_LIMIT:,} a request can take")
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where}: not a JSON object ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for field in FIELDS:
        if field not in obj:
            raise ValueError(f"{where}: {field} is missing")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise ValueError(f"{where}: hash_ids must be a list of integers, got {type(ids).__name__}")
    return check_request(TraceRequest(obj["timestamp"], obj["input_length"], obj["output_length"], tuple(ids)), where)


def check_request(r: TraceRequest, where: str) -> TraceRequest:
    """`r`, once each field is known to be in its range (LIMITS, ID_LIMIT) and its ids to fit its prompt; else a
    ValueError that starts with `where` and names the field. A list of TraceRequest handed to replay is checked
    here too: a request is never larger than a line of a file could make it."""
    for field, (low, high) in LIMITS.items():
        value = getattr(r, field)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{where}: {field} must be an integer in {low}..{high:,}, got {_short(value)}")
    ids = r.hash_ids
    if not isinstance(ids, (tuple, list)) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h < ID_LIMIT for h in ids
    ):
        raise ValueError(f"{where}: hash_ids must be a list of integers in 0..2**64-1")
    if len(ids) != cdiv(r.input_length, TRACE_BLOCK_SIZE):
        raise ValueError(
            f"{where}: hash_ids has {len(ids)} ids for {r.input_length} tokens; blocks of {TRACE_BLOCK_SIZE} make "
            f"{cdiv(r.input_length, TRACE_BLOCK_SIZE)}"
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: hash_ids names one block twice (an id names a whole prefix)")
    return r


def _short(value) -> str:
    """A value for a message, short (repr of an int of 5,000 digits would itself raise)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def check_tree(requests: list[TraceRequest], path) -> None:
    """Equal ids mean equal prefixes, so an id is always at the same place in the tree: after the same id."""
    parent: dict = {}
    for n, r in enumerate(requests, 1):
        before = None
        for h in r.hash_ids:
            if parent.setdefault(h, before) != before:
                raise ValueError(
                    f"{path}, request {n}: hash_ids: id {h} follows {before} here but {parent[h]} earlier "
                    "(equal ids must name equal prefixes)"
                )
            before = h


def infinite_ceiling(trace) -> tuple[int, int]:
    """(hit blocks, prompt blocks) with a cache that never evicts, as the traces' README counts it: a block hits
    when it and every block before it were seen in an earlier request."""
    seen, hits, blocks = set(), 0, 0
    for r in trace:
        for h in r.hash_ids:
            if h not in seen:
                break
            hits += 1
        blocks += len(r.hash_ids)
        seen.update(r.hash_ids)
    return hits, blocks
