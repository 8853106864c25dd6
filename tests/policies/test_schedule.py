"""The re-scoring schedule of group-scored eviction (``anchorage.policies.group.schedule``):
full re-scorings on their own clock, re-keyings after the events that make keys stale."""

from __future__ import annotations

import math

from anchorage.policies.group.schedule import FULL, NONE, REKEY, Schedule

INF = math.inf


def test_the_first_victim_is_due_for_a_rekeying_and_a_regime_change_too():
    s = Schedule()
    s.start(100.0)
    assert s.due
    s.done(False, 100.5)
    assert not s.due
    s.first_return(False)  # no change of regime
    assert not s.due
    s.first_return(True)
    assert s.due
    s.done(False, 101.0)
    s.first_return(True)
    assert not s.due
    s.first_return(False)  # back to recency's order
    assert s.due


def test_a_rekeying_leaves_the_full_schedule_alone():
    s = Schedule()
    s.start(100.0)
    for _ in range(5):
        assert not s.at_victim(groups=3)
    s.done(False, 101.0)
    assert (s.since_full, s.full_s, s.since_rekey) == (5, 100.0, 0)
    # the full interval runs from the last full re-scoring, not from the re-keying
    assert s.at_request(101.5, 3, rescore_interval=1.0, rekey_interval=INF) == FULL
    s.done(True, 101.5)
    assert (s.since_full, s.full_s) == (0, 101.5)


def test_rekeying_before_the_turnover_needs_time_and_g_victims():
    s = Schedule()
    s.start(0.0)
    s.done(False, 1.0)
    assert s.at_request(2.0, 2, rescore_interval=INF, rekey_interval=0.5) == NONE  # 0 victims
    s.at_victim(2)
    s.at_victim(2)
    assert s.at_request(1.2, 2, rescore_interval=INF, rekey_interval=0.5) == NONE  # too soon
    assert s.at_request(2.0, 2, rescore_interval=INF, rekey_interval=0.5) == REKEY


def test_a_full_rescoring_after_4g_victims_and_at_least_1024():
    s = Schedule()
    assert not any(s.at_victim(groups=10) for _ in range(1024))
    assert s.at_victim(groups=10)
    s.done(True, 0.0)
    assert not any(s.at_victim(groups=300) for _ in range(1200))
    assert s.at_victim(groups=300)
