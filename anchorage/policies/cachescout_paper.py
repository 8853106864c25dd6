"""`cachescout-paper`: CacheScout's survival-guided eviction as written (sections 3.2-3.3,
eq. 4-9, Algorithm 1), beside Anchorage's reformulation (``cachescout``, ``hybrid``).

Specification
-------------
- Agent of a request (``AgentId``): its client hint when given, else the chained key of
  its first ``anchor_blocks`` blocks (its prompt-prefix fingerprint).
- Transition learner (eq. 3-4, Algorithm 1 lines 16-26), on the engine's global request
  order: when a request's agent ``a`` differs from the current agent ``a_t``,
  ``n(a_t, a) += 1`` (if ``a_t`` is set), ``P(j | i) = n(i, j) / sum_k n(i, k)``; the graph
  keeps the edges with ``P(b | a) >= tau`` (eq. 7); a BFS from ``a`` gives the hop
  distance ``E[x]`` to every agent (inf if unreachable); then ``a_t = a``.
- Survival (eq. 8): ``p(x) = 1 - min(E[x], E_max) / E_max`` (0 when unreachable).
- Score (eq. 9): ``Score(b) = (p(a_b) + delta) * (exp(-lambda * age(b)) + delta) * |b|``,
  ``a_b`` the agent of the request that last touched ``b`` (hit or cached it), ``age(b)``
  the scheduler steps since then (policy-clock seconds over ``step_s``), ``|b|`` its tokens
  (the block size, the same for every cached block). The victim is the evictable block
  with the lowest score. Within one agent the score falls with age, so the candidate is
  each agent's least recently touched free block; the victim is the lowest of those.

The paper gives no values for ``tau``, ``E_max``, ``delta`` or ``lambda``; the defaults
here are chosen, not fitted: ``tau`` 0.1, ``e_max`` 3, ``delta`` 0.05, ``lam`` 0.01 per
step, ``step_s`` 0.02 (one engine step of an 8B model on an H200), ``anchor_blocks`` 4.
Costs: O(1) per touched block, O(A) per victim (A agents with free blocks, bounded by
``max_agents`` 64 in the learner), O(A + edges) per agent change.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from typing import Hashable, Iterable

from anchorage.policies.base import EvictionPolicy, RequestContext


def survival(hops: float, e_max: float) -> float:
    """Eq. 8: ``1 - min(E, E_max) / E_max``."""
    return 1.0 - min(hops, e_max) / e_max


def score(p_surv: float, age_steps: float, tokens: int, delta: float, lam: float) -> float:
    """Eq. 9: ``(p + delta) * (exp(-lambda age) + delta) * |b|``."""
    return (p_surv + delta) * (math.exp(-lam * age_steps) + delta) * tokens


def hop_distances(counts: dict, start: Hashable, tau: float) -> dict:
    """BFS over the thresholded transition graph (eq. 7) from ``start``."""
    dist = {start: 0}
    q = deque([start])
    while q:
        a = q.popleft()
        row = counts.get(a)
        if not row:
            continue
        tot = sum(row.values())
        for b, n in row.items():
            if b not in dist and n / tot >= tau:
                dist[b] = dist[a] + 1
                q.append(b)
    return dist


class CacheScoutPaperPolicy(EvictionPolicy):
    name = "cachescout-paper"

    def __init__(self, block_size: int = 16, tau: float = 0.1, e_max: float = 3.0,
                 delta: float = 0.05, lam: float = 0.01, step_s: float = 0.02,
                 anchor_blocks: int = 4, max_agents: int = 64) -> None:
        if not (0 < tau <= 1 and e_max > 0 and delta >= 0 and lam >= 0 and step_s > 0):
            raise ValueError("need 0 < tau <= 1, e_max > 0, delta >= 0, lam >= 0, step_s > 0")
        self.bs = block_size
        self.tau, self.e_max, self.delta, self.lam, self.step_s = tau, e_max, delta, lam, step_s
        self.anchor_blocks = anchor_blocks
        self.max_agents = max_agents
        self.counts: OrderedDict[Hashable, dict] = OrderedDict()
        self.current: Hashable | None = None
        self.dist: dict = {}
        self.agent_of: dict[int, Hashable] = {}
        self.last: dict[int, float] = {}
        self.free: dict[Hashable, list] = {}      # agent -> heap (last access, seq, block)
        self.live: dict[int, int] = {}            # free block -> seq of its live heap entry
        self._seq = 0
        self.now = 0.0

    def _agent(self, ctx: RequestContext) -> Hashable:
        if ctx.agent_hint:
            return ("hint", ctx.agent_hint)
        keys = ctx.keys
        return ("fp", keys[min(self.anchor_blocks, len(keys)) - 1]) if keys else None

    def on_request(self, ctx: RequestContext) -> None:
        self.now = max(self.now, ctx.now_s)
        if ctx.warmup or ctx.request_id is None:
            return
        a = self._agent(ctx)
        if a == self.current:
            return
        if self.current is not None:
            row = self.counts.setdefault(self.current, {})
            row[a] = row.get(a, 0) + 1
            self.counts.move_to_end(self.current)
            while len(self.counts) > self.max_agents:
                self.counts.popitem(last=False)
        self.dist = hop_distances(self.counts, a, self.tau)
        self.current = a

    def _touch(self, ctx: RequestContext, blocks: Iterable[int]) -> None:
        a = self._agent(ctx)
        t = ctx.now_s
        for b in blocks:
            self.agent_of[b] = a
            self.last[b] = t

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        live = self.live
        for b in were_free:
            live.pop(b, None)
        if ctx.request_id is not None:
            self._touch(ctx, blocks)

    def on_cached(self, ctx, blocks, keys, start) -> None:
        self._touch(ctx, blocks)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        self.now = max(self.now, ctx.now_s)
        for b in blocks:
            a = self.agent_of.get(b)
            self._seq += 1
            self.live[b] = self._seq
            heapq.heappush(self.free.setdefault(a, []), (self.last.get(b, self.now), self._seq, b))

    def _front(self, heap: list):
        live = self.live
        while heap and live.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def pop_victim(self) -> int | None:
        best, best_a = None, None
        empty = []
        for a, heap in self.free.items():
            top = self._front(heap)
            if top is None:
                empty.append(a)
                continue
            p = survival(self.dist.get(a, math.inf), self.e_max)
            sc = score(p, (self.now - top[0]) / self.step_s, self.bs, self.delta, self.lam)
            if best is None or (sc, top[0]) < best:
                best, best_a = (sc, top[0]), a
        for a in empty:
            del self.free[a]
        if best is None:  # (best_a may be None: blocks of no known agent)
            return None
        _, _, b = heapq.heappop(self.free[best_a])
        del self.live[b]
        return b

    def on_evicted(self, block: int, key: Hashable) -> None:
        self.agent_of.pop(block, None)
        self.last.pop(block, None)

    def eviction_order(self) -> Iterable[int]:
        return sorted(self.live, key=lambda b: (score(
            survival(self.dist.get(self.agent_of.get(b), math.inf), self.e_max),
            (self.now - self.last.get(b, self.now)) / self.step_s, self.bs, self.delta,
            self.lam), self.last.get(b, self.now)))

    def reset(self) -> None:
        self.free.clear()
        self.live.clear()

    def state_size_bytes(self) -> int:
        return 48 * len(self.counts) + 16 * sum(len(r) for r in self.counts.values())


POLICIES = {"cachescout-paper": lambda block_size=16, **p: CacheScoutPaperPolicy(block_size, **p)}
