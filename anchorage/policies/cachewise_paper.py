"""`cachewise-paper`: CacheWise's predictive eviction as published (Tiwari et al., sections
5.2-5.3), beside Anchorage's reformulation (``cachewise``, ``hybrid``).

Specification
-------------
Metadata per block: when a request's blocks become unreferenced they carry the session
metadata of that request, ``m = (tool_name, tool_args)`` of the tool call it generated and
``T`` = the time it completed (the tool call was generated then). Blocks of one session
share one entry (the paper's shared prediction per session).

Predictor (``E[tau | tau > elapsed]``): for a session at elapsed ``e = now - T`` the
expected remaining time ``E[tau - e | tau > e]`` (so its expected next use is ``T +
E[tau | tau > e]``) from the empirical distribution of tool durations with the same
metadata: the (tool, argument cluster) distribution when it has at least ``min_samples``
(16) samples, else the tool's, else all tools' (``GapHistogram.remaining``, log-binned).
Argument clusters: TF-IDF vectors of the arguments clustered per tool by k-means
(``ArgClusterer``, ``k_max`` = 100: the paper's C100), fitted offline on ``warm_start`` =
(tool_name, tool_args) pairs (the paper trains on 80 % of its sessions); tools never fitted
use the argument signature. Durations are learned online: a session's next request
arriving ``g`` seconds after the completion of a request that called tool ``m`` adds ``g``
to ``m``'s distributions (the paper trains offline; its distributions are then fixed).

Eviction: blocks of sessions without a pending tool call (a human turn, or no session) are
idle and evicted first (least recently freed first: the paper evicts idle sessions before
those in a tool call); then the session with the largest expected remaining time, its
blocks in the order they were freed (a chain's tail first). A session with no
distribution yet (fewer than ``min_samples`` durations anywhere) is ordered by recency
(``e``: the longest idle first). Priorities are recomputed for every session with free
blocks every ``rebuild_s`` seconds of the policy clock (the paper's ``N_rebuild`` = 3
engine iterations; default 3 x 20 ms), and when a session's blocks are freed.

Parameters: ``min_samples`` 16, ``k_max`` 100, ``rebuild_s`` 0.06, ``warm_start`` None,
``max_sessions`` 65536 (metadata entries, LRU). Costs: O(1) per block notification,
O(log S) per victim, O(S log S) per rebuild (S = sessions with free blocks).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from typing import Any, Hashable, Iterable, Sequence

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.policies.gap_predictor import GapPredictor
from anchorage.policies.tool_clusters import ArgClusterer

IDLE = None  # the group of blocks without a pending tool call


class _Group:
    __slots__ = ("blocks", "tool", "cluster", "t_done", "version")

    def __init__(self) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.tool: Hashable | None = None
        self.cluster: Hashable | None = None
        self.t_done = 0.0
        self.version = 0


class CacheWisePaperPolicy(EvictionPolicy):
    name = "cachewise-paper"

    def __init__(self, block_size: int = 16, min_samples: int = 16, k_max: int = 100,
                 rebuild_s: float = 0.06,
                 warm_start: Sequence[tuple[Any, Any]] | None = None,
                 max_sessions: int = 65536) -> None:
        if min_samples < 1 or rebuild_s <= 0 or max_sessions < 1:
            raise ValueError("min_samples and max_sessions must be >= 1, rebuild_s > 0")
        self.gaps = GapPredictor(min_samples=min_samples, max_keys=4096)
        self.clusters = ArgClusterer(k_max=k_max)
        if warm_start:
            self.clusters.fit(warm_start)
        self.rebuild_s = rebuild_s
        self.max_sessions = max_sessions
        self.groups: dict[Hashable, _Group] = {IDLE: _Group()}
        self.where: dict[int, Hashable] = {}       # free block -> group key
        self.pending: OrderedDict[Hashable, tuple] = OrderedDict()  # session -> (tool, cluster, t)
        self.heap: list = []                        # (-priority, seq, key, version)
        self._seq = 0
        self.now = 0.0
        self._built_at = -math.inf

    # -- learning -----------------------------------------------------------------------

    def on_request(self, ctx: RequestContext) -> None:
        self.now = max(self.now, ctx.now_s)
        s = ctx.session_id
        if s is None or ctx.warmup:
            return
        last = self.pending.pop(s, None)
        if last is not None and last[0] is not None:
            self.gaps.observe(max(0.0, ctx.now_s - last[2]), last[0], last[1])

    on_queued = on_request

    def on_request_done(self, ctx: RequestContext) -> None:
        self.now = max(self.now, ctx.now_s)
        s = ctx.session_id
        if s is None or ctx.warmup or ctx.request_id is None:
            return
        tool = ctx.tool_name
        cl = self.clusters.cluster(tool, ctx.tool_args) if tool is not None else None
        self.pending[s] = (tool, cl, ctx.now_s)
        self.pending.move_to_end(s)
        if len(self.pending) > self.max_sessions:
            self.pending.popitem(last=False)

    # -- priorities ---------------------------------------------------------------------

    def _priority(self, g: _Group) -> float:
        """Larger = evicted first: expected remaining time of the tool call (idle: inf)."""
        e = max(0.0, self.now - g.t_done)
        if g.tool is None:
            return math.inf
        h = self.gaps.histogram(g.tool, g.cluster)
        return e if h is None else h.remaining(e)

    def _push(self, key: Hashable) -> None:
        g = self.groups[key]
        g.version += 1
        self._seq += 1
        heapq.heappush(self.heap, (-self._priority(g), self._seq, key, g.version))

    def _rebuild(self) -> None:
        self.heap = []
        for key, g in self.groups.items():
            if g.blocks:
                self._push(key)
        self._built_at = self.now

    # -- the pool's notifications ---------------------------------------------------------

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        where, groups = self.where, self.groups
        for b in were_free:
            key = where.pop(b, IDLE)
            groups[key].blocks.pop(b, None)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        self.now = max(self.now, ctx.now_s)
        s = ctx.session_id
        tool = ctx.tool_name if (s is not None and ctx.request_id is not None) else None
        key = s if tool is not None else IDLE
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group()
        if key is not IDLE:
            g.tool = tool
            g.cluster = self.clusters.cluster(tool, ctx.tool_args)
            g.t_done = ctx.now_s
        for b in blocks:
            old = self.where.get(b)
            if old is not None:
                self.groups[old].blocks.pop(b, None)
            g.blocks[b] = None
            self.where[b] = key
        self._push(key)

    def pop_victim(self) -> int | None:
        if self.now - self._built_at >= self.rebuild_s:
            self._rebuild()
        heap, groups = self.heap, self.groups
        while heap:
            _, _, key, ver = heap[0]
            g = groups.get(key)
            if g is None or g.version != ver or not g.blocks:
                heapq.heappop(heap)
                if g is not None and not g.blocks and key is not IDLE:
                    del groups[key]
                continue
            b, _ = g.blocks.popitem(last=False)
            del self.where[b]
            return b
        return None

    def eviction_order(self) -> Iterable[int]:
        keys = sorted((k for k, g in self.groups.items() if g.blocks),
                      key=lambda k: -self._priority(self.groups[k]))
        for k in keys:
            yield from list(self.groups[k].blocks)

    def reset(self) -> None:
        self.groups = {IDLE: _Group()}
        self.where.clear()
        self.heap = []

    def state_size_bytes(self) -> int:
        return self.gaps.size_bytes() + 64 * len(self.pending)


POLICIES = {"cachewise-paper": lambda block_size=16, **p: CacheWisePaperPolicy(block_size, **p)}
