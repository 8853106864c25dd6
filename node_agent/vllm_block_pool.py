"""The policy driver: connects one vLLM ``BlockPool`` to one eviction policy.

It changes one decision and nothing else: which cached free blocks
``BlockPool.get_new_blocks`` evicts (``PolicyDriver.order_victims``). The replaced vLLM
methods that call it are ``node_agent.vllm_hooks``; what the plugin knows of vLLM's
internals is ``node_agent.vllm_compat``.

Mechanics, for a pool with a driver attached (``attach``):

- ``get_new_blocks(n)``: the uncached free blocks at the head of the free queue go first,
  as in stock vLLM (freed uncached blocks are prepended there). For the rest the policy
  names victims; each is checked (a free, non-null block in the queue, not named twice)
  and the chosen blocks are moved to the head of the free queue behind the uncached ones
  (``FreeKVCacheBlockQueue.remove`` is O(1)). Then vLLM's own ``get_new_blocks`` runs and
  pops exactly those blocks, with its own post-processing: hash removal and
  ``BlockRemoved`` events (``_maybe_evict_cached_block``), reference counts, metrics,
  reuse watchers.
- The policy's view: it holds as evictable exactly the pool's free blocks that have a
  hash. The hooks keep that true: a block is handed over (``on_freed``) when it becomes a
  free cached block (``free_blocks``, ``unpin_blocks``, a free block that gains a hash) and
  withdrawn (``on_hit``, ``were_free``) when it stops being one (``touch``, a free block
  that loses its hash: ``evict_blocks``, ``cache_partial_block``, ``move_block_hashes``);
  ``on_cached`` / ``on_evicted`` follow every key a block gains or loses; ``reset``
  follows ``reset_prefix_cache``. Each with the ``RequestContext`` of the request whose
  blocks move.
- Requests: the policy hears of a request (``on_request``) at its first scheduling attempt
  (``KVCacheManager.get_computed_blocks`` / ``get_computed_blocks_for_connector``), or,
  when vLLM skips the lookup, the first time its blocks move (``allocate_slots``,
  ``cache_full_blocks``, ``free``); ``on_request_done`` when its blocks are freed
  (``free``) or handed to vLLM's deferred free (``pop_blocks_for_free``). Frees the engine
  makes without a request in hand carry an anonymous context.

Failure containment: an exception raised by the policy, or a victim that is not a valid
free block, is counted (``STATS.errors``, exported as ``anchorage_policy_errors_total``)
and that decision is stock: victims the policy handed over but were not used are given
back (``on_freed``), and blocks evicted in stock order are withdrawn from the policy
(``on_hit`` with no hits) so the two views do not drift apart. vLLM's correctness never
depends on the policy; at worst eviction is stock LRU.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from anchorage.node_agent import vllm_compat as vc
from anchorage.node_agent.request_context import anonymous_context, context_of
from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.pool.block_pool import batch_victims

log = logging.getLogger("anchorage.node_agent")

MAX_CONTEXTS = 8192  # live requests whose context is kept (bounded against leaks)


@dataclass
class DriverStats:
    victims: int = 0  # cached blocks evicted in the policy's order
    stock_victims: int = 0  # cached blocks evicted in stock order (policy error or none left)
    errors: int = 0  # exceptions raised by the policy, invalid victims


STATS = DriverStats()  # process-wide totals (all pools)


class _CachedKeys:
    """``key in view.cached`` over vLLM's prefix-cache map (re-read: reset replaces it)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: Any):
        self._pool = pool

    def get(self, key: Any, default: Any = None) -> Any:
        blk = vc.cached_lookup(self._pool)(key)
        return default if blk is None else blk.block_id

    def __contains__(self, key: Any) -> bool:
        return vc.cached_lookup(self._pool)(key) is not None

    def __len__(self) -> int:
        return vc.num_cached_keys(self._pool)


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
    0 until then, -1 if unknown)."""

    def __init__(self, pool: Any):
        self.capacity_blocks = vc.usable_blocks(pool)
        self.block_size = vc.hash_block_size(pool)
        self.cached = _CachedKeys(pool)
        blocks = vc.pool_blocks(pool)
        self.block_key = _BlockKeys(blocks)
        self.ref_cnt = _RefCnt(blocks)
        self._pool = pool
        self.bytes_per_block = 0

    def waiting_demand(self) -> list[tuple[int, int]] | None:
        """The scheduler's queue, (new blocks, tokens) per request in queue order, when the
        prefix-aware scheduler shows it (``node_agent.scheduler``); else None (unknown)."""
        fn = vc.waiting_demand_source(self._pool)
        return fn() if fn is not None else None

    @property
    def num_free_blocks(self) -> int:
        return vc.num_free_blocks(self._pool)

    def read_block_bytes(self, manager: Any) -> None:
        self.bytes_per_block = vc.kv_block_bytes(vc.kv_cache_config(manager)) or -1

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
        # the blocks the policy holds as evictable: handed over, not yet withdrawn or
        # popped (it is told of no other block, whatever vLLM's own fields say)
        self.evictable: set[int] = set()
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
        """``request``'s context; a request the policy has not heard of yet (vLLM moved
        its blocks without a prefix lookup first) is announced now."""
        c = self.contexts.get(getattr(request, "request_id", None))
        return c if c is not None else self._announce(request)

    def known_ctx(self, request: Any) -> RequestContext:
        """``request``'s context, without announcing a request the policy has not heard
        of (a free of a request vLLM never allocated for)."""
        c = self.contexts.get(getattr(request, "request_id", None))
        return c if c is not None else context_of(request)

    def begin(self, request: Any) -> None:
        """A scheduling attempt for ``request`` (before its prefix lookup). The policy
        hears of a request once per admission: the scheduler retries a waiting request
        that does not fit at every step, and a preempted one comes back after its free."""
        c = self.contexts.get(getattr(request, "request_id", None))
        # still waiting since its last attempt: nothing new to learn
        self.current = c if c is not None else self._announce(request)

    def _announce(self, request: Any) -> RequestContext:
        c = context_of(request)
        self.contexts[c.request_id] = c
        self.contexts.move_to_end(c.request_id)
        if len(self.contexts) > MAX_CONTEXTS:
            self.contexts.popitem(last=False)
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
        return c

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

    # -- the policy's view of the blocks --------------------------------------------------

    def hand_over(self, ctx: RequestContext, ids: list[int]) -> None:
        """``ids`` became free cached blocks (in vLLM's free order): the policy's now."""
        self.evictable.update(ids)
        self.notify(self.policy.on_freed, ctx, ids)

    def withdraw(self, ctx: RequestContext, ids: Any, hits: list[int] | None = None) -> None:
        """``ids`` stopped being evictable (``hits``: the blocks a request hit, for
        ``on_hit``; without hits the policy is told only when it held one of ``ids``)."""
        ev = self.evictable
        were = []
        for b in ids:  # a block named twice is withdrawn once
            if b in ev:
                ev.remove(b)
                were.append(b)
        if hits is not None or were:
            self.notify(self.policy.on_hit, ctx, hits or [], were)

    def rekey(self, ctx: RequestContext, block: Any, old: Any, start: int) -> None:
        """``block``'s primary key went from ``old`` to its current one (vLLM re-keyed it
        outside an allocation): withdraw / hand over a free block and follow the keys."""
        new = block.block_hash
        if new == old:
            return
        bid = block.block_id
        if old is not None:
            self.withdraw(ctx, (bid,))  # if it was evictable under its old key
            if self.wants_evicted:
                self.notify(self.policy.on_evicted, bid, old)
        if new is not None:
            if self.wants_cached:
                self.notify(self.policy.on_cached, ctx, [bid], [new], start)
            if vc.is_free(block):
                self.hand_over(ctx, [bid])

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

    def _named_victims(self, m: int) -> list:
        if self.pop_victims is not None:  # all at once (order independent of evictions)
            return self.pop_victims(m)
        pop = self.policy.pop_victim
        named = []
        for _ in range(m):
            b = pop()
            if b is None:
                break
            named.append(b)
        return named

    def order_victims(self, n: int) -> None:
        """Put the blocks ``get_new_blocks(n)`` should take at the head of the free
        queue: the uncached head blocks, then the policy's victims. Never raises."""
        pool = self.pool
        if n <= 0 or n > vc.num_free_blocks(pool):
            return  # stock raises for the latter
        uncached = vc.uncached_head(pool, n)
        m = n - len(uncached)
        if m == 0:
            return
        chosen: list = []
        named: list = []
        failed = False
        ev = self.evictable
        try:
            named = self._named_victims(m)
            chosen = vc.free_blocks_named(pool, named)
        except Exception:
            self._error("pop_victim")
            failed = True
            # it forgot what it named; hand back what is still evictable: stock decision
            back = []
            for b in named:
                if type(b) is int and b in ev and b not in back:
                    back.append(b)
            ev.difference_update(b for b in named if type(b) is int)
            if back:
                self.hand_over(self.ctx(), back)
            chosen = []
        if chosen:
            ev.difference_update(named)
            vc.move_to_head(pool, uncached + chosen)
            STATS.victims += len(chosen)
        rest = m - len(chosen)
        if rest:  # stock order takes the rest: the first blocks after ours
            stock = vc.cached_after_head(pool, len(uncached) + len(chosen), rest)
            STATS.stock_victims += len(stock)
            if failed and stock:  # the policy may still hold them as evictable
                self.withdraw(self.ctx(), stock)


def driver(pool: Any) -> PolicyDriver | None:
    """The driver attached to ``pool`` (None: stock eviction)."""
    return vc.driver(pool)


def attach(pool: Any, policy: EvictionPolicy) -> PolicyDriver:
    """Drive ``pool``'s evictions by ``policy`` from now on (its cached free blocks are
    handed to the policy first, oldest first, so it starts from vLLM's current order)."""
    d = PolicyDriver(pool, policy)
    cached_free = vc.cached_free_block_ids(pool)
    if cached_free:
        d.hand_over(anonymous_context(), cached_free)
    vc.set_driver(pool, d)
    return d


def detach(pool: Any) -> None:
    vc.set_driver(pool, None)
