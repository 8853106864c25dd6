"""One request at a time through a simulated replica with vLLM's host tier
(``anchorage.tiering.sim_offload``), on the trace's clock: the simulator's side of the
engine parity test (``tests/node_agent/test_host_tier_parity.py``), whose engine side runs
the same records through vLLM with ``AnchorageOffloadingConnector``.

Specification
-------------
``sequential(records, capacity_blocks, block_size, host_chunks, host_policy)``: a
``BlockPool`` of ``capacity_blocks`` with vLLM's ``lru`` order, a ``Replica`` whose steps
take no time (the policy clock stays at each record's timestamp, as the engine's replay sets
it), a host tier of ``host_chunks`` chunks (one block each) with links of unbounded
bandwidth (a load is ready at once, as the CPU copy worker's are) and the given host
policy, no temporal part. Each record is submitted at its timestamp and run to completion
before the next; the pending tool of a request is its ``tool_name``, else ``"tool_use"``
when it has a ``tool_duration_ms`` (the engine side sends the same). Returns per request
its GPU and host hit blocks, and the tier's counters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from anchorage.trace.format import TraceRecord


def sequential(records: Sequence[TraceRecord], capacity_blocks: int, block_size: int,
               host_chunks: int, host_policy: str = "anchorage") -> dict[str, Any]:
    from anchorage.policies.registry import make_policy
    from anchorage.pool.block_pool import BlockPool
    from anchorage.sim.engine import Replica, SimRequest
    from anchorage.sim.profiles import PROFILES
    from anchorage.sim.replay import make_contexts
    from anchorage.tiering.host_tier import HostTierConfig, block_bytes
    from anchorage.tiering.params import TieringConfig
    from anchorage.tiering.sim_offload import SimOffload

    prof = PROFILES["cpu-tiny"].with_(capacity_blocks_override=capacity_blocks,
                                      block_size=block_size, max_num_seqs=1)
    bb = block_bytes(prof.model, block_size)
    cfg = TieringConfig(mode="offload", host_policy=host_policy, reload_ahead=False,
                        host=HostTierConfig(capacity_bytes=host_chunks * bb,
                                            d2h_bytes_s=math.inf, h2d_bytes_s=math.inf,
                                            latency_s=0.0))
    ctxs = make_contexts(records)
    for c, r in zip(ctxs, records):
        if c.tool_name is None and r.tool_duration_ms is not None:
            c.tool_name = "tool_use"
    pool = BlockPool(capacity_blocks, block_size, make_policy("lru", block_size=block_size))
    rep = Replica(0, prof, pool, cost=lambda *_: 0.0)
    tier = rep.tiering = SimOffload(rep, cfg, [False] * len(records))
    out = []
    for i, (rec, ctx) in enumerate(zip(records, ctxs)):
        t = rec.timestamp / 1000.0
        req = SimRequest(ctx, t, session=rec.session_id, index=i)
        rep.enqueue(req)
        while rep.has_work:
            plan = rep.plan_step(t)
            if plan is None:
                raise RuntimeError(f"request {i} cannot run")
            rep.finish_step(plan)
        out.append({"gpu": req.hit_blocks, "host": req.host_hit_blocks,
                    "held": sorted(tier.store.policy.chunks)})
    return {"requests": out, "counters": tier.counters(), "block_bytes": bb,
            "used_chunks": tier.store.used_chunks}
