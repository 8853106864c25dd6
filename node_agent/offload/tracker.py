"""The scheduler-side state of Anchorage's host tier in the engine (no vLLM imports): the
session predictions the host policy reads, the temporal controller's plan at each tool
stall, the just-in-time reloads, and the counters the sidecar exports.

Specification
-------------
Events, from ``AnchorageOffloadingConnector`` (plain values):

- ``arrived(rid, meta, token_ids, now)``: a request (``meta``: session, tool, args, warmup,
  agent, tenant, cache salt) reaches the connector. ``SessionReturns.request``; a request
  with a session and a pending tool leaves its prompt in the bounded registry
  (``node_agent.recorder.SessionPrompts``) for a later warm-up.
- ``allocated(rid, local_tokens, external_tokens, block_size)``: the scheduler gave the
  request its blocks: ``local`` tokens hit the GPU prefix cache, ``external`` come from host
  memory (vLLM's load). Host hits count ``external`` tokens and their blocks. A real
  request's load is ``late`` (it waits for the copy). A warm-up's load is remembered for
  its session; the session's next real request decides it: ``in_time`` when that request
  loads nothing from host memory and hits on GPU (the warm-up brought the prefix in
  before it was needed), ``wasted`` otherwise.
- ``finished(rid, now, readings)``: the turn ended. With a pending tool the controller
  opens the stall (``SessionReturns.finished``) and, with ``reload_ahead``, plans it over
  ``readings()`` = (``PoolReading``, ``SessionReading``, the session's host keys); an
  accepted offload pins those keys in host memory until the session is back
  (``TemporalController.offloaded``) and schedules its warm-up at ``reload_at``.
- ``transferred(d2h_bytes, h2d_bytes, stores, loads)``: vLLM's transfer statistics of one
  step (the worker's ``TransferStats``); ``sync_loads``, the loads copied in the step that
  schedules their request (the connector counts them: ``anchorage.tiering.loads``).
- ``failed(counts)``: the worker's failures of one step (``store_failures``,
  ``load_failures``, ``timeouts``): each is a fallback to recomputation; ``peer_stale``
  (with the node pool), the failed loads whose peer's chunk changed (also in
  ``load_failures``).

``pending_reloads(mono_now, unix_now)``: offloaded sessions whose warm-up has not started,
with ``at_s`` (unix), blocks, the prompt's token ids and cache salt (sessions whose prompt
is unknown are left out). ``view(...)`` is the snapshot (``host_tier.json``,
``anchorage-host-tier/v1``): capacity (chunks, bytes), occupancy, hits, stores, loads by
outcome, bytes each way, fallbacks by reason, the gate's decisions, pending reloads, and
with the node pool (``node_pool``, a callable giving the manager's counts) ``node_pool``:
``peers`` (engines whose host tiers this one reads), ``peer_hits`` (chunks loaded from a
peer's host tier), ``deduplicated`` (chunks not stored: a peer held them), ``stale_loads``.
"""

from __future__ import annotations

import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from anchorage.node_agent.recorder import SessionPrompts
from anchorage.node_agent.snapshot import BackgroundWriter
from anchorage.tiering.returns import SessionReturns

FORMAT = "anchorage-host-tier/v1"
OUTCOMES = ("in_time", "late", "wasted")
FALLBACKS = ("store_failed", "load_failed", "timeout")
NODE_POOL = ("peers", "peer_hits", "deduplicated", "stale_loads")


class HostTierTracker:
    def __init__(self, returns: SessionReturns, *, capacity_chunks: int, chunk_bytes: int,
                 reload_ahead: bool = True, policy_name: str = "lru",
                 occupancy: Callable[[], int] = lambda: 0,
                 node_pool: Callable[[], dict[str, int]] | None = None):
        self.returns = returns
        self.ctl = returns.ctl
        self.capacity_chunks = capacity_chunks
        self.chunk_bytes = chunk_bytes
        self.reload_ahead = reload_ahead
        self.policy_name = policy_name
        self.occupancy = occupancy
        self.node_pool = node_pool
        self.prompts = SessionPrompts()
        self.salts: dict[Any, str | None] = {}
        self.hit_tokens = self.hit_blocks = 0
        self.stores = self.loads = 0
        self.sync_loads = 0  # loads copied in their request's step (the connector counts)
        self.outcomes: Counter = Counter()
        self.bytes = {"d2h": 0, "h2d": 0}
        self.fallbacks: Counter = Counter()
        self.warm: OrderedDict[Hashable, int] = OrderedDict()  # session -> warm-up tokens
        self._written = 0.0
        self.writer = BackgroundWriter("anchorage-host-tier-writer")

    # -- events ---------------------------------------------------------------------------

    def arrived(self, rid: Any, meta: dict[str, Any], token_ids: Any, now: float) -> None:
        sid = meta.get("session")
        self.returns.request(rid, sid, now, tool=meta.get("tool"), args=meta.get("args"),
                             warmup=bool(meta.get("warmup")), agent=meta.get("agent"),
                             tenant=meta.get("tenant"))
        if sid is None:
            return
        st = self.ctl.stalls.get(sid)
        if meta.get("warmup"):
            if st is not None and st.offloaded and st.reload_started_s is None:
                st.reload_started_s = now
                self.ctl.moved(sid, now)
        elif meta.get("tool") is not None and token_ids:
            self.prompts.offer(sid, token_ids, meta.get("cache_salt"))

    def allocated(self, rid: Any, local_tokens: int, external_tokens: int,
                  block_size: int) -> None:
        info = self.returns.request_info(rid)
        sid, warmup = (info[0], info[3]) if info is not None else (None, False)
        if external_tokens > 0:
            self.hit_tokens += external_tokens
            self.hit_blocks += external_tokens // max(1, block_size)
        if warmup:
            if sid is not None and external_tokens > 0:
                self.warm[sid] = external_tokens
                self.warm.move_to_end(sid)
                while len(self.warm) > self.returns.max_sessions:
                    self.warm.popitem(last=False)
            return
        w = self.warm.pop(sid, None) if sid is not None else None
        if w is not None:
            self.outcomes["in_time" if external_tokens == 0 and local_tokens > 0
                          else "wasted"] += 1
        if external_tokens > 0:
            self.outcomes["late"] += 1

    def finished(self, rid: Any, now: float, readings: Callable[[Hashable], tuple] | None
                 ) -> None:
        st = self.returns.finished(rid, now)
        if st is None or not self.reload_ahead or readings is None:
            return
        got = readings(st.sid)
        if got is None:
            return
        pool, session, keys = got
        self.ctl.plan(st, session, pool)
        if st.action == "offload":
            self.ctl.offloaded(st, now, now + st.offload_s, keys)

    def transferred(self, d2h_bytes: int, h2d_bytes: int, stores: int, loads: int) -> None:
        self.bytes["d2h"] += int(d2h_bytes)
        self.bytes["h2d"] += int(h2d_bytes)
        self.stores += int(stores)
        self.loads += int(loads)

    def failed(self, counts: dict[str, int]) -> None:
        self.fallbacks["store_failed"] += int(counts.get("store_failures", 0))
        self.fallbacks["load_failed"] += int(counts.get("load_failures", 0))
        self.fallbacks["timeout"] += int(counts.get("timeouts", 0))
        self.fallbacks["peer_stale"] += int(counts.get("peer_stale", 0))

    # -- reports --------------------------------------------------------------------------

    def pending_reloads(self, mono_now: float, unix_now: float) -> list[dict[str, Any]]:
        out = []
        for st in list(self.ctl.stalls.values()):
            if not st.offloaded or st.reload_started_s is not None or st.reload_at is None:
                continue
            p = self.prompts.get(st.sid)
            if p is None:
                continue
            out.append({"id": f"{st.sid}#{st.seq}", "session": st.sid,
                        "at_s": unix_now + (st.reload_at - mono_now), "blocks": st.blocks,
                        "token_ids": p[0], "cache_salt": p[1], "agent": st.agent,
                        "tenant": st.tenant})
        return out

    def view(self, mono_now: float, unix_now: float) -> dict[str, Any]:
        return {
            "format": FORMAT, "written_s": unix_now, "pid": os.getpid(),
            "policy": self.policy_name,
            "capacity_chunks": self.capacity_chunks, "chunk_bytes": self.chunk_bytes,
            "capacity_bytes": self.capacity_chunks * self.chunk_bytes,
            "used_chunks": int(self.occupancy()),
            "hits": {"tokens": self.hit_tokens, "blocks": self.hit_blocks},
            "stores": self.stores, "loads": {o: int(self.outcomes.get(o, 0)) for o in OUTCOMES},
            "transfers": {"stores": self.stores, "loads": self.loads,
                          "sync_loads": self.sync_loads},
            "bytes": dict(self.bytes),
            "fallbacks": {f: int(self.fallbacks.get(f, 0)) for f in FALLBACKS},
            "gate": dict(self.ctl.gate), "actions": dict(self.ctl.actions),
            "pending_reloads": self.pending_reloads(mono_now, unix_now),
            "node_pool": None if self.node_pool is None else {
                **{k: int(v) for k, v in self.node_pool().items() if k in NODE_POOL},
                "stale_loads": int(self.fallbacks.get("peer_stale", 0))},
        }

    def maybe_write(self, path: str | Callable[[], str], interval_s: float, mono_now: float,
                    force: bool = False) -> bool:
        """The snapshot to ``path`` (or the path a callable gives, asked only when a write
        is due) at most every ``interval_s`` (never raises). Built here, written by a
        background thread (``BackgroundWriter``: the connector calls this in the scheduler's
        step); ``force`` also waits until it is written (False when it could not be)."""
        if not force and mono_now - self._written < interval_s:
            return False
        self._written = mono_now
        try:
            self.writer.submit(path() if callable(path) else path,
                               self.view(mono_now, time.time()))
        except (OSError, RuntimeError, TypeError, ValueError):
            return False
        if force:
            errors = self.writer.errors
            return self.writer.flush() and self.writer.errors == errors
        return True


HOST_TIER_FILE = "host_tier.json"
_COUNTS = {"hits": ("tokens", "blocks"), "loads": OUTCOMES, "bytes": ("d2h", "h2d"),
           "fallbacks": FALLBACKS}


def parse_host_tier(doc: Any, where: str = "host tier snapshot") -> dict[str, Any]:
    """The snapshot as the sidecar uses it (plain ints); ValueError naming the field."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{where}: not an {FORMAT} document")
    try:
        out: dict[str, Any] = {
            "written_s": float(doc["written_s"]), "policy": str(doc.get("policy", "lru")),
            "capacity_chunks": int(doc["capacity_chunks"]),
            "capacity_bytes": int(doc["capacity_bytes"]),
            "used_chunks": int(doc["used_chunks"]), "stores": int(doc.get("stores", 0)),
            "sync_loads": int((doc.get("transfers") or {}).get("sync_loads", 0)),
            "gate": {str(k): int(v) for k, v in (doc.get("gate") or {}).items()},
            "pending_reloads": list(doc.get("pending_reloads") or []),
        }
        for key, labels in _COUNTS.items():
            sec = doc.get(key) or {}
            out[key] = {k: int(sec.get(k, 0)) for k in labels}
        pool = doc.get("node_pool")
        out["node_pool"] = None if pool is None else {k: int(pool.get(k, 0))
                                                      for k in NODE_POOL}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: malformed field ({type(exc).__name__}: {exc})") from None
    return out


def read_host_tier(state_dir: str) -> dict[str, Any] | None:
    """The engine's latest host-tier snapshot in ``state_dir``; None when there is none."""
    import json

    path = os.path.join(state_dir, HOST_TIER_FILE)
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read ({exc})") from None
    return parse_host_tier(doc, path)
