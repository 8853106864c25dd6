"""hybrid's operator-tuned parameters: accepted by name, validated, and each one changes
the eviction order (and only where its spec says)."""

from __future__ import annotations

import pytest

from anchorage.autoscale.params import POLICY_KWARGS, flatten, policy_kwargs
from anchorage.policies.cachescout import PrefetchAdvisor
from anchorage.policies.group import ANCHOR, TUNING_DEFAULTS
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from tests.policies.agent_workload import pipeline_workload, unique_blocks

CTXS = pipeline_workload(seed=3, agents=4, sessions=40, steps=8, horizon_s=900.0)
# no tools: sessions are ordered by recency scaled by their return probability
NO_TOOLS = pipeline_workload(seed=3, agents=4, sessions=40, steps=8, horizon_s=900.0,
                             tools=False)
CAP = max(unique_blocks(CTXS) // 12, 64)


def _run(ctxs=CTXS, **params):
    """(hits, eviction order at the end) of hybrid with ``params`` on a pipeline trace."""
    pol = make_policy("hybrid", block_size=16, **params)
    pool = BlockPool(CAP, 16, pol)
    for c in ctxs:
        pool.free(pool.allocate(c))
    return pool.stats.hit_blocks, list(pol.eviction_order()), pol


def test_every_operator_parameter_is_a_hybrid_keyword():
    assert set(POLICY_KWARGS.values()) == set(TUNING_DEFAULTS)
    crd = {"survivalThreshold": 0.3, "horizon": 120, "recencyScale": 30, "rMin": 0.6,
           "prefetch": {"enabled": True, "ratePerSecond": 2}}
    pol = make_policy("hybrid", block_size=16, params=policy_kwargs(flatten(crd)))
    t = pol.config.tuning
    assert (t.survival_threshold, t.horizon_s, t.recency_scale_s, t.r_min,
            t.prefetch, t.prefetch_rate_per_s) == (0.3, 120.0, 30.0, 0.6, True, 2.0)
    for name in ("cachescout", "cachewise"):  # the CRD offers them too
        assert make_policy(name, block_size=16, horizon_s=60).config.tuning.horizon_s == 60.0


def test_defaults_are_the_untuned_policy():
    explicit = dict(TUNING_DEFAULTS)
    assert _run()[:2] == _run(**explicit)[:2]


@pytest.mark.parametrize("params", [
    {"horizon_s": 5.0},
    {"survival_threshold": 0.5, "horizon_s": 10.0},
    {"survival_threshold": 0.9},
    {"recency_scale_s": 1.0},
    {"r_min": 0.99},
])
def test_each_eviction_parameter_changes_the_order(params):
    # recency_scale_s acts on unscored (recency-ordered) groups: the trace without tools
    changed = [_run(ctxs)[:2] != _run(ctxs, **params)[:2] for ctxs in (CTXS, NO_TOOLS)]
    assert any(changed), params


def test_horizon_and_threshold_put_far_or_unlikely_groups_first():
    # a short horizon: a thread whose session is expected back after it gets K = inf
    _, _, pol = _run(horizon_s=5.0)
    ks = [g.K for g in pol.heap.nonempty.values() if g.K is not None]
    assert any(k == float("inf") for k in ks)
    # threshold 1 within 1 ms: no session is sure to come back that soon, so every scored
    # thread is low-survival (an anchor in use right now, T = 0, is the only exception)
    _, _, pol = _run(survival_threshold=1.0, horizon_s=0.001)
    scored = [g for g in pol.heap.nonempty.values() if g.K is not None]
    assert len(scored) >= 5
    assert all(g.K == float("inf") or g.kind == ANCHOR for g in scored)
    assert sum(g.K == float("inf") for g in scored) >= len(scored) - 1


def test_r_min_gates_transitions():
    _, _, pol = _run(r_min=0.99)
    assert pol.model.R < 0.99  # learned, but below the gate: no transition terms
    assert all(g.mult == 1.0 and g.add == 0.0 for g in pol.heap.nonempty.values())


def test_prefetch_parameters_drive_the_advisor():
    _, _, on = _run(prefetch=True, prefetch_rate_per_s=2.0, r_min=0.0)
    _, _, off = _run(prefetch=False)
    sid = CTXS[-1].session_id
    a_on, a_off = PrefetchAdvisor(on).advise(sid), PrefetchAdvisor(off).advise(sid)
    assert a_on.R == a_off.R > PrefetchAdvisor(on).r_min and a_on.gate_open
    assert not a_off.gate_open and a_off.anchors_to_warm == []
    assert PrefetchAdvisor(on).budget(10.0) == 20 and PrefetchAdvisor(off).budget(10.0) == 0
    # a positive r_min is the advisor's gate too
    assert PrefetchAdvisor(make_policy("hybrid", r_min=0.7)).r_min == 0.7
    assert PrefetchAdvisor(make_policy("hybrid")).r_min == 0.3


@pytest.mark.parametrize("params, msg", [
    ({"survival_threshold": 1.5}, "survival_threshold must be in [0, 1]"),
    ({"survival_threshold": -0.1}, "survival_threshold must be in [0, 1]"),
    ({"horizon_s": 0}, "horizon_s must be in (0, inf]"),
    ({"recency_scale_s": -3}, "recency_scale_s must be in (0, inf]"),
    ({"r_min": 2}, "r_min must be in [0, 1]"),
    ({"r_min": "high"}, "r_min must be a number"),
    ({"prefetch": "yes"}, "prefetch must be true or false"),
    ({"prefetch_rate_per_s": -1}, "prefetch_rate_per_s must be in [0, inf]"),
    ({"horizon_s": float("nan")}, "horizon_s must be a number"),
])
def test_bad_values_are_clear_errors(params, msg):
    with pytest.raises(ValueError) as e:
        make_policy("hybrid", block_size=16, **params)
    assert msg in str(e.value)


def test_unknown_parameter_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="does not accept parameter 'horizon'"):
        make_policy("hybrid", block_size=16, horizon=30)
    with pytest.raises(TypeError, match="does not accept parameter 'horizon_s'"):
        make_policy("lru", horizon_s=30)
