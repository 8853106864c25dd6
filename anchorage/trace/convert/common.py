"""What the dataset converters share: options, session interleaving, JSON loading."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

from anchorage.trace.format import READ_ERRORS, TraceError, TraceRecord, open_text

DEFAULT_WINDOW_S = 3600.0


@dataclass
class ConvertOptions:
    """``seed``: start offsets of interleaved sessions; ``window_s``: sessions start at
    uniform random offsets in [0, window_s) (None: the converter's default);
    ``time_compression``: divide an original clock by this factor instead of
    interleaving (chatdev); ``block_size``: for converters that build block ids
    themselves; ``limit``: at most this many sessions (requests for azure/mooncake)."""

    seed: int = 0
    window_s: float | None = None
    time_compression: float | None = None
    block_size: int | None = None
    limit: int | None = None

    def validate(self) -> None:
        if self.window_s is not None and not self.window_s >= 0:
            raise ValueError(f"--window-s must be >= 0, got {self.window_s}")
        if self.time_compression is not None and not self.time_compression > 0:
            raise ValueError(f"--time-compression must be > 0, got {self.time_compression}")
        if self.block_size is not None and self.block_size <= 0:
            raise ValueError(f"--block-size must be positive, got {self.block_size}")
        if self.limit is not None and self.limit <= 0:
            raise ValueError(f"--limit must be positive, got {self.limit}")
        if self.window_s is not None and self.time_compression is not None:
            raise ValueError("give either --window-s or --time-compression, not both")


def start_offsets_ms(n: int, window_s: float, seed: int) -> list[float]:
    """Seeded uniform start offsets (ms) for ``n`` sessions over a window."""
    rng = random.Random(f"anchorage-convert-offsets:{seed}")
    return [rng.uniform(0.0, window_s * 1000.0) for _ in range(n)]


def interleave(sessions: list[list[TraceRecord]], offsets_ms: Iterable[float]
               ) -> list[TraceRecord]:
    """Shift each session (records timed from its own start) by its offset and merge all
    onto one clock, ordered by time (ties: session order, then record order)."""
    keyed = []
    for si, (recs, off) in enumerate(zip(sessions, offsets_ms)):
        for ri, r in enumerate(recs):
            r.timestamp = round(r.timestamp + off, 3)
            keyed.append((r.timestamp, si, ri, r))
    keyed.sort(key=lambda x: x[:3])
    base = keyed[0][0] if keyed else 0.0
    out = []
    for ts, _, _, r in keyed:
        r.timestamp = round(ts - base, 3)
        out.append(r)
    return out


def load_json(path: str) -> Any:
    """A whole (possibly xz/gz-compressed) JSON document, or TraceError."""
    try:
        with open_text(path) as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise TraceError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
    except READ_ERRORS as exc:
        raise TraceError(path, None, f"cannot read: {exc}") from None


_FRACTION = re.compile(r"(\.\d{6})\d+")


def iso_ms(text: str) -> float:
    """Unix ms of an ISO-8601 timestamp (``Z`` suffix and 7-digit fractions accepted);
    naive ones are read as UTC, so no local-time DST jump enters a trace."""
    s = _FRACTION.sub(r"\1", text.strip())
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp() * 1000.0


def read_json_objects(path: str) -> list[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file (any compression);
    a line that is not a JSON object is a TraceError naming the file and line."""
    rows: list[tuple[int, dict]] = []
    try:
        with open_text(path) as fh:
            for line, text in enumerate(fh, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise TraceError(path, line, f"invalid JSON: {exc.msg}") from None
                if not isinstance(obj, dict):
                    raise TraceError(path, line, "expected a JSON object")
                rows.append((line, obj))
    except READ_ERRORS as exc:
        raise TraceError(path, None, f"cannot read: {exc}") from None
    return rows
