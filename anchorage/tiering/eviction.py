"""The eviction order with tiering: blocks copied to host memory go first, blocks of short
stalls and reserved blocks of critical agents go last. Wraps any eviction policy
(``hybrid`` by default).

Specification
-------------
Every cached free block is in exactly one of four places:

- ``demoted``: blocks whose content is in host memory (an offloaded stalled session):
  evicted first (early eviction, TokenCake's offload: losing them costs a reload, not a
  recomputation), the furthest predicted reuse first (``demote(blocks, reuse_s)``: when
  the session is expected back; ties, and the default ``inf``, in the order demoted);
- ``protected[a]``: up to ``reservation[a]`` free blocks of critical agent ``a`` (the
  spatial policy's reserved pool): evicted only when nothing else is evictable, least
  recently freed first, so other agents cannot take them;
- ``held``: blocks of a session in a short stall (the gate's ``stall_short``: it is back
  before a round trip to host memory would complete), kept on GPU until ``until_s``
  (``hold(blocks, until_s)``), as TokenCake's non-offloaded agents keep their memory:
  evicted after the wrapped policy's blocks, the earliest deadline first;
  ``release(now)`` hands the blocks whose deadline passed back to the wrapped policy
  (as freed at ``now``);
- the wrapped policy: everything else, in the wrapped policy's order.

``on_freed``: a block of an agent with reserved room goes to ``protected``; a full share
hands its oldest block to the wrapped policy, so the reserve holds the agent's most
recently freed blocks (up to its share; of a chain freed tail first, its head); other
blocks go to the wrapped policy. ``set_reservation`` moves protected blocks above a
shrunken share back to the wrapped policy. ``demote(blocks, reuse_s)`` moves cached free
blocks (from wherever they are) to ``demoted``; demoting a demoted block again re-keys
it. ``hold`` likewise moves blocks from the wrapped policy or ``demoted`` (reserved
blocks stay reserved; holding a held block extends its deadline). Victims: ``demoted``, then the wrapped
policy, then ``held``, then ``protected``. A hit removes a block from its place. The
wrapped policy sees every notification for the blocks it holds, and a block leaving it
out of order is reported as a hit with no request (``on_hit`` with a request id of
None), which the policies here treat as "no longer free" and learn nothing from.
``agent_of(ctx)`` labels requests (the spatial policy's agent). The introspection
interface (``anchorage.policies.base``) is the wrapped policy's, forwarded method by
method (a wrapper subclass overrides ``tiering_view``). Costs per block: O(log n)
for ``demoted`` and ``held`` (lazy heaps, ``anchorage.policies._lazyheap.LazyHeap``), O(1)
otherwise.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from anchorage.policies._lazyheap import LazyHeap
from anchorage.policies.base import (EvictionPolicy, LearnedCounts, PrefetchSettings,
                                     RequestContext, RequestInsight)

_NOBODY = RequestContext(request_id=None, keys=(), input_length=0, warmup=True)


class TieredEviction(EvictionPolicy):
    def __init__(self, inner: EvictionPolicy, agent_of: Callable[[RequestContext], Hashable]):
        self.inner = inner
        self.name = inner.name
        self.agent_of = agent_of
        self.demoted = LazyHeap()               # priority -reuse_s: furthest reuse first
        self.protected: dict[Hashable, OrderedDict[int, None]] = {}
        self.reservation: dict[Hashable, int] = {}
        self._where: dict[int, Hashable] = {}   # protected block -> agent
        self.held = LazyHeap()                  # priority until_s: earliest deadline first
        self.demoted_evictions = 0
        self.protected_evictions = 0
        self.held_evictions = 0

    def attach(self, pool) -> None:
        super().attach(pool)
        self.inner.attach(pool)

    # -- notifications --------------------------------------------------------------------

    def on_request(self, ctx: RequestContext) -> None:
        self.inner.on_request(ctx)

    def on_queued(self, ctx: RequestContext) -> None:
        self.inner.on_queued(ctx)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        inner_free = []
        dem, where = self.demoted, self._where
        held = self.held
        for b in were_free:
            if dem.remove(b) or held.remove(b):
                pass
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
                where = self._where
                keep = blocks[-room:]  # freed tail first: the chain's head, newest
                rest = list(blocks[:len(blocks) - len(keep)])
                for b in keep:
                    if len(q) >= room:  # the reserve keeps the agent's newest blocks
                        old = q.popitem(last=False)[0]
                        del where[old]
                        rest.append(old)
                    q[b] = None
                    where[b] = a
                blocks = rest
        if blocks:
            self.inner.on_freed(ctx, blocks)

    def on_request_done(self, ctx: RequestContext) -> None:
        self.inner.on_request_done(ctx)

    def on_evicted(self, block: int, key: Hashable) -> None:
        self.inner.on_evicted(block, key)

    # -- tiering --------------------------------------------------------------------------

    def demote(self, blocks: Iterable[int], reuse_s: float = math.inf) -> int:
        """Move cached free blocks to the front of the eviction order, the furthest
        predicted reuse first (``reuse_s``); returns how many."""
        ref, bkey = self.pool.ref_cnt, self.pool.block_key
        dem, where = self.demoted, self._where
        from_inner = []
        n = 0
        for b in blocks:
            if ref[b] != 0 or bkey[b] is None:
                continue
            if b in dem or self.held.remove(b):
                pass
            elif b in where:
                del self.protected[where.pop(b)][b]
            else:
                from_inner.append(b)
            dem.push(b, -reuse_s)
            n += 1
        if from_inner:
            self.inner.on_hit(_NOBODY, [], from_inner)
            # a request-less "done" lets a lazy policy settle the groups it just emptied
            self.inner.on_request_done(_NOBODY)
        return n

    def hold(self, blocks: Iterable[int], until_s: float) -> int:
        """Keep cached free blocks on GPU until ``until_s`` (evicted after the wrapped
        policy's); returns how many."""
        ref, bkey = self.pool.ref_cnt, self.pool.block_key
        held, where = self.held, self._where
        from_inner = []
        n = 0
        for b in blocks:
            if ref[b] != 0 or bkey[b] is None:
                continue
            if b in where:
                continue  # reserved: already evicted last
            if b in held or self.demoted.remove(b):
                pass
            else:
                from_inner.append(b)
            held.push(b, until_s)
            n += 1
        if from_inner:
            self.inner.on_hit(_NOBODY, [], from_inner)
            self.inner.on_request_done(_NOBODY)
        return n

    def release(self, now: float) -> int:
        """Hand held blocks whose deadline passed back to the wrapped policy."""
        held = self.held
        out = []
        while (top := held.peek()) is not None and top[0] <= now:
            out.append(held.pop())
        if out:
            self.inner.on_freed(RequestContext(request_id=None, keys=(), input_length=0,
                                               now_s=now, warmup=True), out)
        return len(out)

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
            return self.demoted.pop()
        b = self.inner.pop_victim()
        if b is not None:
            return b
        if self.held:
            self.held_evictions += 1
            return self.held.pop()
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
        out = list(self.demoted.ordered())
        out += list(self.inner.eviction_order())
        out += list(self.held.ordered())
        for q in self.protected.values():
            out.extend(q)
        return out

    def reset(self) -> None:
        self.demoted.clear()
        self.held.clear()
        self.protected.clear()
        self._where.clear()
        self.inner.reset()

    # -- introspection: the wrapped policy's (``EvictionPolicy``) -------------------------

    def last_request(self) -> RequestInsight | None:
        return self.inner.last_request()

    def fingerprint_of(self, keys: Sequence[Hashable]) -> Hashable | None:
        return self.inner.fingerprint_of(keys)

    def predictability(self) -> float:
        return self.inner.predictability()

    def next_agent(self, fp: Hashable) -> tuple[Hashable | None, float]:
        return self.inner.next_agent(fp)

    def session_agent(self, session_id: Hashable) -> Hashable | None:
        return self.inner.session_agent(session_id)

    def predicted_agents(self, k: int = 3) -> list[tuple[Hashable, float]]:
        return self.inner.predicted_agents(k)

    def protected_blocks(self) -> dict[str, int]:
        return self.inner.protected_blocks()

    def learned_counts(self) -> LearnedCounts:
        return self.inner.learned_counts()

    def model_state_bytes(self) -> int:
        return self.inner.model_state_bytes()

    def state_size_bytes(self) -> int:
        return self.inner.state_size_bytes()

    def prefetch_settings(self) -> PrefetchSettings:
        return self.inner.prefetch_settings()

    def tiering_view(self) -> dict[str, Any] | None:
        return self.inner.tiering_view()

    def anchor_labels(self) -> Any:
        return self.inner.anchor_labels()
