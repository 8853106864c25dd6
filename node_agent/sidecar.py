"""The node-agent sidecar: warm-ups, metrics, access log, health, config reload.

Runs next to one engine (asyncio, one process). Every ``tick_s``:

1. reads the engine's load (``vllm:num_requests_running`` / ``vllm:num_requests_waiting``
   from its ``/metrics``) and the plugin's snapshot (``node_agent.state``);
2. resolves pending warm-ups (``WarmupLedger``): ``used`` when a real request with the
   warmed agent's fingerprint arrived after the warm-up completed and before its anchor's
   last block left the cache; ``wasted`` when it left first (or after ``horizon_s``);
3. sends the temporal controller's reloads that are due (``tiering.pending_reloads`` in
   the snapshot, ``anchorage.warmup.ReloadScheduler``: the session's last prompt,
   ``max_tokens`` = 1, ``anchorage.warmup`` = 1, its session id and cache salt), then
   asks ``anchorage.warmup.WarmupScheduler`` which predicted agents to warm (anchors known
   from the plugin's registry; cached ones, from the engine's KV events, are skipped) and
   sends each as ``POST /v1/completions`` with ``prompt`` = the anchor's token ids,
   ``max_tokens`` = 1 and ``vllm_xargs`` ``{"anchorage.warmup": 1, "anchorage.agent":
   ...}`` (docs/request-metadata.md);
4. moves the snapshot's sampled requests into the access log (bounded, rate-limited);
5. re-reads ``ANCHORAGE_CONFIG`` when it changed: its generation, and the warm-up knobs
   ``policy.parameters`` set (``prefetch.enabled``, ``prefetch.ratePerSecond``, ``rMin``
   over the command line's ``--no-warmup``, ``--warmup-rate``, ``--warmup-r-min``).

HTTP (bound to 127.0.0.1 unless told otherwise): ``/metrics``, ``/healthz`` (the loop
runs), ``/readyz`` (the engine answered and the snapshot is fresh; with the plugin off,
the engine alone), ``/v1/access-log`` and ``/access-log`` (anchorage-trace/v1 JSONL; add
``?drain=1`` to empty the buffer); the table of answers is in ``node_agent.endpoints``.
SIGTERM/SIGINT stop it gracefully.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from anchorage.access_log import AccessLogConfig, AccessLogSampler
from anchorage.prometheus_text import sums
from anchorage.config import document
from anchorage.trace.format import TraceHeader, dumps_trace
from anchorage.warmup import (ReloadConfig, ReloadScheduler, WarmupConfig, WarmupScheduler,
                              reload_body)
from anchorage.node_agent.endpoints import HTTPServer, build_app
from anchorage.node_agent.kv_events import CacheTracker, KVEventSubscriber, anchor_key
from anchorage.node_agent.metrics import MetricsView, make_registry
from anchorage.node_agent.state import (Snapshot, StateError, read_snapshot, state_path,
                                        write_settings)

log = logging.getLogger("anchorage.node_agent.sidecar")

# skip reasons that mean "a warm-up was wanted and not sent" (the others are not wanted)
COUNTED_SKIPS = ("engine_busy", "unpredictable", "rate_limited", "tick_limit", "disabled")


@dataclass(frozen=True)
class SidecarConfig:
    engine_url: str = "http://127.0.0.1:8000"
    kv_events: str | None = None
    kv_topic: str = "kv"
    state_dir: str = "/run/anchorage"
    host: str = "127.0.0.1"
    port: int = 9400
    model_name: str | None = None       # None: asked from the engine's /v1/models
    config_path: str | None = None      # ANCHORAGE_CONFIG
    policy_env: str | None = None       # ANCHORAGE_POLICY (policy_info before a snapshot)
    tick_s: float = 0.5
    snapshot_max_age_s: float = 5.0
    snapshot_grace_s: float = 60.0      # no snapshot this long after the engine is up: stock
    request_timeout_s: float = 60.0
    horizon_s: float = 600.0
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    reload: ReloadConfig = field(default_factory=ReloadConfig)  # temporal tiering's warm-ups
    access_log: AccessLogConfig = field(default_factory=lambda: AccessLogConfig(sample_rate=0.05))

    def __post_init__(self) -> None:
        if self.tick_s <= 0 or self.snapshot_max_age_s <= 0:
            raise ValueError("tick_s and snapshot_max_age_s must be positive")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port {self.port} is out of range")
        if not self.engine_url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL must be http(s)://..., got {self.engine_url!r}")
        if self.kv_events is not None and not self.kv_events.startswith(("ipc://", "tcp://")):
            raise ValueError(f"KV events endpoint must be ipc://... or tcp://..., "
                             f"got {self.kv_events!r}")


@dataclass
class Pending:
    agent: str
    key: int
    done_s: float


class WarmupLedger:
    """Outcome of each warm-up (pure: snapshot and cache state in, counts out)."""

    def __init__(self, horizon_s: float = 600.0, max_pending: int = 1024):
        self.pending: dict[str, Pending] = {}
        self.horizon_s = horizon_s
        self.max_pending = max_pending
        self.used = self.wasted = 0

    def add(self, agent: str, key: int, done_s: float) -> None:
        old = self.pending.pop(agent, None)
        if old is not None:
            self.wasted += 1  # superseded before any use
        self.pending[agent] = Pending(agent, key, done_s)
        while len(self.pending) > self.max_pending:
            self.pending.pop(next(iter(self.pending)))
            self.wasted += 1

    def resolve(self, snap: Snapshot | None, tracker: CacheTracker, now_s: float) -> None:
        for agent, p in list(self.pending.items()):
            entry = snap.anchors.get(agent) if snap is not None else None
            seen = float(entry["last_seen_s"]) if entry else -math.inf
            gone = tracker.removed_since(p.key, p.done_s)
            if seen > p.done_s and (gone is None or seen <= gone):
                self.used += 1
            elif gone is not None and snap is not None and snap.written_s >= gone:
                self.wasted += 1  # the plugin has reported every request up to the eviction
            elif now_s - p.done_s > self.horizon_s:
                self.wasted += 1
            else:
                continue
            del self.pending[agent]


ENGINE_LOAD = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_engine_load(text: str) -> tuple[int, int]:
    """(running, waiting) from vLLM's Prometheus text (summed over label sets)."""
    got = sums(text, ENGINE_LOAD)
    return int(got.get(ENGINE_LOAD[0], 0.0)), int(got.get(ENGINE_LOAD[1], 0.0))


def read_config_file(path: str) -> tuple[int, dict[str, Any]]:
    """(generation, warm-up overrides) of the operator's document (``anchorage.config``):
    ``policy.parameters`` ``rMin``, ``prefetch.enabled`` and ``prefetch.ratePerSecond`` as
    ``WarmupConfig`` fields (``r_min``, ``enabled``, ``rate_per_s``); the ones the document
    omits are not overridden. Raises ``ConfigError`` (a ValueError)."""
    doc = document.read(path)
    return doc.generation, doc.policy.parameters.warmup_overrides()


class Sidecar:
    def __init__(self, config: SidecarConfig):
        self.cfg = config
        self.state_file = state_path(config.state_dir)
        self.tracker = CacheTracker(horizon_s=config.horizon_s)
        self.subscriber = (KVEventSubscriber(config.kv_events, self.tracker, config.kv_topic)
                           if config.kv_events else None)
        self.scheduler = WarmupScheduler(config.warmup)
        self.ledger = WarmupLedger(config.horizon_s)
        self.access_log = AccessLogSampler(dataclasses.replace(config.access_log, sample_rate=1.0))
        self.model_name = config.model_name
        self.snapshot: Snapshot | None = None
        self.snapshot_error: str | None = None
        self.engine_ok = False
        self._engine_up_s: float | None = None
        self.running = self.waiting = 0
        self.warmups = {"issued": 0, "skipped": 0, "failed": 0}
        self.reloads = ReloadScheduler(config.reload)
        self.reload_warmups = {"issued": 0, "failed": 0}
        self.config_generation = 0
        self._config_mtime: tuple[int, int, int] | None = None
        self._last_req_seq = 0
        self._last_req_pid: int | None = None
        self._skip_counted: dict[str, float] = {}
        self._inflight: set[asyncio.Task] = set()
        self._stop = asyncio.Event()
        self._server: HTTPServer | None = None
        self._client = None
        self.registry = make_registry(self.metrics_view)
        self.ticks = 0
        self.port = config.port

    # -- state for metrics ----------------------------------------------------------------

    def metrics_view(self) -> MetricsView:
        s = self.snapshot
        if s is not None:
            policy, mode = s.policy, s.mode
        else:
            env = (self.cfg.policy_env or "").strip().lower()
            policy, mode = (env or "off"), "stock"
        with self._lock():
            reused = self.tracker.reused_after_eviction
            removed = self.tracker.removed_blocks
        ev = dict(s.counters.get("evictions", {})) if s is not None else {}
        if not ev and removed:
            ev = {"lru": removed}  # stock engine: every eviction is LRU
        return MetricsView(
            model_name=self.model_name or "", policy=policy, mode=mode,
            config_generation=self._generation_in_force(s),
            evictions={k: int(v) for k, v in ev.items()}, evictions_reused=reused,
            protected_blocks=s.protected_blocks if s else {"anchor": 0, "session": 0},
            predictions=dict(s.counters.get("predictions", {})) if s else {},
            predictability=s.predictability if s else 0.0,
            warmups={**self.warmups, "used": self.ledger.used, "wasted": self.ledger.wasted},
            policy_errors=int(s.counters.get("policy_errors", 0)) if s else 0,
            decision_seconds=s.decision_seconds if s else None,
            access_log_records=self.access_log.kept,
            tiering=s.tiering if s else None)

    def _generation_in_force(self, s) -> int:
        """The engine's generation when its plugin runs a policy (it may have rejected a
        newer file), else the generation this sidecar read."""
        if s is not None and s.mode == "active" and self.fresh():
            return int(s.config_generation)
        return int(self.config_generation or (s.config_generation if s else 0))

    def _lock(self):
        return self.subscriber.lock if self.subscriber is not None else contextlib.nullcontext()

    def fresh(self, now_s: float | None = None) -> bool:
        s = self.snapshot
        now = time.time() if now_s is None else now_s
        return s is not None and now - s.written_s <= self.cfg.snapshot_max_age_s

    def ready(self, now_s: float | None = None) -> tuple[bool, str]:
        """Engine answering, and (with a policy configured) a fresh plugin snapshot. A
        plugin that never wrote one within ``snapshot_grace_s`` of the engine being up
        left vLLM stock (unsupported version, bad policy): the replica still serves."""
        if not self.engine_ok:
            return False, "engine not answering"
        now = time.time() if now_s is None else now_s
        policy = (self.cfg.policy_env or "").strip().lower()
        if policy not in ("", "off", "none", "stock") and not self.fresh(now):
            if (self.snapshot is None and self._engine_up_s is not None
                    and now - self._engine_up_s >= self.cfg.snapshot_grace_s):
                return True, "ok (no plugin snapshot: the engine runs stock)"
            return False, f"no fresh plugin snapshot at {self.state_file}" + (
                f" ({self.snapshot_error})" if self.snapshot_error else "")
        return True, "ok"

    # -- one tick -------------------------------------------------------------------------

    async def _engine(self) -> None:
        c = self._client
        try:
            r = await c.get(self.cfg.engine_url + "/metrics", timeout=5.0)
            r.raise_for_status()
            self.running, self.waiting = parse_engine_load(r.text)
            if self.model_name is None:
                m = await c.get(self.cfg.engine_url + "/v1/models", timeout=5.0)
                m.raise_for_status()
                data = m.json().get("data") or []
                if data:
                    self.model_name = str(data[0]["id"])
            if not self.engine_ok:
                self._engine_up_s = time.time()
            self.engine_ok = True
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            if self.engine_ok:
                log.warning("engine %s not answering: %s", self.cfg.engine_url, exc)
            self.engine_ok = False

    def _read_snapshot(self) -> None:
        try:
            s = read_snapshot(self.state_file)
            self.snapshot_error = None
        except StateError as exc:
            self.snapshot_error = str(exc)
            log.warning("%s", exc)
            return
        if s is None:
            return
        self.snapshot = s
        if s.pid != self._last_req_pid:  # engine restarted: sequence numbers restart
            self._last_req_pid, self._last_req_seq = s.pid, 0
        for r in s.requests:
            seq = int(r.get("seq", 0))
            if seq <= self._last_req_seq:
                continue
            self._last_req_seq = seq
            hids = [int(h) for h in r.get("hash_ids") or []]
            self.access_log.offer(float(r.get("t", 0.0)), hids,
                                  input_length=int(r.get("input_length", 0)),
                                  output_length=int(r.get("output_length") or 0),
                                  session_id=r.get("session_id"), tenant=r.get("tenant"),
                                  tool_name=r.get("tool_name"), tool_args=r.get("tool_args"),
                                  agent=r.get("agent"))

    def _reload_config(self) -> None:
        path = self.cfg.config_path
        if not path:
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        version = (st.st_mtime_ns, st.st_size, st.st_ino)  # a ConfigMap update swaps a link
        if version == self._config_mtime:
            return
        self._config_mtime = version
        try:
            gen, over = read_config_file(path)
            wc = dataclasses.replace(self.cfg.warmup, **over)
        except (OSError, ValueError, TypeError) as exc:
            log.warning("config %s not applied: %s", path, exc)
            return
        self.config_generation = gen
        if wc != self.scheduler.config:
            self.scheduler.reconfigure(wc)
        log.info("config %s generation %d in force (warm-ups %s, %g/s, R_min %g)", path, gen,
                 "on" if wc.enabled else "off", wc.rate_per_s, wc.r_min)

    def _anchor_of(self, s: Snapshot, agent: str) -> tuple[list[int], int | None, str | None]:
        a = s.anchors.get(agent)
        if a is None:
            return [], None, None
        toks = a["token_ids"]
        return toks, anchor_key(toks, s.block_size), a.get("hint")

    async def tick(self) -> None:
        self.ticks += 1
        self._reload_config()
        await self._engine()
        self._read_snapshot()
        now = time.time()
        s = self.snapshot
        with self._lock():
            self.ledger.resolve(s, self.tracker, now)
        if s is None or not self.fresh(now) or not self.engine_ok or self.model_name is None:
            return
        for r in self.due_reloads(s, now):
            t = asyncio.create_task(self._reload(r))
            self._inflight.add(t)
            t.add_done_callback(self._inflight.discard)
        known, cached = [], []
        with self._lock():
            for agent in s.anchors:
                _, key, _ = self._anchor_of(s, agent)
                if key is None:
                    continue
                known.append(agent)
                if self.tracker.is_cached(key) or agent in self.ledger.pending:
                    cached.append(agent)
        d = self.scheduler.decide(now, running=self.running, waiting=self.waiting,
                                  r=s.predictability, predictions=s.predictions, known=known,
                                  cached=cached)
        cd = self.scheduler.config.cooldown_s
        for agent, reason in d.skipped.items():
            if reason in COUNTED_SKIPS and now - self._skip_counted.get(agent, -math.inf) >= cd:
                self._skip_counted[agent] = now
                self.warmups["skipped"] += 1
        if len(self._skip_counted) > 4096:
            self._skip_counted.clear()
        for agent in d.warm:
            toks, key, hint = self._anchor_of(s, agent)
            t = asyncio.create_task(self._warm(agent, toks, key, hint))
            self._inflight.add(t)
            t.add_done_callback(self._inflight.discard)

    def due_reloads(self, s: Snapshot, now_s: float) -> list[dict[str, Any]]:
        """The temporal controller's pending reloads (``tiering.pending_reloads``) whose
        time has come, rate-limited (``anchorage.warmup.ReloadScheduler``)."""
        pending = (s.tiering or {}).get("pending_reloads") or []
        return self.reloads.due(now_s, pending) if pending else []

    async def _send_warmup(self, body: dict[str, Any], counts: dict[str, int],
                           what: str) -> bool:
        """POST one warm-up to the engine, counted in ``counts`` (``issued``, ``failed``);
        a failure is logged, never raised."""
        counts["issued"] += 1
        try:
            resp = await self._client.post(self.cfg.engine_url + "/v1/completions", json=body,
                                           timeout=self.cfg.request_timeout_s)
            resp.raise_for_status()
        except Exception as exc:  # noqa: BLE001
            counts["failed"] += 1
            log.warning("%s failed: %s", what, exc)
            return False
        return True

    async def _reload(self, r: dict[str, Any]) -> None:
        if await self._send_warmup(reload_body(self.model_name, r), self.reload_warmups,
                                   f"reload warm-up for session {r.get('session')}"):
            log.debug("reloaded session %s (%d tokens)", r.get("session"),
                      len(r["token_ids"]))

    async def _warm(self, agent: str, token_ids: list[int], key: int, hint: str | None) -> None:
        body = {"model": self.model_name, "prompt": token_ids, "max_tokens": 1,
                "vllm_xargs": {"anchorage.warmup": 1, "anchorage.agent": hint or agent}}
        if not await self._send_warmup(body, self.warmups, f"warm-up for {agent}"):
            return
        self.ledger.add(agent, key, time.time())
        log.debug("warmed %s (%d tokens)", agent, len(token_ids))

    # -- HTTP (node_agent.endpoints) ------------------------------------------------------

    def access_log_text(self, drain: bool) -> str:
        """The access log as anchorage-trace/v1 JSONL (header line, then records); ``drain``
        empties the buffer."""
        recs = self.access_log.drain() if drain else self.access_log.snapshot()
        bs = self.snapshot.block_size if self.snapshot and self.snapshot.block_size else (
            self.access_log.config.block_size)
        return dumps_trace(recs, TraceHeader(block_size=bs,
                                             source="anchorage node-agent access log"))

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        import httpx

        if self.subscriber is not None:
            self.subscriber.start()
        try:
            write_settings(self.cfg.state_dir,
                           access_log_sample_rate=self.cfg.access_log.sample_rate)
        except OSError as exc:
            log.warning("cannot write settings to %s: %s", self.cfg.state_dir, exc)
        self._server = HTTPServer(build_app(self), self.cfg.host, self.cfg.port)
        self.port = self._server.port
        self._client = httpx.AsyncClient()
        await self._server.start()
        log.info("node agent on http://%s:%d (engine %s, KV events %s, state %s)",
                 self.cfg.host, self.port, self.cfg.engine_url, self.cfg.kv_events,
                 self.state_file)

    async def run_loop(self) -> None:
        while not self._stop.is_set():
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - keep serving metrics and health
                log.exception("tick failed")
            try:
                await asyncio.wait_for(self._stop.wait(), self.cfg.tick_s)
            except asyncio.TimeoutError:
                pass

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        self._stop.set()
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=5)
        if self._server is not None:
            await self._server.stop()
        if self._client is not None:
            await self._client.aclose()
        if self.subscriber is not None:
            self.subscriber.stop()

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT (or ``request_stop``), then shut down cleanly."""
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):
                pass
        try:
            await self.run_loop()
        finally:
            await self.stop()
            log.info("node agent stopped")
