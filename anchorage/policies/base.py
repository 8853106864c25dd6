"""The eviction-policy protocol shared by the simulator, the vLLM plugin and the router.

The pool owns the mechanics (reference counts, hashes, the uncached part of the free
queue); a policy owns one decision: the order in which *cached free* blocks are evicted.
The pool tells the policy what happens, in batches, with the request's context:

- ``on_queued(ctx)``: optional: a request is waiting for admission (the engine queued
  it; nothing touched). Its cached prefix will be hit at admission if it survives until
  then. Default: nothing (stock vLLM order does not know about waiting requests).
- ``on_request(ctx)``: a request arrived (its block keys are known; nothing touched yet).
- ``on_hit(ctx, blocks, were_free)``: the request hit ``blocks`` (in chain order);
  ``were_free`` are the ones that were evictable and no longer are.
- ``on_cached(ctx, blocks, keys, start)``: blocks just got keys (chain positions from
  ``start``); they are in use by the request.
- ``on_freed(ctx, blocks)``: cached blocks whose reference count reached zero, in vLLM's
  free order (a chain's tail first). They are now evictable.
- ``pop_victim()``: choose one evictable block, forget it as evictable, return its id.
- ``on_evicted(block, key)``: the pool dropped the block's key (side tables may clean up).
- ``on_request_done(ctx)``: the request finished (its tool metadata is known now).
- ``eviction_order()``: evictable blocks, first victim first (tests and reset only; may be
  O(n log n)).

Contract: ``pop_victim`` is O(log n) or better; every ``on_*`` is O(1) per block; state is
bounded. A policy never sees the future (``belady`` is the simulator-only exception) and
never reads ``RequestContext.agent_truth``.

``next_in_session(contexts)`` is for the offline references only (``cachewise-oracle``,
``hybrid-oracle``): the replay read ahead, per ``seq``, the same session's next request.

Robustness: a notification about a block the policy never saw (a hit on a free block it
does not hold, a freed block it never saw cached: vLLM allocates without a prefix lookup
on its connector path) must not raise; such blocks stay evictable.

What a policy may read of its pool (``attach(pool)``) is ``PoolView``, a protocol both
the simulator's ``anchorage.pool.block_pool.BlockPool`` and the engine's
``anchorage.node_agent.vllm_block_pool.PoolView`` satisfy.

Introspection (what anything outside a policy may read of it; safe defaults for policies
that learn nothing): ``last_request()`` (session, fingerprint and anchor length inferred
for the last request ``on_request`` saw), ``fingerprint_of(keys)``, ``predictability()``
(R, eq. 2 of CacheScout; computed on call: not for the hot path), ``next_agent(fp)``,
``session_agent(session_id)``, ``predicted_agents(k)`` (the agents most likely called next,
with the expected number of active sessions calling each), ``protected_blocks()`` (free
blocks protected as anchors / as sessions waiting on a tool), ``learned_counts()``,
``model_state_bytes()``, ``state_size_bytes()``, ``prefetch_settings()``,
``tiering_view()`` (tiering wrappers) and ``anchor_labels()`` (for routers that read a
replica's anchors). Readers call these and nothing else; they are safe to call from
another thread in the sense that a concurrent change makes them raise RuntimeError, never
return garbage (callers retry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Protocol, Sequence, runtime_checkable


@runtime_checkable
class PoolView(Protocol):
    """What a policy may read of the pool it is attached to (read only).

    ``capacity_blocks``: usable blocks; ``block_size``: tokens per block; ``cached``: the
    cached keys (``key in cached``; look a key up with ``get_cached_block``);
    ``block_key[b]``: the key block ``b`` is cached under, or None; ``ref_cnt[b]``: its
    users (0 = free);
    ``num_free_blocks``: free blocks, cached or not; ``get_cached_block(key)``: the block
    a lookup of ``key`` finds, or None; ``blocks_needed(num_tokens)``.
    """

    capacity_blocks: int
    block_size: int

    @property
    def cached(self) -> Any: ...

    @property
    def block_key(self) -> Any: ...

    @property
    def ref_cnt(self) -> Any: ...

    @property
    def num_free_blocks(self) -> int: ...

    def get_cached_block(self, key: Hashable) -> int | None: ...

    def blocks_needed(self, num_tokens: int) -> int: ...


class UnknownParameterError(TypeError):
    """A policy was given a parameter it does not take (``name``)."""

    def __init__(self, name: str, accepted: Sequence[str] = ()):
        self.name = name
        acc = f"; accepted: {', '.join(accepted)}" if accepted else ""
        super().__init__(f"does not accept parameter {name!r}{acc}")


@dataclass(frozen=True, slots=True)
class RequestInsight:
    """What a policy inferred about a request: its session (given or inferred), the
    agent fingerprint (the key that ends the prefix shared across sessions) and how many
    leading blocks are shared (the anchor)."""

    session: Hashable | None
    fingerprint: Hashable | None
    anchor_blocks: int


@dataclass(frozen=True, slots=True)
class LearnedCounts:
    agents: int = 0
    sessions: int = 0


@dataclass(frozen=True, slots=True)
class PrefetchSettings:
    """Whether a prefetch advisor may advise warm-ups, how many per second, and the
    policy's own predictability gate (0: none)."""

    enabled: bool = True
    rate_per_s: float = math.inf
    r_min: float = 0.0


@dataclass(slots=True)
class RequestContext:
    """What the engine knows about a request when its blocks move.

    ``now_s`` is the policy clock (trace time in sequential replay, engine time in the
    timed simulator, wall clock in vLLM). ``agent_hint`` is client-supplied metadata
    (``vllm_xargs.anchorage.agent``), which a policy may use; ``agent_truth`` is the trace's
    ground-truth label, carried for evaluation only and never read by a policy.
    """

    request_id: Any
    keys: Sequence[Hashable]
    input_length: int
    output_length: int = 0
    now_s: float = 0.0
    session_id: str | None = None
    tenant: str | None = None
    tool_name: str | None = None
    tool_args: Any = None
    agent_hint: str | None = None
    warmup: bool = False
    seq: int = -1  # position in the replayed trace (simulator only; belady uses it)
    agent_truth: str | None = None


def next_in_session(contexts: Sequence[RequestContext]) -> list[RequestContext | None]:
    """Per ``seq`` (0 <= seq < len(contexts)): the context of the same session's next
    request in replay order; None for a session's last request, for requests without a
    session and for seqs no context has. Offline references only: this is the future."""
    out: list[RequestContext | None] = [None] * len(contexts)
    nxt: dict[Any, RequestContext] = {}
    for c in reversed(contexts):
        sid = c.session_id
        if sid is None:
            continue
        if 0 <= c.seq < len(out):
            out[c.seq] = nxt.get(sid)
        nxt[sid] = c
    return out


class EvictionPolicy:
    """Base class: no-op notifications; subclasses implement the victim order."""

    name = "base"
    #: True for policies that need the future and exist only in the simulator.
    offline = False
    #: the pool ``attach`` gave (None before)
    pool: PoolView | None = None

    def attach(self, pool: PoolView) -> None:
        self.pool = pool

    def on_queued(self, ctx: RequestContext) -> None:
        pass

    def on_request(self, ctx: RequestContext) -> None:
        pass

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        pass

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        pass

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        raise NotImplementedError

    def pop_victim(self) -> int | None:
        raise NotImplementedError

    def on_evicted(self, block: int, key: Hashable) -> None:
        pass

    def on_request_done(self, ctx: RequestContext) -> None:
        pass

    def eviction_order(self) -> Iterable[int]:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget all evictable blocks (``reset_prefix_cache``); learned state may stay."""
        raise NotImplementedError

    def state_size_bytes(self) -> int:
        """Approximate size of learned state, excluding per-block side tables."""
        return 0

    # -- introspection (module spec) ------------------------------------------------------

    def model_state_bytes(self) -> int:
        """Size of the learned model alone (no per-session or per-block tables)."""
        return 0

    def last_request(self) -> RequestInsight | None:
        return None

    def fingerprint_of(self, keys: Sequence[Hashable]) -> Hashable | None:
        return None

    def predictability(self) -> float:
        return 0.0

    def next_agent(self, fp: Hashable) -> tuple[Hashable | None, float]:
        """The agent most likely called after ``fp``, and its probability."""
        return None, 0.0

    def session_agent(self, session_id: Hashable) -> Hashable | None:
        """The fingerprint of the agent a session called last."""
        return None

    def predicted_agents(self, k: int = 3) -> list[tuple[Hashable, float]]:
        return []

    def protected_blocks(self) -> dict[str, int]:
        return {"anchor": 0, "session": 0}

    def learned_counts(self) -> LearnedCounts:
        return LearnedCounts()

    def prefetch_settings(self) -> PrefetchSettings:
        return PrefetchSettings()

    def tiering_view(self) -> dict[str, Any] | None:
        return None

    def anchor_labels(self) -> Any:
        """Anchors this replica holds, for routers that read them; None: none kept."""
        return None
