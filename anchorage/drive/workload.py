"""Where a drive's requests come from: an ``anchorage-trace/v1`` file, or a generated
multi-agent topology (``anchorage.trace.generate``) sized for tiny CPU engines."""

from __future__ import annotations

from dataclasses import dataclass

from anchorage.trace.format import TraceRecord

# The demo's workload: ~220 requests, anchors of a few hundred to ~1,500 tokens, tool
# gaps that matter once compressed. Small enough for two CPU engines in a few minutes.
DEMO = {"topology": "selector", "agents": 6, "sessions": 40, "seed": 7, "mean_requests": 6.0,
        "anchor_tokens": 400, "concurrency": 8.0}


@dataclass
class Workload:
    records: list[TraceRecord]
    block_size: int
    description: str


def generated(topology: str, agents: int, sessions: int, seed: int, block_size: int = 32,
              mean_requests: float = 10.0, anchor_tokens: int = 700,
              concurrency: float = 8.0) -> Workload:
    from anchorage.trace.generate import generate

    header, records = generate(topology, agents, sessions, seed, block_size=block_size,
                               mean_requests=mean_requests, anchor_tokens=anchor_tokens,
                               concurrency=concurrency)
    return Workload(records, header.block_size,
                    f"generated {topology}: {agents} agents, {sessions} sessions, seed {seed}, "
                    f"{len(records)} requests")


def from_file(path: str, limit: int | None = None) -> Workload:
    """Reads and validates a trace (TraceError on a bad or unknown format)."""
    from anchorage.trace.format import TraceReader

    records: list[TraceRecord] = []
    reader = TraceReader(path)
    for rec in reader:
        records.append(rec)
        if limit and len(records) >= limit:
            break
    block = reader.header.block_size
    return Workload(records, block, f"{path}: {len(records)} requests, block size {block}")
