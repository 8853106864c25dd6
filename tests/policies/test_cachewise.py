"""cachewise: gap histograms (E[tau - e | tau > e], survival), predictor fallback, argument
clusters, admission order, tool-aware eviction order, the oracle."""

from __future__ import annotations

import pytest

from anchorage.policies.admission import admission_order, admission_priority
from anchorage.policies.base import RequestContext
from anchorage.policies.gap_predictor import GapHistogram, GapPredictor
from anchorage.policies.registry import is_offline, make_policy
from anchorage.policies.tool_clusters import ArgClusterer, args_text
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.replay import replay
from tests.policies.agent_workload import pipeline_workload, unique_blocks


def _hist(samples, ends=0):
    h = GapHistogram()
    for s in samples:
        h.add(s)
    h.add_end(ends)
    return h


def test_conditional_remaining_time():
    h = _hist([1.0] * 10 + [100.0] * 10)
    # e = 0: all mass beyond; E[tau] = 50.5
    assert h.remaining(0.0) == pytest.approx(50.5)
    # e = 10 s: only the 100 s samples remain: E[tau - e | tau > e] = 90
    assert h.remaining(10.0) == pytest.approx(90.0)
    # a longer wait means a shorter remaining time for a light-tailed mass
    assert h.remaining(80.0) < h.remaining(10.0)
    assert h.p_return(10.0) == pytest.approx(1.0)


def test_survival_with_ends_and_expected_wait():
    h = _hist([1.0] * 10 + [100.0] * 10, ends=10)
    assert h.p_return(0.0) == pytest.approx(20 / 30)
    assert h.p_return(10.0) == pytest.approx(10 / 20)  # past the short gaps
    assert h.expected_wait(10.0) == pytest.approx(90.0 / 0.5)
    only_ends = _hist([], ends=5)
    assert only_ends.p_return(1.0) == 0.0
    assert only_ends.expected_wait(1.0) > 1.0  # floored probability, never a division by 0


def test_quantile_and_bins():
    h = _hist([0.5] * 99 + [1000.0])
    assert 0.5 <= h.quantile(0.5) <= 1.1
    assert h.quantile(1.0) >= 1000.0
    assert GapHistogram().quantile(0.9) == 0.0


def test_predictor_uses_most_specific_histogram_with_enough_samples():
    p = GapPredictor(min_samples=5)
    assert p.predict(0.0, "bash") is None  # nothing learned: no signal
    for _ in range(5):
        p.observe(60.0, "bash", "pytest")
        p.observe(0.1, "read", None)
    assert p.specific("bash", "pytest") is not None
    assert p.specific("bash", "git") is p.specific("bash")  # falls back to the tool
    assert p.specific("write") is None
    assert p.histogram("write") is p.global_hist
    assert p.predict(0.0, "bash", "pytest") > p.predict(0.0, "read")
    p.observe_end("bash", "pytest")
    p.retract_end("bash", "pytest")
    assert p.global_hist.ends == 0


def test_arg_clusters_tfidf_kmeans_and_signature():
    calls = ([("bash", {"command": f"pytest tests/test_{i}.py"}) for i in range(6)]
             + [("bash", {"command": f"git status {i}"}) for i in range(6)])
    c = ArgClusterer(k_max=2, seed=0).fit(calls)
    assert c.fitted_tools == ["bash"]
    a = c.cluster("bash", {"command": "pytest tests/test_x.py"})
    b = c.cluster("bash", {"command": "git status"})
    assert a != b
    assert c.cluster("bash", {"command": "pytest tests/test_y.py"}) == a
    # a tool never fitted: the argument signature
    assert c.cluster("grep", "Foo bar baz") == "foo bar"
    assert args_text({"b": 1, "a": "X"}) == "a=x b=1"


def test_admission_order_fewest_new_blocks_with_aging():
    reqs = [("big", 100, 0.0), ("small", 2, 9.0), ("mid", 10, 8.0)]
    order = admission_order(reqs, new_blocks=lambda r: r[1], arrival_s=lambda r: r[2],
                            now_s=10.0, aging_s_per_block=1.0)
    assert [r[0] for r in order] == ["small", "mid", "big"]
    # later, fresh small requests keep coming: the big one, having waited, goes first
    later = [reqs[0], ("fresh", 2, 199.0)]
    order = admission_order(later, new_blocks=lambda r: r[1], arrival_s=lambda r: r[2],
                            now_s=200.0, aging_s_per_block=1.0)
    assert order[0][0] == "big"  # no starvation
    with pytest.raises(ValueError):
        admission_priority(1, 0.0, 0.0)


def _req(i, sid, keys, t, tool):
    return RequestContext(request_id=i, keys=keys, input_length=len(keys) * 16, now_s=t,
                          session_id=sid, tool_name=tool, seq=i)


def test_session_waiting_on_a_long_tool_is_evicted_first():
    pol = make_policy("cachewise", block_size=16, min_samples=4)
    pool = BlockPool(10_000, 16, pol)
    i = 0
    # teach: after "read" the session is back in 1 s, after "build" in 100 s
    for s in range(6):
        for tool, gap in (("read", 1.0), ("build", 100.0)):
            t0 = s * 1000.0 + (0 if tool == "read" else 500)
            sid = f"learn{s}{tool}"
            for k in range(2):
                pool.free(pool.allocate(_req(i, sid, [i * 10 + j for j in range(3)],
                                             t0 + k * gap, tool)))
                i += 1
    t = 10_000.0
    # LRU would evict "short" first (freed earlier); cachewise evicts "long" first
    pool.free(pool.allocate(_req(i, "short", [900_001, 900_002], t, "read")))
    pool.free(pool.allocate(_req(i + 1, "long", [800_001, 800_002], t + 0.5, "build")))
    order = list(pol.eviction_order())
    long_blocks = [pool.get_cached_block(k) for k in (800_001, 800_002)]
    short_blocks = [pool.get_cached_block(k) for k in (900_001, 900_002)]
    assert order.index(long_blocks[0]) < order.index(short_blocks[0])
    pool.check_invariants()


def test_cachewise_helps_on_tool_workload_and_oracle_is_offline():
    ctxs = pipeline_workload(seed=4, agents=4, sessions=40, steps=8)
    cap = max(unique_blocks(ctxs) // 20, 64)
    lru = replay(ctxs, cap, 16, make_policy("lru")).hit_rate
    cw = replay(ctxs, cap, 16, make_policy("cachewise")).hit_rate
    assert cw >= lru
    assert is_offline("cachewise-oracle")
    with pytest.raises(ValueError):
        make_policy("cachewise-oracle")
    orc = replay(ctxs, cap, 16, make_policy("cachewise-oracle", contexts=ctxs)).hit_rate
    assert orc >= lru
