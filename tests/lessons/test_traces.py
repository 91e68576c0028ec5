"""Stage 4: the bundled Mooncake traces (lessons/traces.py): what they hold, the README's ceiling, and every way a trace
file can be wrong."""

import gzip
import json
import os

import pytest

from pagedlab.lessons import traces
from pagedlab.lessons.traces import TRACE_BLOCK_SIZE, TRACES, infinite_ceiling, load_trace, trace_path

pytestmark = pytest.mark.stage4
# the traces' README: requests, prompt blocks, distinct blocks, hits with a cache that never evicts
README = {"conversation": (12_031, 288_500, 182_790, 105_710), "synthetic": (3_993, 121_877, 43_924, 77_953)}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_the_bundled_traces_hold_what_their_readme_says(name):
    trace = load_trace(name)
    requests, blocks, distinct, hits = README[name]
    assert len(trace) == requests
    assert sum(len(r.hash_ids) for r in trace) == blocks
    assert len({h for r in trace for h in r.hash_ids}) == distinct
    assert infinite_ceiling(trace) == (hits, blocks)
    assert f"{hits / blocks:.1%}" == {"conversation": "36.6%", "synthetic": "64.0%"}[name]
    assert all(a.timestamp <= b.timestamp for a, b in zip(trace, trace[1:]))
    assert load_trace(name) is trace  # read once per process


def test_the_license_and_notice_ship_beside_them():
    folder = trace_path("conversation").parent
    assert {"LICENSE-APACHE", "NOTICE", "README.md"} <= set(os.listdir(folder))
    assert "Apache License" in (folder / "LICENSE-APACHE").read_text()
    assert "3b5a59413" in (folder / "NOTICE").read_text()


def test_a_request_holds_its_prompt_and_its_answer():
    # 1,000 tokens: 2 blocks (the second partly filled); with 300 more generated, 1,299 tokens get K/V: 3 blocks
    r = traces.TraceRequest(0, 1000, 300, (7, 8))
    assert r.num_blocks == 3
    assert traces.TraceRequest(0, 1024, 1, (7, 8)).num_blocks == 2  # the last sampled token needs no slot


def write(tmp_path, lines, name="t.jsonl", zipped=False):
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    path = tmp_path / (name + (".gz" if zipped else ""))
    path.write_bytes(gzip.compress(text.encode()) if zipped else text.encode())
    return path


def ok(ids=(1, 2), n_in=600, t=0):
    return {"timestamp": t, "input_length": n_in, "output_length": 10, "hash_ids": list(ids)}


def test_a_trace_file_of_the_same_format_reads_the_same_way_gzipped_or_not(tmp_path):
    lines = [ok(t=5), ok((1, 3), t=2), ""]
    for zipped in (False, True):
        trace = load_trace(write(tmp_path, lines, f"z{zipped}.jsonl", zipped))
        assert [r.hash_ids for r in trace] == [(1, 3), (1, 2)], "sorted by arrival"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 1: not a JSON object"),
        ("[1, 2]", "line 1: expected a JSON object, got list"),
        ({"timestamp": 0, "input_length": 5, "output_length": 1}, "line 1: hash_ids is missing"),
        ("null", "line 1: expected a JSON object, got NoneType"),
        ('"a string"', "line 1: expected a JSON object, got str"),
        ("[" * 100_000 + "]" * 100_000, "line 1: not a JSON object"),  # nested too deeply: RecursionError
        ({**ok(), "timestamp": -1}, "line 1: timestamp must be an integer in 0..9,223,372,036,854,775,807, got -1"),
        ({**ok(), "timestamp": 1 << 63}, "line 1: timestamp must be an integer in 0..9,223,372,036,854,775,807"),
        ({**ok(), "input_length": 0}, "line 1: input_length must be an integer in 1..16,777,216"),
        ({**ok(), "input_length": 600.0}, "line 1: input_length must be an integer in 1..16,777,216, got 600.0"),
        ({**ok(), "output_length": True}, "line 1: output_length must be an integer in 0..16,777,216"),
        # an answer of 10**12 tokens would be 2 G blocks of the replay's pool (a MemoryError after 22 s)
        ({**ok(), "output_length": 10**12}, "line 1: output_length must be an integer in 0..16,777,216, got 10{12}"),
        ({**ok(), "output_length": 10**40}, "line 1: output_length .*, got an integer of 133 bits"),
        ({**ok(), "hash_ids": [1, "2"]}, "line 1: hash_ids must be a list of integers"),
        ({**ok(), "hash_ids": "12"}, "line 1: hash_ids must be a list of integers, got str"),
        ({**ok(), "hash_ids": [1, -2]}, r"line 1: hash_ids must be a list of integers in 0..2\*\*64-1"),
        ({**ok(), "hash_ids": [1, 1 << 64]}, r"line 1: hash_ids must be a list of integers in 0..2\*\*64-1"),
        (ok((1, 2, 3)), f"hash_ids has 3 ids for 600 tokens; blocks of {TRACE_BLOCK_SIZE} make 2"),
        (ok((4, 4)), "hash_ids names one block twice"),
    ],
)
def test_a_bad_line_is_named_with_its_field(tmp_path, line, message):
    with pytest.raises(ValueError, match=message):
        load_trace(write(tmp_path, [line]))


def test_ids_must_form_a_tree(tmp_path):
    with pytest.raises(ValueError, match="request 2: hash_ids: id 2 follows 3 here but 1 earlier"):
        load_trace(write(tmp_path, [ok((1, 2)), ok((3, 2))]))


def test_what_is_not_a_trace_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a bundled trace; known: conversation, synthetic"):
        load_trace("chat")
    with pytest.raises(ValueError, match="is missing"):
        load_trace(str(tmp_path / "none.jsonl"))
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        load_trace(str(tmp_path / "dir.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no requests in the trace"):
        load_trace(str(tmp_path / "empty.jsonl"))
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n' * 100)[:30])
    with pytest.raises(ValueError, match="not a readable gzip file"):
        load_trace(str(tmp_path / "cut.jsonl.gz"))


def test_unzipping_stops_at_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "TEXT_LIMIT", 1000)
    path = write(tmp_path, [ok()] * 100, "big.jsonl", zipped=True)  # a few hundred bytes, 7 KB unzipped
    assert path.stat().st_size < 1000
    with pytest.raises(ValueError, match="over 1000 bytes once unzipped"):
        load_trace(str(path))


def test_a_line_longer_than_a_request_can_be_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    # a line of 100 MB of ids would be parsed into gigabytes of ints: its length is checked first
    monkeypatch.setattr(traces, "LINE_LIMIT", 100)
    line = json.dumps(ok())
    assert len(line) < 100
    assert len(load_trace(write(tmp_path, [line]))) == 1
    with pytest.raises(ValueError, match="line 2: 118 characters, over the 100 a request can take"):
        load_trace(write(tmp_path, [line, line + " " * 40], "long.jsonl"))


def test_every_member_of_a_gzip_file_is_read(tmp_path):
    # `cat a.gz b.gz > c.gz` is one file to gzip and to Python's gzip module: both members' requests are read
    first, second = (gzip.compress((json.dumps(ok(ids, t=t)) + "\n").encode()) for ids, t in (((1, 2), 0), ((1, 3), 1)))
    for name, data, requests in (("two", first + second, 2), ("padded", first + second + b"\0" * 512, 2)):
        (tmp_path / f"{name}.jsonl.gz").write_bytes(data)  # zero padding after the last member, as gzip allows
        assert len(gzip.decompress(data).splitlines()) == requests
        assert [r.hash_ids for r in load_trace(tmp_path / f"{name}.jsonl.gz")] == [(1, 2), (1, 3)]
    (tmp_path / "tail.jsonl.gz").write_bytes(first + b"not gzip")
    with pytest.raises(ValueError, match="tail.jsonl.gz: not a readable gzip file"):
        load_trace(tmp_path / "tail.jsonl.gz")


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\x1c", "\x0b", "\x0c"])
def test_a_line_ends_at_a_newline_only(tmp_path, char):
    # JSON allows these raw inside a string; str.splitlines() would end a line at each of them
    noted = json.dumps({**ok(), "note": f"a{char}b"}, ensure_ascii=False)
    path = tmp_path / "t.jsonl"
    path.write_bytes(f"{noted}\r\n{json.dumps(ok(t=1))}\n{char}\n".encode())
    with pytest.raises(ValueError, match="line 3: not a JSON object"):  # the line numbers are the file's
        load_trace(path)
    path.write_bytes(f"{noted}\r\n{json.dumps(ok(t=1))}\n".encode())
    assert len(load_trace(path)) == 2


def test_a_rewritten_file_is_read_again(tmp_path):
    path = write(tmp_path, [ok((1, 2))])
    first = load_trace(path)
    assert first[0].hash_ids == (1, 2) and load_trace(str(path)) is first  # unchanged: parsed once
    stat = path.stat()
    write(tmp_path, [ok((1, 3))])  # the same size, and the same mtime set back: only the bytes tell
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert load_trace(path)[0].hash_ids == (1, 3)
    write(tmp_path, [ok((1, 2))])
    assert load_trace(path) is first  # the first content again: still cached


def test_a_trace_path_must_name_a_regular_file(tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero.jsonl")
    with pytest.raises(ValueError, match="zero.jsonl is a character device, not a regular file"):
        load_trace(tmp_path / "zero.jsonl")
    os.mkfifo(tmp_path / "fifo.jsonl")
    with pytest.raises(ValueError, match="fifo.jsonl is a FIFO, not a regular file"):
        load_trace(tmp_path / "fifo.jsonl")
    os.symlink(write(tmp_path, [ok()]), tmp_path / "link.jsonl")  # a symlink to a trace the user names: read
    assert len(load_trace(tmp_path / "link.jsonl")) == 1
    with pytest.raises(ValueError, match="is not a bundled trace"):  # not a .jsonl or .gz: a name
        load_trace("/dev/zero")
