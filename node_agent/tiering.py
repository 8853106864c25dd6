"""Spatial tiering inside the engine: reserved GPU blocks for critical agents, through the
plugin's eviction-policy hook (no engine fork). The temporal part (offload to host during
tool stalls) is ``node_agent.temporal.TemporalTiering``, which extends this wrapper; on
the CUDA build vLLM's ``OffloadingConnector`` / ``SimpleCPUOffloadConnector`` holds the
host copies, on the CPU build there is no host tier (a reload recomputes).

Specification
-------------
``EngineTiering(policy, interval=32)`` is ``anchorage.tiering.eviction.TieredEviction``
around the configured policy, plus what the spatial policy needs, learned from the pool's
own notifications:

- agent of a request: its ``anchorage.agent`` metadata (``ctx.agent_hint``); requests
  without one are not reserved for;
- usage per agent: blocks held by its live requests (hits and new blocks, counted once per
  request from ``on_hit`` / ``on_cached`` until ``on_request_done``);
- active sessions per agent and the transition graph: a session's consecutive agents
  (``anchorage.policies.transitions.TransitionLearner``);
- queueing: not visible to the pool (0; the scheduler's queue is the engine's).

Every ``interval`` requests the reservation is recomputed with ``anchorage.tiering.spatial``
(scores, critical agents, reserved fraction of the pressure = held blocks / capacity,
split) and applied (``set_reservation``). ``reserved`` (agent -> blocks) goes into the
plugin's snapshot (``tiering_view`` -> ``state.json`` ``tiering.reserved_blocks``) and the
sidecar exports it as ``anchorage_tiering_reserved_blocks`` (docs/metrics.md).

Admission (``admission_arrival(pool)``, the prefix-aware scheduler's hook, only with
``ANCHORAGE_TIERING=spatial``): a waiting request's arrival time becomes
``arrival - 1 s x criticality`` of its agent (``anchorage.tiering.spatial.critical_arrival``,
as in the simulator), read at each scheduling step from the policy attached to the pool
(after a reload, the new one); no agent, or no tiering policy attached: criticality 0.

``maybe_wrap(policy)``: the wrapped policy when ``ANCHORAGE_TIERING`` is ``spatial``
(the plugin's hook), else ``policy`` unchanged. ``build_policy(name, block_size, params)``
is the engine's one policy factory: ``maybe_wrap(make_policy(...))``, called at engine start
(``vllm_hooks.make_configured_policy``) and on a config reload
(``reload.PolicyReloader.apply``), so a reload keeps tiering.
"""

from __future__ import annotations

import os
from collections import Counter, OrderedDict
from collections.abc import Hashable
from typing import Any

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.policies.transitions import TransitionLearner
from anchorage.tiering import spatial as sp
from anchorage.tiering.eviction import TieredEviction

ENV_TIERING = "ANCHORAGE_TIERING"
MAX_LIVE = 8192
MAX_SESSIONS = 4096
MAX_EXPORTED_AGENTS = 64  # the metric's agent label: the largest reservations only


def _agent(ctx: RequestContext) -> Hashable | None:
    return ctx.agent_hint or None


class EngineTiering(TieredEviction):
    def __init__(self, inner: EvictionPolicy, interval: int = 32,
                 params: sp.SpatialParams | None = None,
                 weights: sp.ScoreWeights | None = None):
        super().__init__(inner, _agent)
        self.interval = max(1, interval)
        self.params = params or sp.SpatialParams()
        self.weights = weights or sp.ScoreWeights()
        self.flow = TransitionLearner()  # agent -> agent, from the requests' agent hints
        self._live: OrderedDict[Any, list] = OrderedDict()   # rid -> [agent, blocks]
        self._sess: OrderedDict[Any, Hashable] = OrderedDict()  # session -> last agent
        self._n = 0
        self.reserved: dict[Hashable, int] = {}
        self.criticality: dict[Hashable, float] = {}

    def on_request(self, ctx: RequestContext) -> None:
        super().on_request(ctx)
        a = _agent(ctx)
        rid = ctx.request_id
        if rid is not None and rid not in self._live:
            self._live[rid] = [a, 0]
            while len(self._live) > MAX_LIVE:
                self._live.popitem(last=False)
            sid = ctx.session_id
            if sid is not None and a is not None and not ctx.warmup:
                prev = self._sess.pop(sid, None)
                if prev is not None:
                    self.flow.observe(prev, a)
                self._sess[sid] = a
                while len(self._sess) > MAX_SESSIONS:
                    self._sess.popitem(last=False)
        self._n += 1
        if self._n % self.interval == 0:
            self.update()

    def _count(self, ctx: RequestContext, n: int) -> None:
        e = self._live.get(ctx.request_id)
        if e is not None:
            e[1] += n

    def on_hit(self, ctx, blocks, were_free) -> None:
        super().on_hit(ctx, blocks, were_free)
        self._count(ctx, len(blocks))

    def on_cached(self, ctx, blocks, keys, start) -> None:
        super().on_cached(ctx, blocks, keys, start)
        if start >= len(ctx.keys) or not keys or keys[0] == ctx.keys[start]:
            self._count(ctx, len(blocks))

    def on_request_done(self, ctx: RequestContext) -> None:
        super().on_request_done(ctx)
        self._live.pop(ctx.request_id, None)

    def update(self, now: float = 0.0) -> dict[Hashable, int]:
        """Recompute and apply the reservation; returns it."""
        usage: Counter = Counter()
        active: Counter = Counter()
        for a, n in self._live.values():
            if a is not None:
                usage[a] += n
                active[a] += 1
        for a in self._sess.values():
            active[a] += 0  # known agents take part even when idle
        agents = set(usage) | set(active)
        if not agents:
            return {}
        cap = max(1, self.pool.capacity_blocks)
        flow = sp.transition_flow(self.flow, agents)
        scores = sp.agent_scores(flow, {}, usage, active, self.weights)
        self.criticality = sp.criticality(scores)
        pressure = min(1.0, sum(usage.values()) / cap)
        total = int(sp.reserved_fraction(pressure, self.params) * cap)
        shares = sp.split_reservation(total, sp.critical_agents(scores, self.params),
                                      usage, scores, self.params)
        self.set_reservation(shares, now)
        self.reserved = shares
        return shares


    def tiering_view(self) -> dict[str, Any]:
        """What the plugin's snapshot carries (``state.policy_view``; plain data, read from
        the exporter's thread): the mode and the reserved blocks per agent (the offload and
        reload counters are ``TemporalTiering``'s)."""
        from anchorage.node_agent.state import agent_label

        def label(a: Hashable) -> str:  # agent hints are the client's names
            return a if isinstance(a, str) else agent_label(a)

        top = sorted(((n, label(a)) for a, n in list(self.reserved.items()) if n > 0),
                     key=lambda x: (-x[0], x[1]))[:MAX_EXPORTED_AGENTS]
        return {"mode": "spatial", "reserved_blocks": {a: int(n) for n, a in top}}


def maybe_wrap(policy: EvictionPolicy | None) -> EvictionPolicy | None:
    """``EngineTiering(policy)`` when ``ANCHORAGE_TIERING=spatial``; with ``temporal`` or
    ``spatial,temporal``, ``node_agent.temporal.TemporalTiering``; else ``policy``."""
    mode = os.environ.get(ENV_TIERING, "").strip().lower()
    if policy is None or mode in ("", "off", "0"):
        return policy
    parts = {p.strip() for p in mode.split(",")}
    if "temporal" in parts and parts <= {"spatial", "temporal"}:
        from anchorage.node_agent.temporal import TemporalParams, TemporalTiering

        return TemporalTiering(policy, TemporalParams.from_env(), spatial="spatial" in parts)
    if mode != "spatial":
        raise ValueError(f"{ENV_TIERING} must be 'spatial', 'temporal', 'spatial,temporal' "
                         f"or 'off', got {mode!r}")
    return EngineTiering(policy)


def build_policy(name: str, block_size: int,
                 params: dict[str, Any] | None = None) -> EvictionPolicy:
    """The engine's policy for a config: ``make_policy`` then ``maybe_wrap`` (raises the
    registry's ``TypeError``/``ValueError`` for rejected parameters)."""
    from anchorage.policies.registry import make_policy

    return maybe_wrap(make_policy(name, block_size=block_size, params=params or {}))


def admission_arrival(pool: Any, boost_s: float | None = None):
    """``request -> arrival time`` for ``anchorage.policies.admission.admission_order``:
    None when ``ANCHORAGE_TIERING`` is off (the scheduler uses ``arrival_time``), else
    ``arrival_time - boost_s x criticality`` of the request's agent (see the module)."""
    mode = os.environ.get(ENV_TIERING, "").strip().lower()
    if "spatial" not in {p.strip() for p in mode.split(",")}:
        return None
    from anchorage.node_agent import vllm_compat as vc
    from anchorage.node_agent.request_context import anchorage_args

    boost = sp.SpatialParams().boost_s if boost_s is None else boost_s

    def arrival(request: Any) -> float:
        t = request.arrival_time
        policy = getattr(vc.driver(pool), "policy", None)
        crit = policy.criticality if isinstance(policy, EngineTiering) else None
        if not crit:
            return t
        agent = anchorage_args(request).get("agent")
        c = crit.get(agent, 0.0) if isinstance(agent, str) else 0.0
        return sp.critical_arrival(t, c, boost)

    return arrival
