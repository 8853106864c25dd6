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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Hashable, Iterable, Sequence

if TYPE_CHECKING:
    from anchorage.pool.block_pool import BlockPool


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

    def attach(self, pool: "BlockPool") -> None:
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
