"""Policy-ordered eviction inside vLLM 0.32's prefix-cached ``BlockPool`` (the engine patch).

It changes one decision and nothing else: which cached free blocks
``BlockPool.get_new_blocks`` evicts. Everything else stays vLLM's own code.

Mechanics, for a pool with a driver attached (``attach``):

- ``get_new_blocks(n)``: the uncached free blocks at the head of the free queue go first,
  as in stock vLLM (freed uncached blocks are prepended there). For the rest the policy
  names victims; each is checked (a free, non-null block in the queue, not named twice)
  and the chosen blocks are moved to the head of the free queue behind the uncached ones
  (``FreeKVCacheBlockQueue.remove`` is O(1)). Then vLLM's own ``get_new_blocks`` runs and
  pops exactly those blocks, with its own post-processing: hash removal and
  ``BlockRemoved`` events (``_maybe_evict_cached_block``), reference counts, metrics,
  reuse watchers.
- ``touch`` / ``free_blocks`` / ``cache_full_blocks`` / ``_maybe_evict_cached_block`` /
  ``reset_prefix_cache`` run stock, then the policy is told (hit, freed, cached, evicted,
  reset) with the ``RequestContext`` of the request whose blocks move.
- ``KVCacheManager.get_computed_blocks`` / ``allocate_slots`` / ``free`` name that request
  (``get_computed_blocks`` is the policy's ``on_request``, ``free`` its
  ``on_request_done``); frees the engine defers past a step carry an anonymous context.

Failure containment: an exception raised by the policy, or a victim that is not a valid
free block, is counted (``STATS.errors``, exported as ``anchorage_policy_errors_total``)
and that decision is stock: victims the policy handed over but were not used are given
back (``on_freed``), and blocks evicted in stock order are withdrawn from the policy
(``on_hit`` with no hits) so the two views do not drift apart. vLLM's correctness never
depends on the policy; at worst eviction is stock LRU. Pools without a driver (and the
whole engine when the plugin is off) run the unmodified methods.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.pool.block_pool import batch_victims
from anchorage.node_agent.request_context import anonymous_context, context_of, policy_clock

log = logging.getLogger("anchorage.node_agent")

SUPPORTED_PREFIX = "0.32."
ENV_STATE_DIR = "ANCHORAGE_STATE_DIR"
MAX_CONTEXTS = 8192  # live requests whose context is kept (bounded against leaks)


@dataclass
class DriverStats:
    victims: int = 0  # cached blocks evicted in the policy's order
    stock_victims: int = 0  # cached blocks evicted in stock order (policy error or none left)
    errors: int = 0  # exceptions raised by the policy, invalid victims


STATS = DriverStats()  # process-wide totals (all pools)


class InvalidVictim(RuntimeError):
    pass


class _CachedKeys:
    """``key in view.cached`` over vLLM's prefix-cache map (re-read: reset replaces it)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: Any):
        self._pool = pool

    def get(self, key: Any, default: Any = None) -> Any:
        blk = self._pool.cached_block_hash_to_block.get_one_block(key)
        return default if blk is None else blk.block_id

    def __contains__(self, key: Any) -> bool:
        return self._pool.cached_block_hash_to_block.get_one_block(key) is not None

    def __len__(self) -> int:
        return len(self._pool.cached_block_hash_to_block)


class _BlockKeys:
    __slots__ = ("_blocks",)

    def __init__(self, blocks: list):
        self._blocks = blocks

    def __getitem__(self, block_id: int) -> Any:
        return self._blocks[block_id].block_hash


class _RefCnt:
    __slots__ = ("_blocks",)

    def __init__(self, blocks: list):
        self._blocks = blocks

    def __getitem__(self, block_id: int) -> int:
        return self._blocks[block_id].ref_cnt


class PoolView:
    """What a policy may read of the engine's pool: the names of the model pool
    (``anchorage.pool.block_pool.BlockPool``) it uses in the simulator, plus
    ``bytes_per_block`` (all layers; from the KV cache config at the first prefix lookup,
    0 until then, -1 if unreadable)."""

    def __init__(self, pool: Any):
        self.capacity_blocks = pool.num_gpu_blocks - 1  # block 0 is vLLM's null block
        self.block_size = pool.hash_block_size
        self.cached = _CachedKeys(pool)
        self.block_key = _BlockKeys(pool.blocks)
        self.ref_cnt = _RefCnt(pool.blocks)
        self._free_queue = pool.free_block_queue
        self._pool = pool
        self.bytes_per_block = 0

    def waiting_demand(self) -> list[tuple[int, int]] | None:
        """The scheduler's queue, (new blocks, tokens) per request in queue order, when the
        prefix-aware scheduler shows it (``node_agent.scheduler``); else None (unknown)."""
        fn = getattr(self._pool, "_anchorage_waiting_demand", None)
        return fn() if fn is not None else None

    @property
    def num_free_blocks(self) -> int:
        return self._free_queue.num_free_blocks

    def read_block_bytes(self, manager: Any) -> None:
        from anchorage.node_agent.temporal import kv_block_bytes

        self.bytes_per_block = -1
        self.bytes_per_block = kv_block_bytes(manager.kv_cache_config) or -1

    def get_cached_block(self, key: Any) -> int | None:
        return self.cached.get(key)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


class PolicyDriver:
    """Connects one vLLM ``BlockPool`` to one eviction policy."""

    def __init__(self, pool: Any, policy: EvictionPolicy):
        self.pool = pool
        self.policy = policy
        self.view = PoolView(pool)
        self.current: RequestContext | None = None
        self.contexts: OrderedDict[Any, RequestContext] = OrderedDict()
        self.errors = 0
        self.state = None  # node_state.NodeState when the sidecar contract is on
        self.exporter = None
        self._decisions = 0
        # request id -> vLLM arrival time (unix), from the first admission attempt of a
        # request never preempted to its first allocation, for policies with on_admitted
        self.admitting: OrderedDict[Any, float] = OrderedDict()
        policy.attach(self.view)
        # notifications the policy leaves as the base class's no-ops are not sent
        cls = type(policy)
        self.wants_evicted = cls.on_evicted is not EvictionPolicy.on_evicted
        self.wants_cached = cls.on_cached is not EvictionPolicy.on_cached
        self.pop_victims = batch_victims(policy)

    # -- contexts -------------------------------------------------------------------------

    def ctx(self) -> RequestContext:
        return self.current if self.current is not None else anonymous_context()

    def ctx_for(self, request: Any) -> RequestContext:
        rid = getattr(request, "request_id", None)
        c = self.contexts.get(rid)
        if c is None:
            c = self.contexts[rid] = context_of(request)
            if len(self.contexts) > MAX_CONTEXTS:
                self.contexts.popitem(last=False)
        return c

    def begin(self, request: Any) -> None:
        """A scheduling attempt for ``request`` (before its prefix lookup). The policy
        hears of a request once per admission: the scheduler retries a waiting request
        that does not fit at every step, and a preempted one comes back after its free."""
        c = self.contexts.get(getattr(request, "request_id", None))
        if c is not None:  # still waiting since its last attempt: nothing new to learn
            self.current = c
            return
        c = context_of(request)
        self.contexts[c.request_id] = c
        self.contexts.move_to_end(c.request_id)
        if len(self.contexts) > MAX_CONTEXTS:
            self.contexts.popitem(last=False)
        self.current = c
        if (getattr(type(self.policy), "on_admitted", None) is not None
                and not getattr(request, "num_preemptions", 0)):
            t = getattr(request, "arrival_time", None)
            self.admitting[c.request_id] = t if isinstance(t, float) else time.time()
            if len(self.admitting) > MAX_CONTEXTS:
                self.admitting.popitem(last=False)
        self.notify(self.policy.on_request, c)
        if self.state is not None:  # right after on_request: it reads the policy's request
            self.notify(self.state.observe, self.policy, c,
                        getattr(request, "prompt_token_ids", None), None,
                        getattr(request, "cache_salt", None))

    def end(self, request: Any) -> None:
        rid = getattr(request, "request_id", None)
        c = self.contexts.pop(rid, None)
        if self.admitting:
            self.admitting.pop(rid, None)
        if c is not None:
            self.notify(self.policy.on_request_done, c)

    def admitted(self, request: Any) -> None:
        """``request`` got its blocks: its first admission reports the wait since arrival
        (wall clock, as vLLM stamps ``arrival_time``) to the policy's ``on_admitted``."""
        t = self.admitting.pop(getattr(request, "request_id", None), None)
        if t is not None:
            self.notify(self.policy.on_admitted, self.ctx_for(request),
                        max(0.0, time.time() - t))

    # -- failure containment --------------------------------------------------------------

    def _error(self, what: str) -> None:
        self.errors += 1
        STATS.errors += 1
        if self.errors == 1:
            log.warning("anchorage: policy %r raised in %s; stock vLLM behaviour for this "
                        "decision (further errors are counted, logged at debug level)",
                        self.policy.name, what, exc_info=True)
        else:
            log.debug("anchorage: policy %r raised in %s", self.policy.name, what,
                      exc_info=True)

    def notify(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self._error(getattr(fn, "__name__", "notification"))

    # -- the decision ---------------------------------------------------------------------

    def order_victims(self, n: int) -> None:
        """Put the blocks ``get_new_blocks(n)`` should take at the head of the free
        queue: the uncached head blocks, then the policy's victims. Never raises."""
        pool = self.pool
        q = pool.free_block_queue
        if n <= 0 or n > q.num_free_blocks:
            return  # stock raises for the latter
        tail = q.fake_free_list_tail
        by_block = pool.cached_block_hashes_by_block
        uncached = []
        blk = q.fake_free_list_head.next_free_block
        while (len(uncached) < n and blk is not tail and blk.block_hash is None
               and blk.block_id not in by_block):
            uncached.append(blk)
            blk = blk.next_free_block
        m = n - len(uncached)
        if m == 0:
            return
        chosen: list = []
        named: list = []
        failed = False
        try:
            if self.pop_victims is not None:  # all at once (order independent of evictions)
                named = self.pop_victims(m)
            else:
                pop = self.policy.pop_victim
                named = []
                for _ in range(m):
                    b = pop()
                    if b is None:
                        break
                    named.append(b)
            blocks = pool.blocks
            seen: set[int] = set()
            for b in named:
                if type(b) is not int or not 0 < b < len(blocks) or b in seen:
                    raise InvalidVictim(f"victim {b!r}")
                vb = blocks[b]
                if vb.ref_cnt != 0 or vb.is_null or vb.prev_free_block is None:
                    raise InvalidVictim(f"victim {b} is not a free block")
                seen.add(b)
                chosen.append(vb)
        except Exception:
            self._error("pop_victim")
            failed = True
            # hand back what it named and is still evictable: this decision is stock
            back = [v.block_id for v in chosen]
            blocks = pool.blocks
            for b in named[len(chosen) + 1:]:
                if (type(b) is int and 0 < b < len(blocks) and blocks[b].ref_cnt == 0
                        and blocks[b].prev_free_block is not None and b not in back):
                    back.append(b)
            if back:
                self.notify(self.policy.on_freed, self.ctx(), back)
            chosen = []
        if chosen:
            for vb in uncached:
                q.remove(vb)
            for vb in chosen:
                q.remove(vb)
            q.prepend_n(uncached + chosen)
            STATS.victims += len(chosen)
        rest = m - len(chosen)
        if rest:
            # stock order takes the rest: the first blocks after ours
            stock = []
            blk = q.fake_free_list_head.next_free_block
            for _ in range(len(uncached) + len(chosen)):
                blk = blk.next_free_block
            for _ in range(rest):
                if blk is tail:
                    break
                if blk.block_hash is not None:
                    stock.append(blk.block_id)
                blk = blk.next_free_block
            STATS.stock_victims += len(stock)
            if failed and stock:  # the policy may still count them as evictable
                self.notify(self.policy.on_hit, self.ctx(), [], stock)


# -- the patch --------------------------------------------------------------------------------

_ORIG: dict[str, Callable[..., Any]] = {}
_config: dict[str, Any] = {"policy": None, "params": None}


def _driver(pool: Any) -> PolicyDriver | None:
    return getattr(pool, "_anchorage_driver", None)


def unsupported_reason() -> str | None:
    """Why this vLLM cannot be patched (None when it can)."""
    try:
        import vllm
        from vllm.v1.core import block_pool as bp
        from vllm.v1.core import kv_cache_manager as km
        from vllm.v1.core import kv_cache_utils as ku
    except Exception as exc:  # noqa: BLE001 - any import failure means "stay stock"
        return f"vLLM's v1 KV cache cannot be imported ({exc.__class__.__name__}: {exc})"
    version = getattr(vllm, "__version__", "?")
    if not str(version).startswith(SUPPORTED_PREFIX):
        return f"vLLM {version} is not a supported version ({SUPPORTED_PREFIX}x)"
    need = {
        bp.BlockPool: ("__init__", "get_new_blocks", "touch", "free_blocks", "cache_full_blocks",
                       "_maybe_evict_cached_block", "reset_prefix_cache"),
        ku.FreeKVCacheBlockQueue: ("remove", "prepend_n", "popleft_n"),
        km.KVCacheManager: ("get_computed_blocks", "allocate_slots", "free"),
    }
    for cls, names in need.items():
        for name in names:
            if not callable(getattr(cls, name, None)):
                return f"vLLM {version}: {cls.__name__}.{name} is missing"
    return None


def install(policy: str | None, params: dict[str, Any] | None = None) -> None:
    """Patch the classes (once) and set the policy new pools get (None: none)."""
    _config.update(policy=policy, params=params, generation=0, startup=None, watcher=None)
    if _ORIG:
        return
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    for cls, name in ((BlockPool, "__init__"), (BlockPool, "get_new_blocks"),
                      (BlockPool, "touch"), (BlockPool, "free_blocks"),
                      (BlockPool, "cache_full_blocks"),
                      (BlockPool, "_maybe_evict_cached_block"),
                      (BlockPool, "reset_prefix_cache"),
                      (KVCacheManager, "get_computed_blocks"),
                      (KVCacheManager, "allocate_slots"), (KVCacheManager, "free")):
        _ORIG[f"{cls.__name__}.{name}"] = getattr(cls, name)
        setattr(cls, name, _PATCHES[f"{cls.__name__}.{name}"])


def uninstall() -> None:
    """Give vLLM its own methods back (what an engine without the plugin runs)."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    classes = {"BlockPool": BlockPool, "KVCacheManager": KVCacheManager}
    for key, fn in _ORIG.items():
        cls, name = key.split(".")
        setattr(classes[cls], name, fn)
    _ORIG.clear()


def cached_free_block_ids(pool: Any) -> list[int]:
    """``pool``'s free blocks that hold a cached block, in free-queue order (oldest first)."""
    q = pool.free_block_queue
    ids = []
    blk = q.fake_free_list_head.next_free_block
    while blk is not q.fake_free_list_tail:
        if blk.block_hash is not None:
            ids.append(blk.block_id)
        blk = blk.next_free_block
    return ids


def attach(pool: Any, policy: EvictionPolicy) -> PolicyDriver:
    """Drive ``pool``'s evictions by ``policy`` from now on (its cached free blocks are
    handed to the policy first, oldest first, so it starts from vLLM's current order)."""
    driver = PolicyDriver(pool, policy)
    cached_free = cached_free_block_ids(pool)
    if cached_free:
        driver.notify(policy.on_freed, anonymous_context(), cached_free)
    pool._anchorage_driver = driver
    return driver


def detach(pool: Any) -> None:
    pool._anchorage_driver = None


def _make_configured_policy(pool: Any) -> EvictionPolicy | None:
    name = _config["policy"]
    if not name:
        return None
    from anchorage.node_agent.tiering import build_policy  # also reload.py's

    return build_policy(name, pool.hash_block_size, _config["params"])


def _init(self, *args: Any, **kwargs: Any) -> None:
    _ORIG["BlockPool.__init__"](self, *args, **kwargs)
    self._anchorage_driver = None
    if not self.enable_caching or not _config["policy"]:
        return
    try:
        policy = _make_configured_policy(self)
        if policy is not None:
            driver = attach(self, policy)
            if os.environ.get(ENV_STATE_DIR):
                _start_exporter(self, driver, policy)
        if _config.get("watcher") is not None:  # ANCHORAGE_CONFIG: node_agent/reload.py
            import copy

            from anchorage.node_agent.reload import PolicyReloader

            self._anchorage_reloader = PolicyReloader(self, copy.copy(_config["watcher"]),
                                                      _config["startup"])
    except Exception:
        STATS.errors += 1
        log.warning("anchorage: cannot start policy %r; vLLM stays stock", _config["policy"],
                    exc_info=True)


DECISION_SAMPLE_EVERY = 64  # decision latency is timed on one call in this many


def _start_exporter(pool: Any, driver: PolicyDriver, policy: EvictionPolicy) -> None:
    """Publish the policy's state for the node-agent sidecar (``node_agent/state.py``):
    a snapshot file under ``$ANCHORAGE_STATE_DIR``, written by a daemon thread."""
    from anchorage.node_agent.state import (NodeState, PolicyStateExporter, block_pool_stats,
                                            state_path)

    driver.state = NodeState(block_size=pool.hash_block_size)
    driver.exporter = PolicyStateExporter(
        policy, state_path(), node_state=driver.state,
        stats=block_pool_stats(_config["policy"]), policy_name=_config["policy"],
        config_generation=lambda: int(_config.get("generation") or 0)).start()


def _get_new_blocks(self, num_blocks: int):
    d = _driver(self)
    if d is not None and self.enable_caching:
        d._decisions += 1
        if d.state is not None and d._decisions % DECISION_SAMPLE_EVERY == 0:
            t0 = time.perf_counter()
            d.order_victims(num_blocks)
            d.state.record_decision(time.perf_counter() - t0)
        else:
            d.order_victims(num_blocks)
    return _ORIG["BlockPool.get_new_blocks"](self, num_blocks)


def _touch(self, blocks):
    d = _driver(self)
    if d is None:
        return _ORIG["BlockPool.touch"](self, blocks)
    were_free = [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null]
    _ORIG["BlockPool.touch"](self, blocks)
    d.notify(d.policy.on_hit, d.ctx(), [b.block_id for b in blocks if not b.is_null], were_free)


def _free_blocks(self, ordered_blocks):
    d = _driver(self)
    if d is None:
        return _ORIG["BlockPool.free_blocks"](self, ordered_blocks)
    blocks = list(ordered_blocks)
    _ORIG["BlockPool.free_blocks"](self, blocks)
    freed: dict[int, None] = {}
    for b in blocks:  # stock appends a block where its count reaches zero: the last time
        if ((b.pool is None or b.pool is self) and b.ref_cnt == 0 and not b.is_null
                and b.block_hash is not None):
            freed.pop(b.block_id, None)
            freed[b.block_id] = None
    if freed:
        d.notify(d.policy.on_freed, d.ctx(), list(freed))


def _cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks, *args,
                       **kwargs):
    d = _driver(self)
    if d is None or not d.wants_cached:
        return _ORIG["BlockPool.cache_full_blocks"](self, request, blocks, num_cached_blocks,
                                                    num_full_blocks, *args, **kwargs)
    new = blocks[num_cached_blocks:num_full_blocks]
    before = [b.block_hash for b in new]
    _ORIG["BlockPool.cache_full_blocks"](self, request, blocks, num_cached_blocks,
                                         num_full_blocks, *args, **kwargs)
    ids, keys = [], []
    for b, h0 in zip(new, before):
        if not b.is_null and b.block_hash is not None and b.block_hash != h0:
            ids.append(b.block_id)
            keys.append(b.block_hash)
    if ids:
        d.notify(d.policy.on_cached, d.ctx_for(request), ids, keys, num_cached_blocks)


def _maybe_evict_cached_block(self, block) -> bool:
    d = _driver(self)
    key = block.block_hash if d is not None else None
    evicted = _ORIG["BlockPool._maybe_evict_cached_block"](self, block)
    if d is not None and evicted and key is not None and d.wants_evicted:
        d.notify(d.policy.on_evicted, block.block_id, key)
    return evicted


def _reset_prefix_cache(self) -> bool:
    ok = _ORIG["BlockPool.reset_prefix_cache"](self)
    d = _driver(self)
    if ok and d is not None:
        d.notify(d.policy.reset)
    return ok


def _get_computed_blocks(self, request):
    r = getattr(self.block_pool, "_anchorage_reloader", None)
    if r is not None:  # a changed ANCHORAGE_CONFIG is applied here, between allocations
        r.maybe_reload()
    d = _driver(self.block_pool)
    if d is not None:
        if d.view.bytes_per_block == 0:
            d.notify(d.view.read_block_bytes, self)
        d.begin(request)
    try:
        return _ORIG["KVCacheManager.get_computed_blocks"](self, request)
    finally:
        if d is not None:
            d.current = None


def _allocate_slots(self, request, *args, **kwargs):
    d = _driver(self.block_pool)
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


def _free(self, request) -> None:
    d = _driver(self.block_pool)
    if d is None:
        return _ORIG["KVCacheManager.free"](self, request)
    c = d.current = d.ctx_for(request)
    c.now_s = policy_clock()  # blocks become free, and the request ends, now
    try:
        _ORIG["KVCacheManager.free"](self, request)
    finally:
        d.current = None
    d.end(request)


_PATCHES: dict[str, Callable[..., Any]] = {
    "BlockPool.__init__": _init,
    "BlockPool.get_new_blocks": _get_new_blocks,
    "BlockPool.touch": _touch,
    "BlockPool.free_blocks": _free_blocks,
    "BlockPool.cache_full_blocks": _cache_full_blocks,
    "BlockPool._maybe_evict_cached_block": _maybe_evict_cached_block,
    "BlockPool.reset_prefix_cache": _reset_prefix_cache,
    "KVCacheManager.get_computed_blocks": _get_computed_blocks,
    "KVCacheManager.allocate_slots": _allocate_slots,
    "KVCacheManager.free": _free,
}
