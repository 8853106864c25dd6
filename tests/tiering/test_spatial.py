import pytest

from anchorage.policies.transitions import TransitionLearner
from anchorage.tiering import spatial as sp

P = sp.SpatialParams()


def test_reserved_fraction_follows_usage_and_is_capped():
    assert sp.reserved_fraction(0.3, P) == 0.0
    assert sp.reserved_fraction(0.5, P) == 0.0
    assert sp.reserved_fraction(0.7, P) == pytest.approx(0.15)
    assert sp.reserved_fraction(0.9, P) == pytest.approx(0.3)
    assert sp.reserved_fraction(1.0, P) == pytest.approx(0.3)


def test_critical_agents_are_the_top_three_quarters():
    scores = {"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05, "e": 0.0}
    assert sp.critical_agents(scores, P) == ["a", "b", "c"]
    assert sp.critical_agents(scores, sp.SpatialParams(ratio=0.25)) == ["a"]
    assert sp.critical_agents({}, P) == []


def test_split_sums_to_the_total_and_weighs_usage_and_score():
    usage = {"a": 300, "b": 100}
    scores = {"a": 0.5, "b": 0.5}
    out = sp.split_reservation(100, ["a", "b"], usage, scores, P)
    assert sum(out.values()) == 100
    # a: 0.5 x 0.75 + 0.5 x 0.5 = 62.5 %, b: 37.5 %
    assert out["a"] in (62, 63) and out["b"] in (37, 38)
    only_usage = sp.split_reservation(100, ["a", "b"], usage, scores,
                                      sp.SpatialParams(alpha=1.0))
    assert only_usage == {"a": 75, "b": 25}


def test_split_gives_a_memory_light_critical_agent_a_share():
    out = sp.split_reservation(90, ["a", "b"], {"a": 500}, {"a": 0.2, "b": 0.6}, P)
    assert out["b"] > 0 and sum(out.values()) == 90
    assert sp.split_reservation(0, ["a"], {"a": 1}, {"a": 1}, P) == {}
    assert sp.split_reservation(10, [], {}, {}, P) == {}


def test_agent_scores_and_criticality():
    s = sp.agent_scores(flow={"a": 1.0, "b": 0.0}, queue={"b": 3}, usage={"a": 10, "b": 10},
                        active={"a": 1, "b": 1})
    assert s["a"] == pytest.approx(0.4 + 0.15 * 0.5 + 0.15 * 0.5)
    assert s["b"] == pytest.approx(0.3 + 0.15 * 0.5 + 0.15 * 0.5)
    c = sp.criticality(s)
    assert c["a"] == 1.0 and 0 < c["b"] < 1


def test_transition_flow_counts_where_the_workflow_goes():
    t = TransitionLearner()
    for _ in range(20):
        t.observe("planner", "coder")
        t.observe("coder", "reviewer")
        t.observe("reviewer", "coder")
    f = sp.transition_flow(t, ["planner", "coder", "reviewer"])
    assert f["coder"] > f["reviewer"] > f["planner"]
    assert sp.transition_flow(TransitionLearner(), ["x"]) == {"x": 0.0}


def test_admission_rank_boosts_critical_agents_without_starving_others():
    key = lambda r: sp.admission_rank(*r)
    reqs = [(False, 0.0, 10.0), (False, 1.0, 10.5), (False, 1.0, 12.0), (True, 0.0, 20.0)]
    order = sorted(reqs, key=key)
    assert order[0] == (True, 0.0, 20.0)             # preempted first
    assert order[1] == (False, 1.0, 10.5)            # overtakes one 0.5 s older
    assert order[2] == (False, 0.0, 10.0)            # not overtaken by one 2 s younger
    assert order[3] == (False, 1.0, 12.0)
