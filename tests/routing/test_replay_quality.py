"""Trace-replay check of placement quality: route a generated multi-agent workload over
4 replicas (loads from a sliding window of in-flight requests), then replay each
replica's requests through its own vLLM-faithful LRU pool. Agent-aware placement must
beat round robin's fleet hit rate; every request is routed exactly once."""

from collections import deque

import pytest

from anchorage.policies.registry import make_policy
from anchorage.routing import make_router
from anchorage.routing.base import ReplicaView
from anchorage.sim.replay import make_contexts, replay
from anchorage.trace.generate import generate

REPLICAS, CAPACITY, BS = 4, 2500, 16


@pytest.fixture(scope="module")
def contexts():
    _, recs = generate("random", 12, 120, seed=3, block_size=BS, concurrency=16)
    return make_contexts(recs)


def fleet_hit_rate(name, contexts):
    router = make_router(name)
    inflight: deque = deque()
    loads = [0] * REPLICAS
    per = [[] for _ in range(REPLICAS)]
    for c in contexts:
        if len(inflight) >= 16:                 # ~16 concurrent requests
            loads[inflight.popleft()] -= 1
        views = [ReplicaView(index=i, running=loads[i], capacity_blocks=CAPACITY)
                 for i in range(REPLICAS)]
        p = router.pick(c, views)
        router.on_start(c, p)
        loads[p] += 1
        inflight.append(p)
        per[p].append(c)
    assert sum(map(len, per)) == len(contexts)
    hits = total = 0
    for reqs in per:
        res = replay(reqs, CAPACITY, BS, make_policy("lru", block_size=BS))
        hits += res.hit_blocks
        total += res.prompt_blocks
    return hits / total


def test_agent_placement_beats_round_robin(contexts):
    rates = {n: fleet_hit_rate(n, contexts) for n in ("round_robin", "prefix", "agent")}
    assert rates["agent"] > rates["round_robin"] + 0.10, rates
    assert rates["prefix"] > rates["round_robin"], rates
