"""Applying a changed ``ANCHORAGE_CONFIG`` inside the engine: a fresh policy, swapped in safely.

Specification
-------------
One ``PolicyReloader`` per policy-driven ``BlockPool`` (built by the block-pool patch when
``ANCHORAGE_CONFIG`` is set). ``maybe_reload()`` is called at the start of every
scheduling attempt (``KVCacheManager.get_computed_blocks``, before the request's prefix
lookup) and, so that an idle engine applies a new document too, at the engine core's idle
tick (``node_agent.idle_reload``: the same engine-core thread, between two steps), never
per block; it costs one clock read and one comparison unless the check
interval (``ANCHORAGE_CONFIG_CHECK_S``, default 5 s) has passed, and then one ``stat``
unless the file changed (``node_agent.config.ConfigWatcher``).

When the file changed and parses (``node_agent.config``):

- same policy and parameters, new generation: the generation in force changes, nothing else;
- otherwise a fresh policy is built exactly as at engine start
  (``node_agent.tiering.build_policy``: ``make_policy(name, block_size=<pool's>,
  params=<params>)``, wrapped for tiering when ``ANCHORAGE_TIERING=spatial``); if the policy rejects the parameters (``TypeError``/``ValueError``), one warning
  and the previous policy and generation stay in force.

The swap (``migrate``) happens there, at the start of a scheduling attempt: the pool is
consistent (no allocation or free is in progress) and this is the same point where a new
request reaches the policy. The new policy starts from the pool's present state, as at an
engine start whose cache is already warm:

1. it is told of every request the engine still has in flight (``on_request`` with the
   same contexts), so their later hits, caches, frees and completions are its own;
2. every cached block (free or in use) is announced with ``on_cached`` under an anonymous
   context (a request-less group: blocks filled before the swap), then the cached *free*
   blocks with ``on_freed`` in vLLM's free-queue order (oldest first), so the new policy
   starts from vLLM's LRU order and re-groups a block when a request hits it;
3. the node state, the snapshot exporter (now reading the new policy) and the error
   counters carry over; the exporter reports the new generation and policy name.

Every version not applied (the parser's ``ConfigError``, parameters the policy rejects, a
failed swap) is counted by the watcher (``ConfigWatcher.rejected``); the exporter reports
the count as ``counters.config_rejected`` (the sidecar's ``anchorage_config_rejected_total``).

What the old policy learned (gap histograms, transitions, fingerprints) is not carried:
a parameter change restarts learning. The swap walks the block table once (O(blocks),
milliseconds for 10^5 blocks), only when a config is applied. Any exception during the
swap: one warning, the old driver stays attached, the generation in force is unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from anchorage.node_agent import vllm_compat as vc
from anchorage.node_agent.config import ConfigWatcher, PolicyConfig

log = logging.getLogger("anchorage.node_agent")


def migrate(pool: Any, policy: Any, old: Any = None) -> Any:
    """Attach ``policy`` to ``pool`` in place of driver ``old`` (or of none) and return the
    new ``PolicyDriver`` (see the module's specification)."""
    from anchorage.node_agent.request_context import anonymous_context
    from anchorage.node_agent.vllm_block_pool import PolicyDriver

    new = PolicyDriver(pool, policy)
    if old is not None:
        new.state, new.exporter, new.errors = old.state, old.exporter, old.errors
        new._decisions = old._decisions
        for rid, c in old.contexts.items():
            new.contexts[rid] = c
            new.notify(policy.on_request, c)
    ids, keys = [], []
    for b in vc.pool_blocks(pool):
        if b.block_hash is not None and not b.is_null:
            ids.append(b.block_id)
            keys.append(b.block_hash)
    anon = anonymous_context()
    if ids:
        new.notify(policy.on_cached, anon, ids, keys, 0)
    free = vc.cached_free_block_ids(pool)
    if free:
        new.hand_over(anon, free)
    new.migrated = {"in_flight": len(new.contexts), "cached": len(ids), "free": len(free)}
    vc.set_driver(pool, new)
    return new


class PolicyReloader:
    """Watches ``ANCHORAGE_CONFIG`` for one pool and applies new versions (never raises)."""

    def __init__(self, pool: Any, watcher: ConfigWatcher, current: PolicyConfig,
                 clock: Callable[[], float] = time.monotonic):
        self.pool = pool
        self.watcher = watcher
        self.current = current
        self.clock = clock
        self.applied = 0  # configs applied after the start (policy rebuilt or generation)
        exporter = getattr(self._driver(), "exporter", None)
        if exporter is not None:
            exporter.config_generation = self.generation
            exporter.config_rejected = self.rejected
            exporter.policy_name = current.name

    def generation(self) -> int:
        return self.current.generation

    def rejected(self) -> int:
        """Versions refused since the engine started (at start too: the watcher is the
        start's, copied)."""
        return self.watcher.rejected

    def _driver(self) -> Any:
        return vc.driver(self.pool)

    def maybe_reload(self) -> bool:
        """True when a new config was put in force by this call."""
        now = self.clock()
        if not self.watcher.due(now):
            return False
        try:
            cfg = self.watcher.poll(now)
            if cfg is None or cfg == self.current:
                return False
            return self.apply(cfg)
        except Exception as exc:  # never break serving for a config
            self.watcher.rejected += 1
            log.warning("anchorage: config %s not applied (%s: %s); the previous config "
                        "stays in force", self.watcher.path, exc.__class__.__name__, exc,
                        exc_info=True)
            return False

    def apply(self, cfg: PolicyConfig) -> bool:
        old = self._driver()
        if old is not None and cfg.name == self.current.name and cfg.params == self.current.params:
            self.current = cfg
            self.applied += 1
            log.info("anchorage: config %s generation %d in force (same policy %r and "
                     "parameters)", self.watcher.path, cfg.generation, cfg.name)
            return True
        from anchorage.node_agent.tiering import build_policy  # as at start (+ tiering)

        try:
            policy = build_policy(cfg.name, vc.hash_block_size(self.pool), cfg.params)
        except (TypeError, ValueError) as exc:
            self.watcher.warn_rejected(f"policy {cfg.name!r} rejects its parameters "
                                       f"{sorted(cfg.params)}: {exc}")
            return False
        try:
            new = migrate(self.pool, policy, old)
        except Exception as exc:  # noqa: BLE001
            vc.set_driver(self.pool, old)
            self.watcher.warn_rejected(f"swapping in the new policy failed: "
                                       f"{exc.__class__.__name__}: {exc}")
            return False
        if new.exporter is not None:
            new.exporter.source = policy
            new.exporter.policy_name = cfg.name
            new.exporter.config_generation = self.generation
            if cfg.name != self.current.name:
                from anchorage.node_agent.exporter import block_pool_stats

                new.exporter.stats = block_pool_stats(cfg.name)
        prev = self.current
        self.current = cfg
        self.applied += 1
        log.info("anchorage: config %s generation %d in force: policy %r with %s (was %r "
                 "generation %d; took over %s)", self.watcher.path, cfg.generation, cfg.name,
                 cfg.params or "its defaults", prev.name, prev.generation, new.migrated)
        return True
