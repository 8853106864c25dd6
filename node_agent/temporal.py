"""The in-engine temporal tiering adapter: TokenCake's offload during tool stalls (section
4) mapped onto vLLM 0.32 without a fork. The stalls, the gate and its inputs, holds, reload
timing and expiry are the core's temporal controller (``anchorage.tiering.controller``);
this module fills its readings from the engine's pool, acts on its plan
(``TemporalTiering``, the policy wrapper the engine's block pool drives) and tracks the
warm-up reloads the sidecar sends (``EngineController``).

Specification
-------------
Configuration: ``anchorage.tiering.params.TemporalParams.from_env`` (``ANCHORAGE_HOST_BYTES``
required, ``ANCHORAGE_HOST_LINK_GBS``, ``ANCHORAGE_TEMPORAL_WATERMARK``), read when the pool
builds its policy with ``ANCHORAGE_TIERING=temporal`` or ``spatial,temporal``. Bytes per
block come from the engine's KV cache config (``vllm_compat.kv_block_bytes``: the KV tensors' bytes
over the block count, i.e. layers x KV heads x head dim x 2 x dtype bytes x block size for
a plain decoder).

At the end of a turn (``on_request_done``: the request's blocks are freed) of a real request
that carries a pending tool (``anchorage.tool_name``, optional ``anchorage.tool_args``) and a
session id, the stall opens (``TemporalController.turn_end``), and when the request's
leading full prompt blocks are still in the prefix cache (``n`` of them; the connector
offloads prompt blocks) the controller plans it over:

- ``SessionReading``: ``gpu_blocks = copy_blocks = n`` (the connector's host memory is not
  visible, and it copies every computed block anyway: the copy out is an upper bound);
  ``recompute_s`` unknown (the model's FLOPs are not known here: ``low_saving`` never fires);
- ``PoolReading``: the capacity; vLLM's free blocks; the cached free blocks, counted from the
  pool's notifications (+ freed, - hit while free, - evicted while free, 0 at a prefix-cache
  reset; clamped to [0, free]); bytes per block; the scheduler's queue, first 32 requests
  (new blocks, tokens), when the prefix-aware scheduler shows it
  (``PoolView.waiting_demand``), else None (unknown: one request that fits); no link queue;
- criticality: the spatial policy's with ``spatial``, else 0.

The plan's action:

- ``offload``: ``offloaded(st, end, end + offload_s, keys)`` (host occupancy, ``reload_at``;
  ``d2h`` bytes = blocks x bytes) and ``TieredEviction.demote`` of the session's cached free
  blocks with priority ``reuse_s`` (on the CUDA build the connector holds their host copies,
  so early eviction is the offload);
- ``hold``: ``TieredEviction.hold`` of the session's cached free blocks until
  ``hold_until`` (evicted only after every block of the wrapped policy, so a hold never
  blocks an allocation that has nothing else to take). Released at expiry (``release(now)``
  at the first admission attempt of each request) and on the session's return: held blocks
  the returning prompt does not start with are released at once, the others leave the hold
  when the request hits them at admission (or at expiry);
- ``backup``: nothing to do in the engine (the offload connector already copies every
  computed block to host memory); only counted;
- ``keep``: nothing.

``offloads`` counts each planned stall once by its gate reason (``ok``, ``emergency`` or a
rejection) and, when rejected, once more by its action (``hold``, ``backup``, ``keep``).

Measured: the admission wait (the block-pool driver notes vLLM's ``request.arrival_time`` at
a request's first admission attempt, not a preempted one's, and calls ``on_admitted(ctx,
wait_s)`` at its first successful ``allocate_slots``; a wall-clock duration, as vLLM stamps
arrivals, added to the monotonic policy clock); the turnover (``on_evicted``: the cumulative
eviction count at every eviction, on the policy clock).

Reloads. Pending reloads (offloaded, no warm-up seen yet) go into the plugin's snapshot
(``tiering.pending_reloads``: id, session, ``at_s`` in unix time, blocks, agent, tenant; the
plugin adds the session's last prompt token ids and cache salt from its bounded registry,
``node_agent.state.SessionPrompts``). The sidecar issues each as a warm-up at ``at_s``
(``anchorage.warmup.ReloadScheduler``: max_tokens=1, ``anchorage.warmup=1``, same session id
and cache salt): the CUDA connector serves it from host memory; the CPU build has no host
tier and recomputes it. A warm-up of the session marks its reload started (a move, for the
churn test) and done when it finishes (h2d bytes = blocks x bytes). Warm-ups never feed the
forecaster. The session's next real request closes the stall (``returned``); an offloaded
session's reload outcome is ``in_time`` (warm-up done before, and the reloaded prefix is
cached), ``late`` (warm-up unfinished or never sent: the request itself loads, or
recomputes), ``wasted`` (warm-up done but the reloaded prefix left the cache before use, or
the session did not come back within ``horizon_s``). A request that comes back with the same
request id (vLLM preempted and resumes it) is not a return: its stall is dropped without
learning.

Any exception in the temporal part propagates to the block-pool driver, which counts it
(``anchorage_policy_errors_total``), logs it once and keeps stock behaviour for that
decision (no demotion); the wrapped policy has been notified before.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable
from typing import Any

from anchorage.node_agent.tiering import EngineTiering

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.tiering.controller import (
    PoolReading,
    SessionReading,
    Stall,
    TemporalController,
)
from anchorage.tiering.params import TemporalParams

__all__ = ["EngineController", "TemporalParams", "TemporalTiering"]

OUTCOMES = ("in_time", "late", "wasted")


class EngineController(TemporalController):
    """The core controller plus what the engine measures of reloads: warm-ups, outcomes,
    byte estimates, the snapshot's pending reloads (no vLLM objects)."""

    def __init__(self, params: TemporalParams):
        super().__init__(params)
        self.reloads: Counter = Counter()    # outcome -> n
        self.bytes = {"d2h": 0, "h2d": 0}
        self.block_bytes = 0

    @property
    def offloads(self) -> Counter:
        """Gate reasons, plus the action of each rejected stall."""
        out = Counter(self.gate)
        out.update({a: n for a, n in self.actions.items() if a != "offload"})
        return out

    def stall(self, ctx: RequestContext, keys: list, reading: PoolReading,
              criticality: float = 0.0) -> Stall:
        """``ctx``'s turn ended in a tool call at ``ctx.now_s``, ``keys`` its leading prompt
        blocks still cached: opens the stall, plans it when there are keys, and records an
        accepted offload (host occupancy, ``reload_at``, d2h bytes). The caller acts on the
        blocks (``st.action``)."""
        now = ctx.now_s
        st = self.turn_end(ctx.session_id, now, ctx.tool_name, ctx.tool_args,
                           rid=ctx.request_id, agent=ctx.agent_hint, tenant=ctx.tenant)
        if not keys:
            return st
        dec = self.plan(st, SessionReading(gpu_blocks=len(keys), copy_blocks=len(keys)),
                        reading, criticality)
        self.block_bytes = reading.block_bytes
        if dec.offload:
            self.offloaded(st, now, now + st.offload_s, keys)
            self.bytes["d2h"] += st.blocks * reading.block_bytes
        return st

    def request(self, ctx: RequestContext, now: float, cached: Any = ()) -> str | None:
        """A request of a session starts (``cached``: ``key in cached`` for the prefix
        cache). A warm-up starts the reload; a real request closes the stall. Returns the
        reload outcome when one is decided."""
        sid = ctx.session_id
        st = self.stalls.get(sid) if sid is not None else None
        if st is None:
            return None
        if ctx.warmup:
            if st.offloaded and st.reload_started_s is None:
                st.reload_started_s = now
                self.moved(sid, now)
            return None
        if ctx.request_id == st.rid:  # vLLM resumes a preempted request: not a return
            self.returned(sid, now, learn=False)
            return None
        self.returned(sid, now)
        if not st.offloaded:
            return None
        if st.reload_done_s is not None and st.reload_done_s <= now:
            out = "in_time" if (not st.keys or st.keys[-1] in cached) else "wasted"
        else:
            out = "late"
            self.bytes["h2d"] += st.blocks * self.block_bytes  # loaded on demand
        self.reloads[out] += 1
        return out

    def warmup_done(self, ctx: RequestContext, now: float) -> None:
        st = self.stalls.get(ctx.session_id) if ctx.session_id is not None else None
        if st is None or not st.offloaded or st.reload_started_s is None:
            return
        if st.reload_done_s is None:
            st.reload_done_s = now
            self.bytes["h2d"] += st.blocks * self.block_bytes

    def dropped(self, st: Stall, why: str) -> None:
        if st.offloaded and (why == "expired" or st.reload_done_s is not None):
            self.reloads["wasted"] += 1

    def pending(self) -> list[Stall]:
        return [st for st in list(self.stalls.values())
                if st.offloaded and st.reload_started_s is None and st.reload_at is not None]

    def view(self, mono_now: float, unix_now: float) -> dict[str, Any]:
        return {
            "offloads": dict(self.offloads),
            "reloads": {o: int(self.reloads.get(o, 0)) for o in OUTCOMES},
            "bytes": dict(self.bytes),
            "pending_reloads": [
                {"id": f"{st.sid}#{st.seq}", "session": st.sid,
                 "at_s": unix_now + (st.reload_at - mono_now), "blocks": st.blocks,
                 "agent": st.agent, "tenant": st.tenant}
                for st in self.pending()],
        }


class TemporalTiering(EngineTiering):
    """The engine's policy wrapper: ``EngineTiering`` (spatial reservation when
    ``spatial``) plus the temporal controller on the pool's notifications."""

    def __init__(self, inner: EvictionPolicy, params: TemporalParams, spatial: bool = False,
                 clock=None):
        super().__init__(inner)
        self.spatial = spatial
        self.temporal = EngineController(params)
        self._cached_free = 0       # cached free blocks (see the module's specification)
        self._evictions = 0
        from anchorage.node_agent.request_context import policy_clock

        self.clock = clock or policy_clock

    def attach(self, pool) -> None:
        super().attach(pool)
        self.temporal.attach(pool.capacity_blocks)

    def update(self, now: float = 0.0):
        return super().update(now) if self.spatial else {}

    # -- the pool's notifications ---------------------------------------------------------

    def on_request(self, ctx: RequestContext) -> None:
        super().on_request(ctx)
        if self.held:  # once per request: holds past their deadline go back
            self.release(ctx.now_s)
        sid = ctx.session_id
        st = self.temporal.stalls.get(sid) if sid is not None else None
        if st is not None and st.held and not ctx.warmup and ctx.request_id != st.rid:
            self._release_returned(st, ctx)
        self.temporal.request(ctx, ctx.now_s, self.pool.cached)

    def on_admitted(self, ctx: RequestContext, wait_s: float) -> None:
        """The driver: ``ctx``'s request was admitted ``wait_s`` after its arrival."""
        self.temporal.admitted(wait_s)

    def on_hit(self, ctx, blocks, were_free) -> None:
        self._cached_free -= len(were_free)
        super().on_hit(ctx, blocks, were_free)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        self._cached_free += len(blocks)
        super().on_freed(ctx, blocks)

    def on_evicted(self, block: int, key: Hashable) -> None:
        if self.pool.ref_cnt[block] == 0:  # a free block lost its content
            self._cached_free -= 1
        self._evictions += 1
        self.temporal.observe_evictions(self._evictions, self.clock())
        super().on_evicted(block, key)

    def reset(self) -> None:
        self._cached_free = 0
        super().reset()

    def on_request_done(self, ctx: RequestContext) -> None:
        super().on_request_done(ctx)
        if ctx.session_id is None:
            return
        if ctx.warmup:
            self.temporal.warmup_done(ctx, ctx.now_s)
        elif ctx.tool_name is not None:
            self._turn_end(ctx)

    # -- readings and actions -------------------------------------------------------------

    def cached_free_blocks(self) -> int:
        return min(max(0, self._cached_free), self.pool.num_free_blocks)

    def session_blocks(self, ctx: RequestContext) -> tuple[list, list[int]]:
        """(keys, block ids) of the request's leading full prompt blocks still cached."""
        view = self.pool
        n = min(len(ctx.keys), ctx.input_length // max(1, view.block_size))
        keys, ids = [], []
        get = view.cached.get
        for k in ctx.keys[:n]:
            b = get(k)
            if b is None:
                break
            keys.append(k)
            ids.append(b)
        return keys, ids

    def _turn_end(self, ctx: RequestContext) -> None:
        view = self.pool
        keys, ids = self.session_blocks(ctx)
        reading = PoolReading(
            capacity_blocks=view.capacity_blocks, free_blocks=view.num_free_blocks,
            cached_free_blocks=self.cached_free_blocks(),
            block_bytes=int(getattr(view, "bytes_per_block", 0) or 0),
            waiting=view.waiting_demand() if keys else None)
        crit = (self.criticality.get(ctx.agent_hint, 0.0)
                if self.spatial and ctx.agent_hint else 0.0)
        st = self.temporal.stall(ctx, keys, reading, crit)
        ref = view.ref_cnt
        pairs = [(b, k) for b, k in zip(ids, keys) if ref[b] == 0]  # free: evictable
        if not pairs:
            return
        free = [b for b, _ in pairs]
        if st.action == "offload":
            self.demote(reversed(free), st.reuse_s)  # a chain's tail first, as vLLM frees
        elif st.action == "hold":
            self.hold(reversed(free), st.hold_until)
            st.held = tuple(pairs)

    def _release_returned(self, st: Stall, ctx: RequestContext) -> None:
        """The session is back: held blocks its prompt does not start with go back to the
        wrapped policy now; the others leave the hold when the request hits them."""
        lead = set(ctx.keys[:len(st.held)])
        held, bkey = self.held, self.pool.block_key
        out = [b for b, k in st.held if k not in lead and b in held and bkey[b] == k]
        st.held = ()
        if out:
            self.hold(out, ctx.now_s)  # due now
            self.release(ctx.now_s)

    def tiering_view(self) -> dict[str, Any]:
        out = super().tiering_view() if self.spatial else {"reserved_blocks": {}}
        out["mode"] = "spatial,temporal" if self.spatial else "temporal"
        for _ in range(3):
            try:
                out.update(self.temporal.view(self.clock(), time.time()))
                break
            except RuntimeError:  # the engine thread changed a dict under us
                continue
        return out
