"""Sampled access log in `anchorage-trace/v1` form, for the operator's offline tuning.

Specification
-------------
The node agent offers every real request (block keys, token counts, session, tenant, tool
metadata; never text). A request is kept iff

1. its *session* is sampled: ``stable_hash(session_id) mod 10_000 < sample_rate * 10_000``
   (whole sessions are kept, so per-session gaps and histories stay replayable; requests
   without a session are sampled per request with the same rate);
2. the rate limit allows it: at most ``max_per_s`` records per second (token bucket,
   burst ``max_per_s``);
3. warm-up requests are never logged (they are not workload).

The buffer is bounded (``max_records``, oldest dropped first) and counts what it dropped.
Block keys are mapped to non-negative 63-bit ints, so engine hashes (bytes) and trace ids
(ints) both give valid v1 ``hash_ids``; chained-prefix semantics are preserved because the
mapping is injective up to 63-bit collisions.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Hashable, Iterable

from anchorage.trace.format import TraceHeader, TraceRecord

_MASK63 = (1 << 63) - 1


def stable_hash(value: Any) -> int:
    """Process-independent 63-bit hash (Python's hash() is salted per process)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value & _MASK63
    data = value if isinstance(value, bytes) else repr(value).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") & _MASK63


@dataclass(frozen=True)
class AccessLogConfig:
    sample_rate: float = 0.1
    max_per_s: float = 50.0
    max_records: int = 100_000
    block_size: int = 16

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ValueError("sample_rate must be in [0, 1]")
        if self.max_per_s <= 0 or self.max_records <= 0 or self.block_size <= 0:
            raise ValueError("max_per_s, max_records and block_size must be positive")


class AccessLogSampler:
    def __init__(self, config: AccessLogConfig | None = None, *, t0_s: float | None = None):
        self.config = config or AccessLogConfig()
        self._buf: deque[TraceRecord] = deque()
        self._tokens = self.config.max_per_s
        self._last: float | None = None
        self._t0 = t0_s
        self.offered = self.kept = self.dropped_rate = self.dropped_full = 0
        self._threshold = int(self.config.sample_rate * 10_000)
        self._n = 0

    def _sampled(self, session_id: str | None) -> bool:
        if session_id is None:
            self._n += 1
            key: Any = ("request", self._n)
        else:
            key = session_id
        return stable_hash(key) % 10_000 < self._threshold

    def offer(self, now_s: float, keys: Iterable[Hashable], *, input_length: int,
              output_length: int = 0, session_id: str | None = None,
              tenant: str | None = None, tool_name: str | None = None,
              tool_args: Any = None, agent: str | None = None, warmup: bool = False) -> bool:
        """Offer one request; returns True when it was logged."""
        if warmup:
            return False
        self.offered += 1
        if not self._sampled(session_id):
            return False
        if self._last is not None and now_s > self._last:
            self._tokens = min(self.config.max_per_s,
                               self._tokens + (now_s - self._last) * self.config.max_per_s)
        self._last = now_s if self._last is None else max(self._last, now_s)
        if self._tokens < 1.0:
            self.dropped_rate += 1
            return False
        self._tokens -= 1.0
        if self._t0 is None:
            self._t0 = now_s
        rec = TraceRecord(
            timestamp=max(0.0, round((now_s - self._t0) * 1000.0, 3)),
            hash_ids=[stable_hash(k) for k in keys], output_length=int(output_length),
            input_length=int(input_length), session_id=session_id, agent=agent,
            tool_name=tool_name, tool_args=tool_args, tenant=tenant)
        if len(self._buf) >= self.config.max_records:
            self._buf.popleft()
            self.dropped_full += 1
        self._buf.append(rec)
        self.kept += 1
        return True

    def header(self, source: str = "anchorage node-agent access log") -> TraceHeader:
        return TraceHeader(block_size=self.config.block_size, source=source)

    def snapshot(self) -> list[TraceRecord]:
        return list(self._buf)

    def drain(self) -> list[TraceRecord]:
        out = list(self._buf)
        self._buf.clear()
        return out

    def __len__(self) -> int:
        return len(self._buf)
