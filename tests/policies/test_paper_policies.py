"""The seed papers' eviction rules as published: CacheScout eq. 7-9, CacheWise's
E[tau | tau > elapsed] order."""

import math

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.cachescout_paper import (
    CacheScoutPaperPolicy,
    hop_distances,
    score,
    survival,
)
from anchorage.policies.cachewise_paper import CacheWisePaperPolicy
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool


def test_cachescout_equations():
    assert survival(0, 3) == 1.0 and survival(1, 3) == pytest.approx(2 / 3)
    assert survival(5, 3) == 0.0 and survival(math.inf, 3) == 0.0
    assert score(1.0, 0, 16, 0.05, 0.01) == pytest.approx(1.05 * 1.05 * 16)
    assert score(0.0, 100, 16, 0.05, 0.01) == pytest.approx(0.05 * (math.exp(-1) + 0.05) * 16)
    # thresholded graph: a -> b (0.8), a -> c (0.2); tau 0.3 keeps only a -> b -> d
    counts = {"a": {"b": 8, "c": 2}, "b": {"d": 1}}
    assert hop_distances(counts, "a", 0.3) == {"a": 0, "b": 1, "d": 2}
    assert hop_distances(counts, "a", 0.1) == {"a": 0, "b": 1, "c": 1, "d": 2}


def _req(rid, keys, now, agent=None, session=None, tool=None, args=None):
    return RequestContext(request_id=rid, keys=keys, input_length=len(keys) * 16 + 1,
                          output_length=1, now_s=now, agent_hint=agent, session_id=session,
                          tool_name=tool, tool_args=args)


def _run(pool, ctx):
    a = pool.allocate(ctx)
    pool.free(a)


def test_cachescout_paper_protects_the_predicted_next_agent():
    pol = CacheScoutPaperPolicy(tau=0.3, e_max=2, lam=0.0)
    pool = BlockPool(12, 16, pol)
    # learned chain A -> B -> A -> B ...: from A the next agent is B (1 hop)
    t = 0.0
    for i in range(3):
        for agent, base in (("A", 100), ("B", 200)):
            t += 1.0
            _run(pool, _req((agent, i), [base, base + 1, base + 2], t, agent=agent))
    _run(pool, _req("C", [300, 301, 302], t + 1, agent="C"))   # C: never a successor
    _run(pool, _req("A2", [100, 101, 102], t + 2, agent="A"))  # now at A
    # blocks of C (survival 0) go before B's (1 hop) and A's (0 hops)
    order = list(pol.eviction_order())
    ag = [pol.agent_of[b] for b in order]
    assert ag[:3] == [("hint", "C")] * 3
    assert ("hint", "A") not in ag[:6]


def test_cachewise_paper_evicts_idle_then_the_longest_expected_remaining_tool_time():
    pol = CacheWisePaperPolicy(min_samples=1, rebuild_s=1e9)
    pool = BlockPool(64, 16, pol)
    # learn: "pytest" takes 100 s, "ls" 1 s
    for i, (tool, gap) in enumerate([("pytest", 100.0), ("ls", 1.0)] * 3):
        sid = f"learn{i}"
        _run(pool, _req((sid, 0), [1000 + 10 * i], 0.0, session=sid, tool=tool))
        _run(pool, _req((sid, 1), [1000 + 10 * i, 1001 + 10 * i], gap, session=sid))
    _run(pool, _req("p", [1, 2], 200.0, session="p", tool="pytest", args="pytest tests/"))
    _run(pool, _req("l", [5, 6], 200.0, session="l", tool="ls", args="ls -la"))
    _run(pool, _req("h", [8, 9], 200.0, session="h"))          # no tool: a human turn
    pol.now = 201.0
    pol._rebuild()
    keys = [pool.block_key[b] for b in pol.eviction_order()]
    first = [k for k in keys if k in (1, 2, 5, 6, 8, 9)]
    assert first[:2] == [9, 8]            # idle first, a chain's tail first
    assert first.index(2) < first.index(6)  # pytest (99 s left) before ls (0 s left)


def test_registry_knows_the_paper_policies():
    assert make_policy("cachescout-paper").name == "cachescout-paper"
    assert make_policy("cachewise-paper", warm_start=[("bash", "ls"), ("bash", "pytest a"),
                                                      ("bash", "pytest b")]).name
    with pytest.raises(ValueError):
        CacheScoutPaperPolicy(tau=0.0)
