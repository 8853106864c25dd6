"""The eviction order with tiering: blocks copied to host memory go first, reserved blocks
of critical agents go last. Wraps any eviction policy (``hybrid`` by default).

Specification
-------------
Every cached free block is in exactly one of three places:

- ``demoted``: blocks whose content is in host memory (an offloaded stalled session):
  evicted first, in the order they were demoted (early eviction, TokenCake's offload:
  losing them costs a reload, not a recomputation);
- ``protected[a]``: up to ``reservation[a]`` free blocks of critical agent ``a`` (the
  spatial policy's reserved pool): evicted only when nothing else is evictable, least
  recently freed first, so other agents cannot take them;
- the wrapped policy: everything else, in the wrapped policy's order.

``on_freed``: a block of an agent with reserved room goes to ``protected`` (up to its
share), else to the wrapped policy. ``set_reservation`` moves protected blocks above a
shrunken share back to the wrapped policy. ``demote(blocks)`` moves cached free blocks
(from wherever they are) to ``demoted``. A hit removes a block from its place. The
wrapped policy sees every notification for the blocks it holds, and a block leaving it
out of order is reported as a hit with no request (``on_hit`` with a request id of
None), which the policies here treat as "no longer free" and learn nothing from.
``agent_of(ctx)`` labels requests (the spatial policy's agent). Costs: O(1) per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

from anchorage.policies.base import EvictionPolicy, RequestContext

_NOBODY = RequestContext(request_id=None, keys=(), input_length=0, warmup=True)


class TieredEviction(EvictionPolicy):
    def __init__(self, inner: EvictionPolicy, agent_of: Callable[[RequestContext], Hashable]):
        self.inner = inner
        self.name = inner.name
        self.agent_of = agent_of
        self.demoted: OrderedDict[int, None] = OrderedDict()
        self.protected: dict[Hashable, OrderedDict[int, None]] = {}
        self.reservation: dict[Hashable, int] = {}
        self._where: dict[int, Hashable] = {}   # protected block -> agent
        self.demoted_evictions = 0
        self.protected_evictions = 0

    def __getattr__(self, name):  # anchor_labels, turnover_s, ... of the wrapped policy
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def attach(self, pool) -> None:
        super().attach(pool)
        self.inner.attach(pool)

    # -- notifications --------------------------------------------------------------------

    def on_request(self, ctx: RequestContext) -> None:
        self.inner.on_request(ctx)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        inner_free = []
        dem, where = self.demoted, self._where
        for b in were_free:
            if b in dem:
                del dem[b]
            elif b in where:
                del self.protected[where.pop(b)][b]
            else:
                inner_free.append(b)
        self.inner.on_hit(ctx, blocks, inner_free)

    def on_cached(self, ctx, blocks, keys, start) -> None:
        self.inner.on_cached(ctx, blocks, keys, start)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        res = self.reservation
        if res:
            a = self.agent_of(ctx)
            room = res.get(a, 0)
            if room:
                q = self.protected.setdefault(a, OrderedDict())
                rest = []
                for b in blocks:
                    if len(q) < room:
                        q[b] = None
                        self._where[b] = a
                    else:
                        rest.append(b)
                blocks = rest
        if blocks:
            self.inner.on_freed(ctx, blocks)

    def on_request_done(self, ctx: RequestContext) -> None:
        self.inner.on_request_done(ctx)

    def on_evicted(self, block: int, key: Hashable) -> None:
        self.inner.on_evicted(block, key)

    # -- tiering --------------------------------------------------------------------------

    def demote(self, blocks: Iterable[int]) -> int:
        """Move cached free blocks to the front of the eviction order; returns how many."""
        ref, bkey = self.pool.ref_cnt, self.pool.block_key
        dem, where = self.demoted, self._where
        from_inner = []
        n = 0
        for b in blocks:
            if ref[b] != 0 or bkey[b] is None or b in dem:
                continue
            if b in where:
                del self.protected[where.pop(b)][b]
            else:
                from_inner.append(b)
            dem[b] = None
            n += 1
        if from_inner:
            self.inner.on_hit(_NOBODY, [], from_inner)
            # a request-less "done" lets a lazy policy settle the groups it just emptied
            self.inner.on_request_done(_NOBODY)
        return n

    def set_reservation(self, shares: dict[Hashable, int], now: float = 0.0) -> None:
        """New reserved shares per agent; protected blocks above a share are released."""
        self.reservation = dict(shares)
        ctx = RequestContext(request_id=None, keys=(), input_length=0, now_s=now,
                             warmup=True)
        for a, q in self.protected.items():
            over = len(q) - shares.get(a, 0)
            if over > 0:
                out = []
                for _ in range(over):
                    b = q.popitem(last=False)[0]
                    del self._where[b]
                    out.append(b)
                self.inner.on_freed(ctx, out)

    def reserved_free(self) -> dict[Hashable, int]:
        return {a: len(q) for a, q in self.protected.items() if q}

    # -- victims --------------------------------------------------------------------------

    def pop_victim(self) -> int | None:
        if self.demoted:
            self.demoted_evictions += 1
            return self.demoted.popitem(last=False)[0]
        b = self.inner.pop_victim()
        if b is not None:
            return b
        best = None
        for a, q in self.protected.items():
            if q:
                best = a
                break
        if best is None:
            return None
        b = self.protected[best].popitem(last=False)[0]
        del self._where[b]
        self.protected_evictions += 1
        return b

    def eviction_order(self) -> Iterable[int]:
        out = list(self.demoted) + list(self.inner.eviction_order())
        for q in self.protected.values():
            out.extend(q)
        return out

    def reset(self) -> None:
        self.demoted.clear()
        self.protected.clear()
        self._where.clear()
        self.inner.reset()
