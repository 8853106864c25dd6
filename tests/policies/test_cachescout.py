"""cachescout: fingerprints, per-session transitions (eq. 3), R (eq. 2), prefetch advisor."""

from __future__ import annotations

import math

import pytest

from anchorage.fingerprint import PrefixOwnership
from anchorage.policies.base import RequestContext
from anchorage.policies.cachescout import PrefetchAdvisor
from anchorage.policies.registry import make_policy
from anchorage.policies.transitions import END, TransitionLearner
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.replay import replay
from tests.policies.agent_workload import pipeline_workload, unique_blocks


# -- transition learner ---------------------------------------------------------------------

def test_smoothing_matches_eq3():
    t = TransitionLearner(eps=0.1)
    for _ in range(3):
        t.observe("a", "b")
    t.observe("a", "c")
    n_targets = 4  # a, b, c, END
    assert t.n_targets() == n_targets
    assert t.prob("a", "b") == pytest.approx((3 + 0.1) / (4 + 0.1 * n_targets))
    assert t.prob("a", "a") == pytest.approx(0.1 / (4 + 0.1 * n_targets))
    assert sum(t.row("a").values()) == pytest.approx(1.0)
    assert t.prob("b", "a") == pytest.approx(1 / n_targets)  # unseen row: uniform
    assert t.next_agent("a") == ("b", pytest.approx(3.1 / 4.4))


def test_eps_must_be_positive():
    with pytest.raises(ValueError):
        TransitionLearner(eps=0)


def test_predictability_R():
    assert TransitionLearner().predictability() == 0.0
    det = TransitionLearner(eps=0.01)
    for _ in range(200):
        det.observe("a", "b")
        det.observe("b", "c")
        det.observe("c", "a")
    assert det.predictability() > 0.8
    ind = TransitionLearner(eps=0.01)
    for i in "abc":
        for j in "abc":
            for _ in range(50):
                ind.observe(i, j)
    assert ind.predictability() < 0.02
    # R by hand on a 2-agent chain without smoothing effects: rows (0.9, 0.1), (0.1, 0.9)
    t = TransitionLearner(eps=1e-9)
    for _ in range(90):
        t.observe("x", "x")
        t.observe("y", "y")
    for _ in range(10):
        t.observe("x", "y")
        t.observe("y", "x")

    def H(ps):
        return -sum(p * math.log(p) for p in ps if p > 0)

    expect = 1 - H([0.9, 0.1]) / H([0.5, 0.5])
    assert t.predictability() == pytest.approx(expect, abs=1e-6)


def test_reach_two_steps():
    t = TransitionLearner(eps=1e-9)
    for _ in range(10):
        t.observe("a", "b")
        t.observe("b", "c")
    p, steps = t.reach("a", "c")
    assert p == pytest.approx(1.0, abs=1e-6) and steps == pytest.approx(2.0, abs=1e-6)
    p, steps = t.reach("a", "b")
    assert p == pytest.approx(1.0, abs=1e-6) and steps == pytest.approx(1.0, abs=1e-6)


def test_agent_table_is_bounded():
    t = TransitionLearner(max_agents=3)
    for i in range(10):
        t.observe(i, i + 1)
    assert len(t.agents) <= 3
    assert t.total == pytest.approx(sum(t.count(i, j) for i in t.agents
                                        for j in t.agents + [END]))


# -- fingerprints -----------------------------------------------------------------------------

def test_fingerprint_is_the_shared_prefix_and_ignores_what_follows():
    po = PrefixOwnership()
    anchor = [1, 2, 3]
    po.observe(anchor + [10, 11], "s1")
    assert po.fingerprint(anchor + [10, 11]) == 1  # one session so far: first block
    po.observe(anchor + [20], "s2")
    assert po.anchor_length(anchor + [30, 31, 32]) == 3
    for n in range(6):                      # the binary search agrees with the scan
        keys = (anchor + [20, 30, 31])[:n]
        assert po.shared_prefix_len(keys) == po.anchor_length(keys)
    assert po.fingerprint(anchor + [30, 31, 32]) == 3
    assert po.fingerprint(anchor + [99]) == 3
    po.observe([1, 7, 8], "s3")  # another agent sharing only the first block
    assert po.fingerprint([1, 7, 8]) == 7 or po.anchor_length([1, 7, 8]) == 1
    assert po.fingerprint([]) is None


def test_session_inferred_from_prefix_continuity():
    po = PrefixOwnership()
    po.observe([1, 2, 3, 4], "s1")
    po.note_tail(4, "s1")
    po.observe([1, 2, 9], "s2")  # 1, 2 (a common system prompt) now shared
    po.note_tail(9, "s2")
    assert po.infer_session([1, 2, 3, 4, 5]) == "s1"  # extends s1's last prompt
    assert po.infer_session([1, 2, 3, 4, 6]) is None  # a second extension is a branch
    assert po.infer_session([1, 2, 9, 10]) == "s2"
    assert po.infer_session([1, 2, 3]) is None  # shares a prefix, continues nothing
    assert po.infer_session([1, 2, 50]) is None  # only the common system prompt
    assert po.infer_session([77]) is None


def test_prefix_table_is_bounded():
    po = PrefixOwnership(max_keys=100)
    for i in range(50):
        po.observe(list(range(i * 10, i * 10 + 10)), f"s{i}")
    assert len(po) <= 100
    with pytest.raises(ValueError):
        PrefixOwnership(max_keys=0)


# -- the policy -------------------------------------------------------------------------------

def test_transitions_are_learned_per_session_not_from_interleaving():
    ctxs = pipeline_workload(seed=1, agents=4, sessions=20, steps=6, topology="pipeline")
    pol = make_policy("cachescout", block_size=16)
    replay(ctxs, 10_000, 16, pol)
    t = pol.model.trans
    # every learned transition is agent i -> i+1 of the pipeline (or END): check via R and
    # that each row has one dominant successor
    assert t.predictability() > 0.6
    for a in t.agents:
        nxt, p = t.next_agent(a)
        if nxt is not None and t.count(a, nxt) >= 5:
            assert p > 0.8


def test_warmup_requests_do_not_learn():
    pol = make_policy("cachescout", block_size=16)
    pool = BlockPool(1000, 16, pol)
    anchors = {a: [a * 100 + i for i in range(4)] for a in (1, 2)}
    t = 0.0
    for s in range(3):
        for a in (1, 2):
            t += 1
            c = RequestContext(request_id=(s, a), keys=anchors[a] + [s * 1000 + a],
                               input_length=80, now_s=t, session_id=f"s{s}")
            pool.free(pool.allocate(c))
    before = (pol.model.trans.total, dict(pol.model.at_agent), pol.model.gaps.global_hist.n)
    w = RequestContext(request_id="w", keys=anchors[2], input_length=64, now_s=t + 1,
                       session_id="s0", warmup=True)
    pool.free(pool.allocate(w))
    assert (pol.model.trans.total, dict(pol.model.at_agent), pol.model.gaps.global_hist.n) == before
    pool.check_invariants()


def test_prefetch_advisor_predicts_next_agent_and_gates_on_R():
    ctxs = pipeline_workload(seed=2, agents=4, sessions=30, steps=8, topology="pipeline")
    pol = make_policy("cachescout", block_size=16)
    replay(ctxs, 10_000, 16, pol)
    adv = PrefetchAdvisor(pol, r_min=0.3)
    sid = ctxs[-1].session_id
    a = adv.advise(sid)
    assert a.R >= 0.3 and a.gate_open
    assert a.next_agent is not None and a.probability > 0.5
    assert a.next_agent != a.current_agent
    # the whole cache holds every anchor here, so nothing needs warming
    assert a.anchors_to_warm == []
    closed = PrefetchAdvisor(pol, r_min=1.01).advise(sid)
    assert not closed.gate_open and closed.anchors_to_warm == []
    cands = adv.warm_candidates(2)
    assert len(cands) <= 2 and all(score >= 0 for _, score in cands)
    unknown = adv.advise("no-such-session")
    assert unknown.next_agent is None and unknown.anchors_to_warm == []


def test_state_is_small_with_24_agents():
    ctxs = pipeline_workload(seed=3, agents=24, sessions=120, steps=10, topology="random")
    for name in ("cachescout", "hybrid"):
        pol = make_policy(name, block_size=16)
        replay(ctxs, max(unique_blocks(ctxs) // 10, 64), 16, pol)
        assert pol.learned_counts().agents >= 24
        assert pol.model_state_bytes() <= 25 * 1024, name
        assert pol.state_size_bytes() == pol.model_state_bytes() + 64 * pol.learned_counts().sessions
