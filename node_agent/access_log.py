"""The sidecar's sampled access log: the plugin's sampled requests (``Snapshot.requests``)
moved into an ``anchorage.access_log.AccessLogSampler`` (bounded, rate-limited), served as
``anchorage-trace/v1`` JSONL for the operator's tuner.

Each record is taken once: records carry the engine's sequence number, and a new engine
process (another ``pid``) starts the sequence again.
"""

from __future__ import annotations

import dataclasses

from anchorage.access_log import AccessLogConfig, AccessLogSampler
from anchorage.node_agent.snapshot import Snapshot
from anchorage.trace.format import TraceHeader, dumps_trace


class AccessLogFeed:
    def __init__(self, config: AccessLogConfig):
        # the plugin samples whole sessions at config.sample_rate: keep all it sends
        self.sampler = AccessLogSampler(dataclasses.replace(config, sample_rate=1.0))
        self._last_seq = 0
        self._last_pid: int | None = None

    @property
    def kept(self) -> int:
        return self.sampler.kept

    def take(self, s: Snapshot) -> None:
        """The snapshot's records not taken yet."""
        if s.pid != self._last_pid:  # engine restarted: sequence numbers restart
            self._last_pid, self._last_seq = s.pid, 0
        for r in s.requests:
            if r.seq <= self._last_seq:
                continue
            self._last_seq = r.seq
            self.sampler.offer(r.t, list(r.hash_ids), input_length=r.input_length,
                               output_length=r.output_length, session_id=r.session_id,
                               tenant=r.tenant, tool_name=r.tool_name, tool_args=r.tool_args,
                               agent=r.agent)

    def text(self, drain: bool, block_size: int | None = None) -> str:
        """The log as anchorage-trace/v1 JSONL (header line, then records); ``drain``
        empties the buffer."""
        recs = self.sampler.drain() if drain else self.sampler.snapshot()
        bs = block_size or self.sampler.config.block_size
        return dumps_trace(recs, TraceHeader(block_size=bs,
                                             source="anchorage node-agent access log"))
