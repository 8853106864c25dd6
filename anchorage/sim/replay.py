"""Sequential replay: requests one at a time through one block pool (no timing).

Each request is admitted (prefix lookup, touch, allocation, caching of its full prompt
blocks), decodes its ``output_length`` tokens (blocks filled by generated tokens are cached
under fresh keys, as vLLM hashes them), and frees its blocks. The policy clock is the
trace timestamp. A request whose prompt is larger than the whole pool cannot run (vLLM
would reject it); it is counted in ``oversize`` and as a miss. Generation stops when the
request fills the whole pool (vLLM stops at ``max_model_len``, which the pool must hold).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Iterable, Sequence

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from anchorage.trace.format import TraceRecord


def record_keys(rec: TraceRecord, isolate_tenants: bool = True) -> list[Hashable]:
    """Block keys of a record: its hash ids, salted by tenant when tenants are isolated
    (the same salt vLLM's ``cache_salt`` applies: no prefix is shared across tenants)."""
    if isolate_tenants and rec.tenant is not None:
        t = rec.tenant
        return [(t, h) for h in rec.hash_ids]
    return rec.hash_ids


def make_contexts(records: Iterable[TraceRecord], isolate_tenants: bool = True) -> list[RequestContext]:
    out = []
    for i, r in enumerate(records):
        out.append(RequestContext(
            request_id=i, keys=record_keys(r, isolate_tenants), input_length=r.input_length,
            output_length=r.output_length, now_s=r.timestamp / 1000.0,
            session_id=r.session_id, tenant=r.tenant, tool_name=r.tool_name,
            tool_args=r.tool_args, seq=i, agent_truth=r.agent,
        ))
    return out


@dataclass
class ReplayResult:
    policy: str
    hit_rate: float
    token_hit_rate: float
    hit_blocks: int
    prompt_blocks: int
    evictions: int
    us_per_request: float
    requests: int = 0
    oversize: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return d


def infinite_hit_rate(contexts: Sequence[RequestContext], block_size: int) -> float:
    """Block-weighted hit rate of an unbounded cache (same hit rules as the pool)."""
    seen: set = set()
    hits = total = 0
    for c in contexts:
        keys = c.keys
        limit = min(len(keys), (c.input_length - 1) // block_size) if c.input_length else 0
        n = 0
        while n < limit and keys[n] in seen:
            n += 1
        hits += n
        total += len(keys)
        seen.update(keys[: min(len(keys), c.input_length // block_size)])
    return hits / total if total else 0.0


def replay(contexts: Sequence[RequestContext], capacity_blocks: int, block_size: int,
           policy: EvictionPolicy, *, include_output: bool = True,
           progress: Callable[[int], None] | None = None, check_every: int = 0) -> ReplayResult:
    """Replay ``contexts`` through one pool. ``check_every`` > 0 checks the pool's
    invariants every so many requests (tests)."""
    pool = BlockPool(capacity_blocks, block_size, policy)
    oversize = 0
    t0 = time.perf_counter()
    for i, ctx in enumerate(contexts):
        total = ctx.input_length + (max(ctx.output_length - 1, 0) if include_output else 0)
        total = min(total, capacity_blocks * block_size)
        if pool.blocks_needed(ctx.input_length) > capacity_blocks:
            oversize += 1
            pool.stats.requests += 1
            pool.stats.prompt_blocks += len(ctx.keys)
            pool.stats.prompt_tokens += ctx.input_length
            policy.on_request(ctx)
            policy.on_request_done(ctx)
            continue
        alloc = pool.allocate(ctx)
        if alloc is None:  # cannot happen sequentially: every block is free between requests
            raise RuntimeError("sequential replay found the pool full")
        if include_output and total > ctx.input_length:
            pool.grow(alloc, total)
            pool.cache_generated_blocks(alloc, total)
        pool.free(alloc)
        if check_every and i % check_every == 0:
            pool.check_invariants()
        if progress is not None:
            progress(i)
    elapsed = time.perf_counter() - t0
    st = pool.stats
    n = max(1, len(contexts))
    return ReplayResult(
        policy=policy.name, hit_rate=st.hit_rate, token_hit_rate=st.token_hit_rate,
        hit_blocks=st.hit_blocks, prompt_blocks=st.prompt_blocks, evictions=st.evictions,
        us_per_request=elapsed / n * 1e6, requests=st.requests, oversize=oversize,
    )


def run_policies(contexts: Sequence[RequestContext], capacity_blocks: int, block_size: int,
                 policies: Sequence[str], *, params: dict[str, dict[str, Any]] | None = None,
                 include_output: bool = True,
                 progress_factory: Callable[[str], Callable[[int], None] | None] | None = None,
                 ) -> list[ReplayResult]:
    out = []
    for name in policies:
        pol = make_policy(name, block_size=block_size, contexts=contexts,
                          params=(params or {}).get(name))
        prog = progress_factory(name) if progress_factory else None
        res = replay(contexts, capacity_blocks, block_size, pol, include_output=include_output,
                     progress=prog)
        res.policy = name
        out.append(res)
    return out
