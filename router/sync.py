"""Routing state shared between router replicas, off the request path.

Each router process decides from its own ``RoutingState``; what it decides reaches the
others asynchronously, so no request waits on an actor call:

- every ``sync_interval_s`` a replica hands the shared ``DecisionLog`` (one named Ray
  actor per app) the decisions it made since the last exchange (replica URL, model,
  tenant, session, agent hint, block keys, prompt length; a JSON batch) and its in-flight
  count per upstream, and gets back the other replicas' decisions since its cursor and
  the sum of their fresh in-flight counts;
- it applies each peer decision through the policy's ``on_peer_start`` (sessions,
  placements and the prefix model follow it) and adds the peers' in-flight counts to its
  load view. Engine truth (gauges, KV events) each replica reads itself;
- router pods that run their own Ray (Deployment mode with several pods) share the same
  batches over HTTP (``pods``): each replica also pushes its batch and in-flight counts
  to the other pods, whose log ingests them (``DecisionLog.ingest``) for every replica
  there. Batches are JSON, validated on receipt, never unpickled.

Staleness is bounded by the exchange interval plus one actor round trip, and measured:
``anchorage_router_peer_staleness_seconds`` is the age of each applied decision; a peer
load report older than ``LOAD_TTL_INTERVALS`` intervals is ignored, and batches a slow
replica missed (the log keeps ``max_batches``) are counted in
``anchorage_router_peer_batches_lost_total``. If the log is unreachable the replica keeps
routing on its own state (``anchorage_router_peer_sync_errors_total``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from anchorage.policies.base import RequestContext
from anchorage.router import fastjson

log = logging.getLogger("anchorage.router")
LOAD_TTL_INTERVALS = 20


class DecisionLog:
    """The shared log (plain Python; ``actor()`` hosts it in Ray)."""

    def __init__(self, max_batches: int = 4096, load_ttl_s: float = 1.0) -> None:
        self.batches: deque = deque()          # (seq, origin, payload)
        self.next_seq = 0
        self.max_batches = max_batches
        self.load_ttl_s = load_ttl_s
        self.loads: dict[str, tuple[float, dict[str, int]]] = {}

    def exchange(self, peer: str, payload: bytes | None, cursor: int,
                 load: dict[str, int]) -> tuple[int, list[bytes], dict[str, int], int]:
        now = time.time()
        self.loads[peer] = (now, load)
        if payload:
            self.batches.append((self.next_seq, peer, payload))
            self.next_seq += 1
            while len(self.batches) > self.max_batches:
                self.batches.popleft()
        first = self.batches[0][0] if self.batches else self.next_seq
        if cursor < 0:                         # a new replica learns what the log holds
            cursor = first
        lost = max(0, first - cursor)
        out = [p for seq, origin, p in self.batches if seq >= cursor and origin != peer]
        peers: dict[str, int] = {}
        for name, (t, counts) in list(self.loads.items()):
            if now - t > self.load_ttl_s:
                if now - t > 60 * self.load_ttl_s:
                    del self.loads[name]
                continue
            if name != peer:
                for url, n in counts.items():
                    peers[url] = peers.get(url, 0) + n
        return self.next_seq, out, peers, lost


    def ingest(self, origin: str, payload: bytes | None, load: dict[str, int]) -> int:
        """A batch from a router in another pod (``pods``): every replica here reads it
        as it reads its neighbours' (``origin`` names that pod's replica)."""
        self.loads[origin] = (time.time(), load)
        if payload:
            self.batches.append((self.next_seq, origin, payload))
            self.next_seq += 1
            while len(self.batches) > self.max_batches:
                self.batches.popleft()
        return self.next_seq


def actor(name: str, interval_s: float):
    """The app's named ``DecisionLog`` actor, created on first use."""
    import ray

    cls = ray.remote(num_cpus=0)(DecisionLog)
    return cls.options(name=name, get_if_exists=True, lifetime="detached",
                       max_concurrency=1).remote(load_ttl_s=LOAD_TTL_INTERVALS * interval_s)


def encode(decisions: list[tuple[str, str | None, RequestContext]]) -> bytes:
    """A batch of decisions as JSON (safe to receive from the network, unlike pickle)."""
    now = time.time()
    return fastjson.dumps([[now, url, model, c.tenant, c.session_id, c.agent_hint,
                            list(c.keys), int(c.input_length)] for url, model, c in decisions])


def decode(payload: bytes) -> list[tuple[float, str, str | None, RequestContext]]:
    """Raises ValueError on a malformed batch (nothing of it is applied)."""
    rows = fastjson.loads(payload)
    if not isinstance(rows, list):
        raise ValueError("a decision batch is a JSON array")
    out = []
    mono = time.monotonic()
    for row in rows:
        if not (isinstance(row, list) and len(row) == 8):
            raise ValueError("a decision is an array of 8 fields")
        t, url, model, tenant, session, hint, keys, n = row
        if not (isinstance(t, (int, float)) and isinstance(url, str) and isinstance(keys, list)
                and all(isinstance(x, (str, type(None))) for x in (model, tenant, session, hint))
                and isinstance(n, int) and all(isinstance(k, int) for k in keys)):
            raise ValueError("a decision has a field of the wrong type")
        out.append((float(t), url, model, RequestContext(
            request_id=None, keys=keys, input_length=n, now_s=mono,
            session_id=session, tenant=tenant, agent_hint=hint)))
    return out


class PeerSync:
    """One replica's side of the exchange (an asyncio task in the router process)."""

    def __init__(self, state, log_handle, peer_id: str, interval_s: float,
                 pods=None) -> None:
        self.state, self.log, self.peer = state, log_handle, peer_id
        self.interval_s = interval_s
        self.pods = pods               # router pods elsewhere (``pods.PodPeers``) or None
        self.cursor = -1
        self.applied = 0
        self.last_ok = 0.0
        state.outbox = []

    async def exchange_once(self) -> None:
        st = self.state
        batch, st.outbox = st.outbox, []
        payload = encode(batch) if batch else None
        load = {u.url: u.inflight for u in st.upstreams.values() if u.inflight}
        if self.pods is not None:
            self.pods.push(self.peer, payload, load)     # fire and forget
        try:
            res = self.log.exchange.remote(self.peer, payload, self.cursor, load)
            self.cursor, batches, peers, lost = await res if hasattr(res, "__await__") else res
        except Exception as exc:  # noqa: BLE001 - route on local state meanwhile
            st.metrics.peer_sync_errors.inc()
            log.warning("routing-state exchange failed (%s); routing on local state", exc)
            return
        self.last_ok = time.time()
        if lost:
            st.metrics.peer_lost.inc(lost)
        for up in st.upstreams.values():
            up.peer_inflight = peers.get(up.url, 0)
        now = time.time()
        for p in batches:
            try:
                rows = decode(p)
            except ValueError as exc:          # checked on receipt; never expected here
                log.warning("dropping a malformed decision batch: %s", exc)
                continue
            for t, url, model, ctx in rows:
                if st.on_peer_start(url, model, ctx):
                    st.metrics.peer_staleness.observe(max(0.0, now - t))
                    st.metrics.peer_decisions.inc()
                    self.applied += 1

    async def run(self) -> None:
        while True:
            t0 = time.monotonic()
            await self.exchange_once()
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def status(self) -> dict[str, Any]:
        return {"peer": self.peer, "cursor": self.cursor, "applied": self.applied,
                "last_ok_age_s": time.time() - self.last_ok if self.last_ok else None}
