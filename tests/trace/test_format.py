"""anchorage-trace/v1 reader and writer: round trips, headers, Mooncake files, bad input."""

from __future__ import annotations

import gzip
import json
import lzma

import pytest

from anchorage.trace.format import (DEFAULT_BLOCK_SIZE, FORMAT, TraceError, TraceHeader,
                                    TraceReader, TraceRecord, dumps_trace, read_trace,
                                    write_trace)


def _records() -> list[TraceRecord]:
    return [
        TraceRecord(timestamp=0, hash_ids=[1, 2, 3], output_length=10, input_length=40,
                    session_id="s1", agent="planner", tool_name="read_file",
                    tool_args={"path": "a.py"}, tool_duration_ms=120.5, tenant="t1"),
        TraceRecord(timestamp=12.25, hash_ids=[1, 2, 4, 5], output_length=0, input_length=64),
        TraceRecord(timestamp=30, hash_ids=[], output_length=3, input_length=0,
                    extra={"note": "kept"}),
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.xz"])
def test_round_trip(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    header = TraceHeader(block_size=16, source="unit", extra={"generator": "x"})
    assert write_trace(path, _records(), header) == 3
    got_header, got = read_trace(path)
    assert got_header.has_header and got_header.block_size == 16
    assert got_header.source == "unit" and got_header.extra == {"generator": "x"}
    assert [r.to_json() for r in got] == [r.to_json() for r in _records()]
    assert got[0].tool_args == {"path": "a.py"} and got[2].extra == {"note": "kept"}


def test_compression_is_sniffed_not_taken_from_suffix(tmp_path):
    path = tmp_path / "t.xz"
    write_trace(path, _records(), TraceHeader(block_size=16))
    renamed = tmp_path / "plain-name.jsonl"
    renamed.write_bytes(path.read_bytes())
    assert len(read_trace(renamed)[1]) == 3
    assert lzma.decompress(path.read_bytes()).startswith(b'{"format"')


def test_input_length_defaults_from_block_size(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"format": FORMAT, "block_size": 16}) + "\n"
                    + json.dumps({"timestamp": 0, "hash_ids": [1, 2], "output_length": 1}) + "\n")
    _, recs = read_trace(path)
    assert recs[0].input_length == 32
    # the block size given by the caller overrides the header's
    h, recs = read_trace(path, block_size=64)
    assert h.block_size == 64 and recs[0].input_length == 128


def test_mooncake_headerless_file(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": list(range(14))},
        {"timestamp": 0, "input_length": 7322, "output_length": 490,
         "hash_ids": [0] + list(range(14, 28))},
        {"timestamp": 3, "output_length": 5, "hash_ids": [0, 1]},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    header, recs = read_trace(path)
    assert not header.has_header
    assert header.block_size == DEFAULT_BLOCK_SIZE == 512
    assert [r.input_length for r in recs] == [6758, 7322, 1024]
    assert recs[1].hash_ids[0] == recs[0].hash_ids[0]
    assert recs[0].session_id is None and recs[0].agent is None


def test_writer_without_header_is_mooncake_style(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, _records()[:2], header=None)
    first = json.loads(path.read_text().splitlines()[0])
    assert "format" not in first and first["timestamp"] == 0
    assert "session_id" in first and "session_id" not in json.loads(
        path.read_text().splitlines()[1])  # optional fields only when set


def test_dumps_trace_and_blank_lines(tmp_path):
    text = dumps_trace(_records(), TraceHeader(block_size=16))
    path = tmp_path / "t.jsonl"
    path.write_text(text.replace("\n", "\n\n"))  # blank lines are ignored
    assert len(read_trace(path)[1]) == 3


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + dumps_trace(_records(), TraceHeader(block_size=16)).encode())
    header, recs = read_trace(path)
    assert header.has_header and header.block_size == 16 and len(recs) == 3


def test_empty_file_has_no_records(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    header, recs = read_trace(path)
    assert recs == [] and not header.has_header


# ---------------------------------------------------------------------------------------
# Malformed input: every kind of bad line names file, line and problem

HEADER = json.dumps({"format": FORMAT, "block_size": 16})
GOOD = json.dumps({"timestamp": 0, "hash_ids": [1], "output_length": 1})

BAD_LINES = [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"hash_ids": [1], "output_length": 1}', "missing required field 'timestamp'"),
    ('{"timestamp": 1, "output_length": 1}', "missing required field 'hash_ids'"),
    ('{"timestamp": 1, "hash_ids": [1]}', "missing required field 'output_length'"),
    ('{"timestamp": -1, "hash_ids": [1], "output_length": 1}', "timestamp must be a number"),
    ('{"timestamp": "0", "hash_ids": [1], "output_length": 1}', "timestamp must be a number"),
    ('{"timestamp": true, "hash_ids": [1], "output_length": 1}', "timestamp must be a number"),
    ('{"timestamp": NaN, "hash_ids": [1], "output_length": 1}', "timestamp must be a number"),
    ('{"timestamp": 0, "hash_ids": [1, "x"], "output_length": 1}', "hash_ids must be a list"),
    ('{"timestamp": 0, "hash_ids": 5, "output_length": 1}', "hash_ids must be a list"),
    ('{"timestamp": 0, "hash_ids": [1.5], "output_length": 1}', "hash_ids must be a list"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": -2}', "output_length must be"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1.5}', "output_length must be"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1, "input_length": -1}',
     "input_length must be"),
    ('{"timestamp": 0, "hash_ids": [1, 2, 3], "output_length": 1, "input_length": 10}',
     "input_length 10 is too short for 3 blocks"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1, "session_id": [1]}',
     "session_id must be a string"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1, "agent": {}}',
     "agent must be a string"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1, "tenant": 1.5}',
     "tenant must be a string"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1, "tool_name": ["x"]}',
     "tool_name must be a string"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1, "tool_duration_ms": -5}',
     "tool_duration_ms must be"),
    ('{"timestamp": 0, "hash_ids": [1], "output_length": 1, "tool_duration_ms": "5"}',
     "tool_duration_ms must be"),
]


@pytest.mark.parametrize("line,problem", BAD_LINES)
def test_bad_line_names_file_line_and_problem(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([HEADER, GOOD, line, GOOD]) + "\n")
    with pytest.raises(TraceError) as exc:
        read_trace(path)
    err = exc.value
    assert err.path == str(path) and err.line == 3
    assert problem in err.problem
    assert str(err).startswith(f"{path}:3: ")


@pytest.mark.parametrize("line,problem", BAD_LINES)
def test_lenient_skips_and_counts(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([HEADER, GOOD, line, GOOD, line]) + "\n")
    reader = TraceReader(path, lenient=True)
    recs = list(reader)
    assert len(recs) == 2
    assert reader.skipped == 2
    assert len(reader.problems) == 2 and all(problem in p for p in reader.problems)
    assert reader.problems[0].startswith(f"{path}:3: ")
    assert reader.problems[1].startswith(f"{path}:5: ")


def test_lenient_keeps_only_the_first_problems(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(["{bad"] * 50) + "\n")
    reader = TraceReader(path, lenient=True)
    assert list(reader) == [] and reader.skipped == 50 and len(reader.problems) == 20


def test_line_numbers_count_blank_lines_and_headerless_first_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("{bad\n")
    with pytest.raises(TraceError, match=r":1: invalid JSON"):
        read_trace(path)
    path.write_text(GOOD + "\n\n\n{bad\n")
    with pytest.raises(TraceError, match=r":4: invalid JSON"):
        read_trace(path)


@pytest.mark.parametrize("header,problem", [
    ({"format": "anchorage-trace/v9", "block_size": 16}, "unknown trace format"),
    ({"format": FORMAT, "block_size": 0}, "block_size must be a positive int"),
    ({"format": FORMAT, "block_size": "16"}, "block_size must be a positive int"),
    ({"format": FORMAT, "block_size": 16, "source": 3}, "source must be a string"),
])
def test_bad_header(tmp_path, header, problem):
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(header) + "\n" + GOOD + "\n")
    with pytest.raises(TraceError, match=problem) as exc:
        TraceReader(path)
    assert exc.value.line == 1
    with pytest.raises(TraceError, match=problem):  # a bad header is fatal even when lenient
        TraceReader(path, lenient=True)


def test_header_after_first_line_is_a_bad_record(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text(GOOD + "\n" + HEADER + "\n")
    with pytest.raises(TraceError, match=r":2: missing required field 'timestamp'"):
        read_trace(path)


def test_check_order(tmp_path):
    path = tmp_path / "o.jsonl"
    recs = [{"timestamp": t, "hash_ids": [1], "output_length": 1} for t in (0, 5, 3, 6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert len(list(TraceReader(path))) == 4
    with pytest.raises(TraceError, match=r":3: timestamp 3 goes back"):
        list(TraceReader(path, check_order=True))
    reader = TraceReader(path, check_order=True, lenient=True)
    assert [r.timestamp for r in reader] == [0, 5, 6] and reader.skipped == 1


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        TraceReader(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match="cannot read"):
        TraceReader(tmp_path)


def test_reader_is_single_use(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, _records(), TraceHeader(block_size=16))
    reader = TraceReader(path)
    assert len(list(reader)) == 3
    with pytest.raises(TraceError, match="already read"):
        list(reader)


# ---------------------------------------------------------------------------------------
# Corrupt and truncated compressed files

def _big_text() -> bytes:
    recs = [TraceRecord(timestamp=i, hash_ids=list(range(i % 50)), output_length=1,
                        input_length=(i % 50) * 16) for i in range(3000)]
    return dumps_trace(recs, TraceHeader(block_size=16)).encode()


@pytest.mark.parametrize("kind", ["xz", "gz"])
def test_truncated_compressed_file(tmp_path, kind):
    data = lzma.compress(_big_text()) if kind == "xz" else gzip.compress(_big_text())
    path = tmp_path / f"t.jsonl.{kind}"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="cannot read") as exc:
        list(TraceReader(path))
    assert exc.value.path == str(path)
    with pytest.raises(TraceError, match="cannot read"):  # lenient does not hide it
        list(TraceReader(path, lenient=True))


@pytest.mark.parametrize("kind", ["xz", "gz"])
def test_corrupt_compressed_file(tmp_path, kind):
    data = bytearray(lzma.compress(_big_text()) if kind == "xz" else gzip.compress(_big_text()))
    for i in range(40, len(data) - 40, 97):
        data[i] ^= 0x5A
    path = tmp_path / f"t.jsonl.{kind}"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="cannot read"):
        list(TraceReader(path))


@pytest.mark.parametrize("magic", [b"\xfd7zXZ\x00", b"\x1f\x8b"])
def test_garbage_after_magic(tmp_path, magic):
    path = tmp_path / "g.jsonl"
    path.write_bytes(magic + b"garbage" * 10)
    with pytest.raises(TraceError, match="cannot read"):
        list(TraceReader(path))


def test_binary_plain_file(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b"\xff\xfe\x00binary\x80\x81\n")
    with pytest.raises(TraceError, match="cannot read"):
        list(TraceReader(path))


def test_docs_example_is_a_valid_trace(tmp_path):
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "trace-format.md").read_text()
    block = doc.split("## Example", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.jsonl"
    path.write_text(block)
    reader = TraceReader(path, check_order=True)
    recs = list(reader)
    assert reader.block_size == 16 and len(recs) == 4
    assert recs[0].tool_name == "run_tests" and recs[3].tenant == "acme"
    assert recs[2].hash_ids[:3] == recs[0].hash_ids
