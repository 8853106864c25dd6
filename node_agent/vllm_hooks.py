"""The engine patch: vLLM 0.32's block pool and KV cache manager methods, replaced.

Each function here is the replacement of one row of ``vllm_compat.HOOKS`` (group
``"pool"``), installed by ``install`` and removed by ``uninstall``; each runs vLLM's own
method (``vllm_compat.ORIGINALS``) and tells the pool's ``PolicyDriver``
(``node_agent.vllm_block_pool``, which documents the mechanics) what moved. Pools without
a driver (and the whole engine when the plugin is off) run the unmodified methods.

``install(policy, params, generation=, startup=, watcher=)`` also sets the engine config
new pools are built with (``EngineConfig``: the policy and its parameters, the config
generation in force, the ``ANCHORAGE_CONFIG`` watcher); ``engine_config()`` reads it.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from anchorage.node_agent import vllm_compat as vc
from anchorage.node_agent.request_context import policy_clock
from anchorage.node_agent.vllm_block_pool import STATS, PolicyDriver, attach
from anchorage.policies.base import EvictionPolicy

log = logging.getLogger("anchorage.node_agent")

ENV_STATE_DIR = "ANCHORAGE_STATE_DIR"
DECISION_SAMPLE_EVERY = 64  # decision latency is timed on one call in this many
GROUP = "pool"
_ORIG = vc.ORIGINALS


@dataclass(frozen=True)
class EngineConfig:
    """What a ``BlockPool`` built now gets: ``policy`` (None: no driver) with ``params``;
    ``generation`` of ``ANCHORAGE_CONFIG`` in force, its parsed ``startup`` config and
    ``watcher`` (``node_agent.config``; None without the file)."""

    policy: str | None = None
    params: dict[str, Any] | None = None
    generation: int = 0
    startup: Any = None
    watcher: Any = None


_engine = EngineConfig()


def engine_config() -> EngineConfig:
    return _engine


def configure(cfg: EngineConfig) -> EngineConfig:
    """Set the config new pools get; returns the previous one."""
    global _engine
    prev, _engine = _engine, cfg
    return prev


def unsupported_reason() -> str | None:
    """Why this vLLM cannot be patched (None when it can)."""
    return vc.unsupported_reason(GROUP)


def install(policy: str | None, params: dict[str, Any] | None = None, *,
            generation: int = 0, startup: Any = None, watcher: Any = None) -> None:
    """Patch the classes (once) and set the config new pools get (policy None: none)."""
    configure(EngineConfig(policy, params, generation, startup, watcher))
    vc.install(GROUP)
    if watcher is not None and policy:   # an idle engine checks the file too
        from anchorage.node_agent import idle_reload

        why = vc.unsupported_reason(idle_reload.GROUP)
        if why is None:
            vc.install(idle_reload.GROUP)
        else:
            log.warning("anchorage: %s; ANCHORAGE_CONFIG is checked at scheduling only", why)


def uninstall() -> None:
    """Give vLLM its own methods back (what an engine without the plugin runs)."""
    from anchorage.node_agent import idle_reload

    vc.uninstall(GROUP)
    vc.uninstall(idle_reload.GROUP)


def make_configured_policy(pool: Any) -> EvictionPolicy | None:
    """The policy the engine config names, built for ``pool`` (None: no policy)."""
    name = _engine.policy
    if not name:
        return None
    from anchorage.node_agent.tiering import build_policy  # also reload.py's

    return build_policy(name, vc.hash_block_size(pool), _engine.params)


def _start_exporter(pool: Any, driver: PolicyDriver, policy: EvictionPolicy) -> None:
    """Publish the policy's state for the node-agent sidecar (``node_agent/exporter.py``):
    a snapshot file under ``$ANCHORAGE_STATE_DIR``, written by a daemon thread."""
    from anchorage.node_agent.exporter import PolicyStateExporter, block_pool_stats
    from anchorage.node_agent.recorder import NodeState
    from anchorage.node_agent.snapshot import state_path

    name = _engine.policy
    driver.state = NodeState(block_size=vc.hash_block_size(pool))
    driver.exporter = PolicyStateExporter(
        policy, state_path(), node_state=driver.state, stats=block_pool_stats(name),
        policy_name=name, config_generation=lambda: int(_engine.generation or 0)).start()


# -- BlockPool ----------------------------------------------------------------------------


def init(self, *args: Any, **kwargs: Any) -> None:
    _ORIG["BlockPool.__init__"](self, *args, **kwargs)
    vc.set_driver(self, None)
    if not vc.caching_enabled(self) or not _engine.policy:
        return
    try:
        policy = make_configured_policy(self)
        if policy is not None:
            d = attach(self, policy)
            if os.environ.get(ENV_STATE_DIR):
                _start_exporter(self, d, policy)
        if _engine.watcher is not None:  # ANCHORAGE_CONFIG: node_agent/reload.py
            from anchorage.node_agent.reload import PolicyReloader

            vc.set_reloader(self, PolicyReloader(self, copy.copy(_engine.watcher),
                                                 _engine.startup))
    except Exception:
        STATS.errors += 1
        log.warning("anchorage: cannot start policy %r; vLLM stays stock", _engine.policy,
                    exc_info=True)


def get_new_blocks(self, num_blocks: int):
    d = vc.driver(self)
    if d is not None and vc.caching_enabled(self):
        d._decisions += 1
        if d.state is not None and d._decisions % DECISION_SAMPLE_EVERY == 0:
            t0 = time.perf_counter()
            d.order_victims(num_blocks)
            d.state.record_decision(time.perf_counter() - t0)
        else:
            d.order_victims(num_blocks)
    return _ORIG["BlockPool.get_new_blocks"](self, num_blocks)


def touch(self, blocks):
    d = vc.driver(self)
    if d is None:
        return _ORIG["BlockPool.touch"](self, blocks)
    _ORIG["BlockPool.touch"](self, blocks)
    ids = [b.block_id for b in blocks if not b.is_null]
    d.withdraw(d.ctx(), ids, ids)


def _newly_free_cached(pool: Any, blocks: list) -> list[int]:
    """Ids of ``blocks`` that are free cached blocks of ``pool`` after a release, each
    once, where vLLM queued it (its last reference in ``blocks``)."""
    freed: dict[int, None] = {}
    for b in blocks:
        if ((b.pool is None or b.pool is pool) and b.ref_cnt == 0 and not b.is_null
                and b.block_hash is not None):
            freed.pop(b.block_id, None)
            freed[b.block_id] = None
    return list(freed)


def free_blocks(self, ordered_blocks):
    d = vc.driver(self)
    if d is None:
        return _ORIG["BlockPool.free_blocks"](self, ordered_blocks)
    blocks = list(ordered_blocks)
    _ORIG["BlockPool.free_blocks"](self, blocks)
    freed = _newly_free_cached(self, blocks)
    if freed:
        d.hand_over(d.ctx(), freed)


def unpin_blocks(self, blocks, on_reuse):
    """Released blocks join the tail of the free queue, as freed cached blocks do: the
    cached ones are the policy's to order from now on."""
    d = vc.driver(self)
    if d is None:
        return _ORIG["BlockPool.unpin_blocks"](self, blocks, on_reuse)
    blocks = list(blocks)
    _ORIG["BlockPool.unpin_blocks"](self, blocks, on_reuse)
    freed = _newly_free_cached(self, blocks)
    if freed:
        d.hand_over(d.ctx(), freed)


def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, *args,
                      **kwargs):
    d = vc.driver(self)
    if d is None or not (d.wants_cached or d.wants_evicted):
        return _ORIG["BlockPool.cache_full_blocks"](self, request, blocks, num_cached_blocks,
                                                    num_full_blocks, *args, **kwargs)
    new = blocks[num_cached_blocks:num_full_blocks]
    before = [b.block_hash for b in new]
    _ORIG["BlockPool.cache_full_blocks"](self, request, blocks, num_cached_blocks,
                                         num_full_blocks, *args, **kwargs)
    ids, keys = [], []
    for b, h0 in zip(new, before):
        h = b.block_hash
        if b.is_null or h is None or h == h0:
            continue
        if h0 is not None and d.wants_evicted:  # a partial entry promoted to a full one
            d.notify(d.policy.on_evicted, b.block_id, h0)
        ids.append(b.block_id)
        keys.append(h)
    if ids and d.wants_cached:
        d.notify(d.policy.on_cached, d.ctx_for(request), ids, keys, num_cached_blocks)


def cache_partial_block(self, request, block, num_tokens, *args, **kwargs):
    """A partial-prefix entry: a block without a key gets it as its primary key (or its
    keys are replaced); an extra key of a keyed block changes nothing the policy sees."""
    d = vc.driver(self)
    if d is None:
        return _ORIG["BlockPool.cache_partial_block"](self, request, block, num_tokens,
                                                      *args, **kwargs)
    old = block.block_hash
    out = _ORIG["BlockPool.cache_partial_block"](self, request, block, num_tokens, *args,
                                                 **kwargs)
    if block.block_hash != old:
        d.rekey(d.ctx_for(request), block, old, num_tokens // vc.hash_block_size(self) - 1)
    return out


def move_block_hashes(self, src_block, dst_block):
    """Copy-on-write: ``src_block``'s keys move to ``dst_block`` (the cache's private copy)."""
    d = vc.driver(self)
    if d is None:
        return _ORIG["BlockPool.move_block_hashes"](self, src_block, dst_block)
    src_old, dst_old = src_block.block_hash, dst_block.block_hash
    n = src_block.block_hash_num_tokens
    _ORIG["BlockPool.move_block_hashes"](self, src_block, dst_block)
    ctx = d.ctx()
    start = max(0, (n or 0) // vc.hash_block_size(self) - 1)
    d.rekey(ctx, src_block, src_old, start)
    d.rekey(ctx, dst_block, dst_old, start)


def maybe_evict_cached_block(self, block) -> bool:
    d = vc.driver(self)
    if d is None:
        return _ORIG["BlockPool._maybe_evict_cached_block"](self, block)
    key = block.block_hash
    evicted = _ORIG["BlockPool._maybe_evict_cached_block"](self, block)
    if evicted and key is not None:
        # a block the policy still holds (not its victim: a free block losing its key
        # outside an allocation, or taken in stock order) is evictable no more
        if block.block_id in d.evictable:
            d.withdraw(d.ctx(), (block.block_id,))
        if d.wants_evicted:
            d.notify(d.policy.on_evicted, block.block_id, key)
    return evicted


def reset_prefix_cache(self) -> bool:
    ok = _ORIG["BlockPool.reset_prefix_cache"](self)
    d = vc.driver(self)
    if ok and d is not None:
        d.evictable.clear()
        d.notify(d.policy.reset)
    return ok


# -- KVCacheManager -------------------------------------------------------------------------


def _lookup(key: str, manager: Any, request: Any) -> Any:
    pool = vc.manager_pool(manager)
    r = vc.reloader(pool)
    if r is not None:  # a changed ANCHORAGE_CONFIG is applied here, between allocations
        r.maybe_reload()
    d = vc.driver(pool)
    if d is not None:
        if d.view.bytes_per_block == 0:
            d.notify(d.view.read_block_bytes, manager)
        d.begin(request)
    try:
        return _ORIG[key](manager, request)
    finally:
        if d is not None:
            d.current = None


def get_computed_blocks(self, request):
    return _lookup("KVCacheManager.get_computed_blocks", self, request)


def get_computed_blocks_for_connector(self, request):
    return _lookup("KVCacheManager.get_computed_blocks_for_connector", self, request)


def allocate_slots(self, request, *args, **kwargs):
    d = vc.driver(vc.manager_pool(self))
    if d is None:
        return _ORIG["KVCacheManager.allocate_slots"](self, request, *args, **kwargs)
    d.current = d.ctx_for(request)
    try:
        out = _ORIG["KVCacheManager.allocate_slots"](self, request, *args, **kwargs)
    finally:
        d.current = None
    if d.admitting and out is not None:
        d.admitted(request)
    return out


def free(self, request) -> None:
    d = vc.driver(vc.manager_pool(self))
    if d is None:
        return _ORIG["KVCacheManager.free"](self, request)
    c = d.current = d.known_ctx(request)
    c.now_s = policy_clock()  # blocks become free, and the request ends, now
    try:
        _ORIG["KVCacheManager.free"](self, request)
    finally:
        d.current = None
    d.end(request)


def pop_blocks_for_free(self, request):
    """vLLM defers the free of ``request``'s blocks past an in-flight step: the request
    ends now for the policy; its blocks reach the pool later (an anonymous free)."""
    out = _ORIG["KVCacheManager.pop_blocks_for_free"](self, request)
    d = vc.driver(vc.manager_pool(self))
    if d is not None:
        c = d.contexts.get(getattr(request, "request_id", None))
        if c is not None:
            c.now_s = policy_clock()
        d.end(request)
    return out

