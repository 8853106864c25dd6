"""Azure LLM inference trace 2023 (Patel et al., "Splitwise", ISCA 2024): arrivals and
token counts only (``TIMESTAMP,ContextTokens,GeneratedTokens``). Every request gets its
own fresh block ids (``ceil(ContextTokens / block_size)`` of them): nothing is shared, so
the trace exercises load shape, never prefix reuse. Timestamps become ms from the first
request. ``src`` is a CSV file, or a folder holding exactly one."""

from __future__ import annotations

import csv
import glob
import os

from anchorage.trace.blocks import PrefixIds, n_blocks
from anchorage.trace.convert.common import ConvertOptions, iso_ms
from anchorage.trace.format import TraceError, TraceHeader, TraceRecord

DEFAULT_BLOCK_SIZE = 16
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _csv_path(src: str) -> str:
    if not os.path.isdir(src):
        return src
    found = sorted(glob.glob(os.path.join(src, "*.csv")))
    if len(found) != 1:
        names = ", ".join(os.path.basename(f) for f in found) or "none"
        raise TraceError(src, None, f"give one CSV file (found: {names})")
    return found[0]


def convert(src: str, opts: ConvertOptions) -> tuple[TraceHeader, list[TraceRecord]]:
    path = _csv_path(src)
    bs = opts.block_size or DEFAULT_BLOCK_SIZE
    ids = PrefixIds()
    rows: list[tuple[float, int, int]] = []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            head = next(reader, None)
            if head is None or tuple(h.strip() for h in head[:3]) != COLUMNS:
                raise TraceError(path, 1, f"expected a header {','.join(COLUMNS)}, got {head!r}")
            for line, row in enumerate(reader, start=2):
                if not row:
                    continue
                try:
                    ts = iso_ms(row[0])
                    ctx, gen = int(row[1]), int(row[2])
                except (ValueError, IndexError) as exc:
                    raise TraceError(path, line, f"bad row {row!r}: {exc}") from None
                if ctx < 0 or gen < 0:
                    raise TraceError(path, line, "token counts must be >= 0")
                rows.append((ts, ctx, gen))
                if opts.limit is not None and len(rows) >= opts.limit:
                    break
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(path, None, f"cannot read: {exc}") from None
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    records = [TraceRecord(timestamp=round(ts - t0, 3),
                           hash_ids=[ids.fresh() for _ in range(n_blocks(ctx, bs))],
                           output_length=gen, input_length=ctx)
               for ts, ctx, gen in rows]
    header = TraceHeader(block_size=bs, source=f"azure:{os.path.basename(path)}",
                         has_header=True, extra={"converter": "azure", "arrivals_only": True})
    return header, records

