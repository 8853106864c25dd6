"""The `anchorage-trace/v1` format: records, a streaming validating reader, a writer.

JSONL, optionally xz- or gzip-compressed (by file suffix, or sniffed from magic bytes).
An optional first line is a header::

    {"format": "anchorage-trace/v1", "block_size": 16, "source": "..."}

Every other line is one request:

- required: ``timestamp`` (ms from trace start, number >= 0), ``hash_ids`` (list of ints:
  chained-prefix block ids; an equal id at position i means the same prompt through
  block i), ``output_length`` (int >= 0);
- optional: ``input_length`` (tokens; default ``len(hash_ids) * block_size``),
  ``session_id``, ``agent`` (ground truth for evaluation only: no policy reads it),
  ``tool_name``, ``tool_args``, ``tool_duration_ms`` (time from this request's completion
  to the session's next request when a tool ran), ``tenant``.

Mooncake traces are valid v1 files: no header, block size 512 (the default when a file has
no header). Unknown fields are kept in ``extra`` so converters and tools can extend the
format without renaming anything. Full specification: ``docs/trace-format.md``.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Iterator

FORMAT = "anchorage-trace/v1"
DEFAULT_BLOCK_SIZE = 512  # Mooncake's block size: a header-less file is read as Mooncake

# What a damaged file raises while being decompressed or decoded.
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error, UnicodeDecodeError)

_KNOWN = {
    "timestamp", "hash_ids", "output_length", "input_length", "session_id", "agent",
    "tool_name", "tool_args", "tool_duration_ms", "tenant",
}


class TraceError(ValueError):
    """A trace that cannot be read: names the file, the line and the problem."""

    def __init__(self, path: str, line: int | None, problem: str):
        self.path, self.line, self.problem = path, line, problem
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class TraceHeader:
    block_size: int = DEFAULT_BLOCK_SIZE
    source: str | None = None
    format: str = FORMAT
    has_header: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "block_size": self.block_size}
        if self.source is not None:
            out["source"] = self.source
        out.update(self.extra)
        return out


@dataclass(slots=True)
class TraceRecord:
    """One request. ``input_length`` is always resolved (never None) once read."""

    timestamp: float
    hash_ids: list[int]
    output_length: int
    input_length: int
    session_id: str | None = None
    agent: str | None = None
    tool_name: str | None = None
    tool_args: Any = None
    tool_duration_ms: float | None = None
    tenant: str | None = None
    extra: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "timestamp": _num(self.timestamp),
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": self.hash_ids,
        }
        for name in ("session_id", "agent", "tool_name", "tool_args", "tool_duration_ms",
                     "tenant"):
            value = getattr(self, name)
            if value is not None:
                out[name] = _num(value) if name == "tool_duration_ms" else value
        if self.extra:
            out.update(self.extra)
        return out


def _num(x: float) -> float | int:
    return int(x) if isinstance(x, float) and x.is_integer() else x


# ---------------------------------------------------------------------------------------
# Opening files

def open_text(path: str | os.PathLike, mode: str = "r") -> IO[str]:
    """Open a possibly compressed text file. Reading sniffs magic bytes; writing uses the
    suffix (``.xz``, ``.gz``)."""
    p = os.fspath(path)
    if "r" in mode:
        with open(p, "rb") as fh:
            magic = fh.read(6)
        if magic.startswith(b"\xfd7zXZ\x00"):
            return lzma.open(p, "rt", encoding="utf-8-sig")
        if magic.startswith(b"\x1f\x8b"):
            return gzip.open(p, "rt", encoding="utf-8-sig")
        return open(p, "r", encoding="utf-8-sig")
    if p.endswith(".xz"):
        # preset 1: ~6x faster than the default 6 on traces (long runs of chained ids),
        # for files ~1.5x larger; a 94M-id trace writes in about a minute instead of six.
        return lzma.open(p, "wt", encoding="utf-8", preset=1)
    if p.endswith(".gz"):
        return gzip.open(p, "wt", encoding="utf-8")
    return open(p, "w", encoding="utf-8")


# ---------------------------------------------------------------------------------------
# Validation

def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return (_is_int(x) or isinstance(x, float)) and math.isfinite(x)


def parse_header(obj: dict[str, Any], path: str, line: int) -> TraceHeader:
    fmt = obj.get("format")
    if fmt != FORMAT:
        raise TraceError(path, line, f"unknown trace format {fmt!r} (expected {FORMAT!r})")
    bs = obj.get("block_size", DEFAULT_BLOCK_SIZE)
    if not _is_int(bs) or bs <= 0:
        raise TraceError(path, line, f"header block_size must be a positive int, got {bs!r}")
    source = obj.get("source")
    if source is not None and not isinstance(source, str):
        raise TraceError(path, line, "header source must be a string")
    extra = {k: v for k, v in obj.items() if k not in ("format", "block_size", "source")}
    return TraceHeader(block_size=bs, source=source, has_header=True, extra=extra)


def parse_record(obj: Any, block_size: int, path: str, line: int) -> TraceRecord:
    """Validate one decoded JSON line into a record; raise TraceError naming the problem."""
    if not isinstance(obj, dict):
        raise TraceError(path, line, f"expected a JSON object, got {type(obj).__name__}")
    for name in ("timestamp", "hash_ids", "output_length"):
        if name not in obj:
            raise TraceError(path, line, f"missing required field {name!r}")
    ts = obj["timestamp"]
    if not _is_num(ts) or ts < 0:
        raise TraceError(path, line, f"timestamp must be a number >= 0, got {ts!r}")
    hids = obj["hash_ids"]
    if not isinstance(hids, list) or not all(_is_int(h) for h in hids):
        raise TraceError(path, line, "hash_ids must be a list of ints")
    out_len = obj["output_length"]
    if not _is_int(out_len) or out_len < 0:
        raise TraceError(path, line, f"output_length must be an int >= 0, got {out_len!r}")
    in_len = obj.get("input_length")
    if in_len is None:
        in_len = len(hids) * block_size
    elif not _is_int(in_len) or in_len < 0:
        raise TraceError(path, line, f"input_length must be an int >= 0, got {in_len!r}")
    elif len(hids) > 0 and in_len <= (len(hids) - 1) * block_size:
        raise TraceError(
            path, line,
            f"input_length {in_len} is too short for {len(hids)} blocks of {block_size} tokens")
    for name in ("session_id", "agent", "tool_name", "tenant"):
        v = obj.get(name)
        if v is not None and not isinstance(v, (str, int)):
            raise TraceError(path, line, f"{name} must be a string")
    tdur = obj.get("tool_duration_ms")
    if tdur is not None and (not _is_num(tdur) or tdur < 0):
        raise TraceError(path, line, f"tool_duration_ms must be a number >= 0, got {tdur!r}")
    extra = {k: v for k, v in obj.items() if k not in _KNOWN} or None

    def _s(v: Any) -> str | None:
        return None if v is None else str(v)

    return TraceRecord(
        timestamp=ts, hash_ids=hids, output_length=out_len, input_length=in_len,
        session_id=_s(obj.get("session_id")), agent=_s(obj.get("agent")),
        tool_name=_s(obj.get("tool_name")), tool_args=obj.get("tool_args"),
        tool_duration_ms=tdur, tenant=_s(obj.get("tenant")), extra=extra,
    )


# ---------------------------------------------------------------------------------------
# Reading and writing

class TraceReader:
    """Streams records from a v1 file. ``header`` is known once the reader is created.

    With ``lenient=True`` malformed lines are skipped and counted in ``skipped`` (the
    first few problems are kept in ``problems``); otherwise the first one raises
    TraceError. Records are yielded in file order; ``check_order`` raises on a timestamp
    that goes backwards (the simulator needs a clock that never runs back).
    """

    def __init__(self, path: str | os.PathLike, *, lenient: bool = False,
                 block_size: int | None = None, check_order: bool = False):
        self.path = os.fspath(path)
        self.lenient = lenient
        self.check_order = check_order
        self.skipped = 0
        self.problems: list[str] = []
        if not os.path.exists(self.path):
            raise TraceError(self.path, None, "no such file")
        try:
            self._fh = open_text(self.path)
            self._first = self._fh.readline()
        except READ_ERRORS as exc:
            raise TraceError(self.path, None, f"cannot read: {exc}") from None
        try:
            self._read_header(block_size)
        except BaseException:
            self._fh.close()
            raise

    def _read_header(self, block_size: int | None) -> None:
        self._lineno = 1
        self._consumed = False
        self.header = TraceHeader(block_size=block_size or DEFAULT_BLOCK_SIZE)
        self._pending: str | None = self._first
        stripped = self._first.strip()
        if stripped.startswith("{") and '"format"' in stripped:
            try:
                obj = json.loads(stripped)
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict) and "format" in obj and "hash_ids" not in obj:
                self.header = parse_header(obj, self.path, 1)
                if block_size is not None:
                    self.header = TraceHeader(block_size=block_size, source=self.header.source,
                                              has_header=True, extra=self.header.extra)
                self._pending = None

    @property
    def block_size(self) -> int:
        return self.header.block_size

    def _problem(self, err: TraceError) -> None:
        if not self.lenient:
            raise err
        self.skipped += 1
        if len(self.problems) < 20:
            self.problems.append(str(err))

    def __iter__(self) -> Iterator[TraceRecord]:
        if self._consumed:
            raise TraceError(self.path, None, "reader already read (open a new TraceReader)")
        self._consumed = True
        last_ts = -math.inf
        bs = self.header.block_size
        try:
            while True:
                if self._pending is not None:
                    text, self._pending = self._pending, None
                    lineno = 1
                else:
                    text = self._fh.readline()
                    self._lineno += 1
                    lineno = self._lineno
                if not text:
                    break
                text = text.strip()
                if not text:
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    self._problem(TraceError(self.path, lineno, f"invalid JSON: {exc.msg}"))
                    continue
                try:
                    rec = parse_record(obj, bs, self.path, lineno)
                except TraceError as err:
                    self._problem(err)
                    continue
                if self.check_order and rec.timestamp < last_ts:
                    self._problem(TraceError(
                        self.path, lineno,
                        f"timestamp {rec.timestamp} goes back (previous {last_ts})"))
                    continue
                last_ts = max(last_ts, rec.timestamp)
                yield rec
        except READ_ERRORS as exc:
            raise TraceError(self.path, self._lineno, f"cannot read: {exc}") from None
        finally:
            self._fh.close()


def read_trace(path: str | os.PathLike, *, lenient: bool = False,
               block_size: int | None = None) -> tuple[TraceHeader, list[TraceRecord]]:
    """Read a whole trace into memory (convenience for tools and tests)."""
    reader = TraceReader(path, lenient=lenient, block_size=block_size)
    return reader.header, list(reader)


def write_trace(path: str | os.PathLike, records: Iterable[TraceRecord | dict[str, Any]],
                header: TraceHeader | None = None) -> int:
    """Write records (and a header unless None). Returns the number of records written."""
    n = 0
    with open_text(path, "w") as fh:
        n = dump_trace(fh, records, header)
    return n


def dump_trace(fh: IO[str], records: Iterable[TraceRecord | dict[str, Any]],
               header: TraceHeader | None = None) -> int:
    n = 0
    if header is not None:
        fh.write(json.dumps(header.to_json(), separators=(",", ":")) + "\n")
    for rec in records:
        obj = rec.to_json() if isinstance(rec, TraceRecord) else rec
        fh.write(json.dumps(obj, separators=(",", ":")) + "\n")
        n += 1
    return n


def dumps_trace(records: Iterable[TraceRecord], header: TraceHeader | None = None) -> str:
    buf = io.StringIO()
    dump_trace(buf, records, header)
    return buf.getvalue()
