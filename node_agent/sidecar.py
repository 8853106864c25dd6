"""The node-agent sidecar: warm-ups, metrics, access log, health, config reload.

Runs next to one engine (asyncio, one process). Every ``tick_s``, in this order:

1. re-reads ``ANCHORAGE_CONFIG`` when it changed (``node_agent.sidecar_config``);
2. ``_scrape_engine``: the engine's load (``vllm:num_requests_running`` /
   ``vllm:num_requests_waiting`` from its ``/metrics``) and served model
   (``node_agent.engine_client``);
3. ``_read_snapshot``: the plugin's snapshot (``node_agent.snapshot``), whose sampled
   requests go into the access log (``node_agent.access_log``);
4. ``_follow_config``: puts in force the warm-up knobs of the document whose generation
   the engine runs (its snapshot's ``config_generation``; with no plugin, the latest
   document read); while a plugin is expected but has not written a fresh snapshot,
   nothing changes;
5. resolves pending warm-ups (``node_agent.ledger.WarmupLedger``: used or wasted);
6. ``_send_reloads``: the temporal controller's and the host tier's reloads that are due
   (``tiering.pending_reloads``, ``host_tier.json``'s ``pending_reloads``;
   ``anchorage.warmup.ReloadScheduler``: the session's last
   prompt, ``max_tokens`` = 1, ``anchorage.warmup`` = 1, its session id and cache salt);
7. ``_send_warmups``: asks ``anchorage.warmup.WarmupScheduler`` which predicted agents to
   warm (anchors known from the plugin's registry; cached ones, from the engine's KV
   events, are skipped) and sends each as ``POST /v1/completions`` with ``prompt`` = the
   anchor's token ids, ``max_tokens`` = 1, ``vllm_xargs`` ``{"anchorage.warmup": 1,
   "anchorage.agent": ...}`` and the anchor's ``cache_salt`` (``anchorage.warmup.anchor_body``;
   docs/request-metadata.md).

Steps 6 and 7 need the engine answering; step 7 and the temporal controller's reloads a
fresh plugin snapshot (the host tier's reloads come with their own file, checked for age).

HTTP (bound to 127.0.0.1 unless told otherwise): ``/metrics``, ``/healthz`` (the loop
runs), ``/readyz`` (the engine answered and the snapshot is fresh; with the plugin off,
the engine alone); with ``access_log_port``, the access log on that port, behind the
operator's token (anchorage-trace/v1 JSONL; ``POST .../drain`` empties it); the tables of
answers are in ``node_agent.endpoints``. SIGTERM/SIGINT stop it gracefully.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from typing import Any

from anchorage.warmup import ReloadScheduler, WarmupScheduler, anchor_body, reload_body
from anchorage.node_agent.access_log import AccessLogFeed
from anchorage.node_agent.endpoints import HTTPServer, build_access_log_app, build_app
from anchorage.node_agent.engine_client import EngineClient
from anchorage.node_agent.kv_events import CacheTracker, KVEventSubscriber, anchor_key
from anchorage.node_agent.ledger import WarmupLedger
from anchorage.node_agent.metrics import MetricsView, make_registry
from anchorage.node_agent.offload.tracker import read_host_tier
from anchorage.node_agent.sidecar_config import ConfigFollower, SidecarConfig
from anchorage.node_agent.snapshot import (Anchor, Snapshot, StateError, read_snapshot,
                                           state_path, write_settings)

log = logging.getLogger("anchorage.node_agent.sidecar")

# skip reasons that mean "a warm-up was wanted and not sent" (the others are not wanted)
COUNTED_SKIPS = ("engine_busy", "unpredictable", "rate_limited", "tick_limit", "disabled")


class Sidecar:
    def __init__(self, config: SidecarConfig):
        self.cfg = config
        self.state_file = state_path(config.state_dir)
        self.tracker = CacheTracker(horizon_s=config.horizon_s)
        self.subscriber = (KVEventSubscriber(config.kv_events, self.tracker, config.kv_topic)
                           if config.kv_events else None)
        self.scheduler = WarmupScheduler(config.warmup)
        self.ledger = WarmupLedger(config.horizon_s)
        self.access_log = AccessLogFeed(config.access_log)
        self.config = ConfigFollower(config.config_path, config.warmup)
        self.model_name = config.model_name
        self.snapshot: Snapshot | None = None
        self.snapshot_error: str | None = None
        self.host_tier: dict[str, Any] | None = None  # the host tier's snapshot (offload)
        self.engine_ok = False
        self._engine_up_s: float | None = None
        self.running = self.waiting = 0
        self.warmups = {"issued": 0, "skipped": 0, "failed": 0}
        self.reloads = ReloadScheduler(config.reload)
        self.reload_warmups = {"issued": 0, "failed": 0}
        self._skip_counted: dict[str, float] = {}
        self._inflight: set[asyncio.Task] = set()
        self._stop = asyncio.Event()
        self._server: HTTPServer | None = None
        self._log_server: HTTPServer | None = None
        self._client: EngineClient | None = None
        self.registry = make_registry(self.metrics_view)
        self.ticks = 0
        self.port = config.port
        self.access_log_port = config.access_log_port

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
        ev = dict(s.counters.evictions) if s is not None else {}
        if not ev and removed:
            ev = {"lru": removed}  # stock engine: every eviction is LRU
        return MetricsView(
            model_name=self.model_name or "", policy=policy, mode=mode,
            config_generation=self._generation_in_force(s),
            config_rejected=self._config_rejected(s),
            evictions=ev, evictions_reused=reused,
            protected_blocks=s.protected_blocks if s else {"anchor": 0, "session": 0},
            predictions=dict(s.counters.predictions) if s else {},
            predictability=s.predictability if s else 0.0,
            warmups={**self.warmups, "used": self.ledger.used, "wasted": self.ledger.wasted},
            policy_errors=s.counters.policy_errors if s else 0,
            decision_seconds=s.decision_seconds if s else None,
            access_log_records=self.access_log.kept,
            tiering=s.tiering if s else None, host_tier=self.host_tier)

    @property
    def config_generation(self) -> int:
        """The generation of the document whose warm-up settings are in force."""
        return self.config.generation

    def _plugin_reports(self, s: Snapshot | None, now_s: float | None = None) -> bool:
        """A fresh snapshot of a plugin that runs a policy: the engine's word counts."""
        return s is not None and s.mode == "active" and self.fresh(now_s)

    def _generation_in_force(self, s: Snapshot | None) -> int:
        """The engine's generation when its plugin runs a policy, else this sidecar's."""
        return s.config_generation if self._plugin_reports(s) else self.config.generation

    def _config_rejected(self, s: Snapshot | None) -> int:
        """Versions of ``ANCHORAGE_CONFIG`` refused: the engine's count when its plugin runs
        a policy and reports one, else this sidecar's own."""
        if s is not None and s.mode == "active" and s.counters.config_rejected is not None:
            return s.counters.config_rejected
        return self.config.rejected

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
        if self.cfg.policy_configured() and not self.fresh(now):
            if self._never_wrote(now):
                return True, "ok (no plugin snapshot: the engine runs stock)"
            return False, f"no fresh plugin snapshot at {self.state_file}" + (
                f" ({self.snapshot_error})" if self.snapshot_error else "")
        return True, "ok"

    def _never_wrote(self, now_s: float) -> bool:
        """The plugin wrote no snapshot within ``snapshot_grace_s`` of the engine being up:
        it left vLLM stock."""
        return (self.snapshot is None and self._engine_up_s is not None
                and now_s - self._engine_up_s >= self.cfg.snapshot_grace_s)

    # -- one tick -------------------------------------------------------------------------

    async def tick(self) -> None:
        self.ticks += 1
        self.config.poll()
        await self._scrape_engine()
        self._read_snapshot()
        self._read_host_tier()
        now = time.time()
        s = self.snapshot
        self._follow_config(s, now)
        with self._lock():
            self.ledger.resolve(s, self.tracker, now)
        if not self.engine_ok or self.model_name is None:
            return
        fresh = s if self.fresh(now) else None   # (fresh() is False without a snapshot)
        # the host tier's reloads need no fresh plugin snapshot (its own file is checked)
        self._send_reloads(fresh, now)
        if fresh is not None:
            self._send_warmups(fresh, now)

    def _follow_config(self, s: Snapshot | None, now: float) -> None:
        """One source of truth for the generation in force: the engine's."""
        if self._plugin_reports(s, now):
            wc = self.config.follow(s.config_generation)
        elif self.cfg.policy_configured() and not self._never_wrote(now) and not (
                s is not None and s.mode == "stock" and self.fresh(now)):
            return  # a plugin is expected: wait for its word
        else:
            wc = self.config.follow(None)  # no plugin reads the file: the latest document
        if wc is not None and wc != self.scheduler.config:
            self.scheduler.reconfigure(wc)

    async def _scrape_engine(self) -> None:
        c = self._client
        try:
            self.running, self.waiting = await c.load()
            if self.model_name is None:
                self.model_name = await c.model()
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
        self.access_log.take(s)

    def _read_host_tier(self) -> None:
        """The host tier's snapshot (``anchorage.node_agent.offload``), when the engine has
        one; a bad file is logged and the previous one kept."""
        try:
            h = read_host_tier(self.cfg.state_dir)
        except ValueError as exc:
            log.warning("%s", exc)
            return
        if h is not None:
            self.host_tier = h

    def _spawn(self, coro) -> None:
        t = asyncio.create_task(coro)
        self._inflight.add(t)
        t.add_done_callback(self._inflight.discard)

    def _send_reloads(self, s: Snapshot | None, now: float) -> None:
        for r in self.due_reloads(s, now):
            self._spawn(self._reload(r))

    def _send_warmups(self, s: Snapshot, now: float) -> None:
        known, cached = [], []
        with self._lock():
            for a in s.anchors:
                key = self._anchor_key(s, a)
                if key is None:
                    continue
                known.append(a.agent)
                if self.tracker.is_cached(key) or a.agent in self.ledger.pending:
                    cached.append(a.agent)
        d = self.scheduler.decide(now, running=self.running, waiting=self.waiting,
                                  r=s.predictability,
                                  predictions=[(p.agent, p.probability) for p in s.predictions],
                                  known=known, cached=cached)
        cd = self.scheduler.config.cooldown_s
        for agent, reason in d.skipped.items():
            if reason in COUNTED_SKIPS and now - self._skip_counted.get(agent, -math.inf) >= cd:
                self._skip_counted[agent] = now
                self.warmups["skipped"] += 1
        if len(self._skip_counted) > 4096:
            self._skip_counted.clear()
        for agent in d.warm:
            a = s.anchor_by_agent[agent]
            self._spawn(self._warm(a, self._anchor_key(s, a)))

    @staticmethod
    def _anchor_key(s: Snapshot, a: Anchor) -> int | None:
        return anchor_key(a.token_ids, s.block_size, a.cache_salt)

    def due_reloads(self, s: Snapshot | None, now_s: float) -> list[dict[str, Any]]:
        """The temporal controller's pending reloads (``tiering.pending_reloads``, and the
        host tier's just-in-time ones) whose time has come, rate-limited
        (``anchorage.warmup.ReloadScheduler``)."""
        pending = ([r.to_json() for r in (s.tiering.pending_reloads or ())]
                   if s is not None and s.tiering else [])
        h = self.host_tier  # the host tier's, from a fresh file of its own
        if h is not None and now_s - h["written_s"] <= self.cfg.snapshot_max_age_s:
            pending += h["pending_reloads"]
        return self.reloads.due(now_s, pending) if pending else []

    async def _send_warmup(self, body: dict[str, Any], counts: dict[str, int],
                           what: str) -> bool:
        """POST one warm-up to the engine, counted in ``counts`` (``issued``, ``failed``);
        a failure is logged, never raised."""
        counts["issued"] += 1
        try:
            await self._client.complete(body)
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

    async def _warm(self, a: Anchor, key: int) -> None:
        body = anchor_body(self.model_name, a.token_ids, a.hint or a.agent, a.cache_salt,
                           a.tenant)
        if not await self._send_warmup(body, self.warmups, f"warm-up for {a.agent}"):
            return
        self.ledger.add(a.agent, key, time.time())
        log.debug("warmed %s (%d tokens)", a.agent, len(a.token_ids))

    # -- HTTP (node_agent.endpoints) ------------------------------------------------------

    def access_log_text(self, drain: bool) -> str:
        """The access log as anchorage-trace/v1 JSONL; ``drain`` empties the buffer."""
        return self.access_log.text(drain, self.snapshot.block_size if self.snapshot else None)

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self.subscriber is not None:
            self.subscriber.start()
        try:
            write_settings(self.cfg.state_dir,
                           access_log_sample_rate=self.cfg.access_log.sample_rate)
        except OSError as exc:
            log.warning("cannot write settings to %s: %s", self.cfg.state_dir, exc)
        self._server = HTTPServer(build_app(self), self.cfg.host, self.cfg.port)
        self.port = self._server.port
        if self.cfg.access_log_port is not None:
            try:
                self._log_server = HTTPServer(
                    build_access_log_app(self, self.cfg.access_log_token), self.cfg.host,
                    self.cfg.access_log_port)
            except OSError:
                self._server.close()
                raise
            self.access_log_port = self._log_server.port
        self._client = EngineClient(self.cfg.engine_url, self.cfg.request_timeout_s)
        await self._server.start()
        if self._log_server is not None:
            await self._log_server.start()
        log.info("node agent on http://%s:%d (engine %s, KV events %s, state %s, access log "
                 "%s)", self.cfg.host, self.port, self.cfg.engine_url, self.cfg.kv_events,
                 self.state_file, f"on port {self.access_log_port}"
                 if self._log_server is not None else "not served")

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
        for server in (self._server, self._log_server):
            if server is not None:
                await server.stop()
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
