"""Mooncake (FAST'25) traces: already valid anchorage-trace/v1 (block size 512, no
header). Conversion validates every line, orders requests by time (stable) and adds a
header naming the source; ``limit`` keeps the first N requests."""

from __future__ import annotations

import os

from anchorage.trace.convert.common import ConvertOptions
from anchorage.trace.format import TraceHeader, TraceReader, TraceRecord

BLOCK_SIZE = 512


def convert(src: str, opts: ConvertOptions) -> tuple[TraceHeader, list[TraceRecord]]:
    reader = TraceReader(src, block_size=opts.block_size or BLOCK_SIZE)
    records = []
    for rec in reader:
        records.append(rec)
        if opts.limit is not None and len(records) >= opts.limit:
            break
    records.sort(key=lambda r: r.timestamp)
    header = TraceHeader(block_size=reader.block_size,
                         source=f"mooncake:{os.path.basename(src)}", has_header=True,
                         extra={"converter": "mooncake"})
    return header, records
