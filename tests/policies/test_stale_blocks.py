"""Group eviction's skipped-block signals: blocks a session's next prompt skipped become
stale (learned reuse through a ghost list) or duplicates (dead at once); the first-request
return model; p_within."""

from __future__ import annotations

import math

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.gap_predictor import GapHistogram
from anchorage.policies.group import DUP, STALE, THREAD, Signals
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool

BS = 16
INF = math.inf


def _req(rid, keys, t, sid="s"):
    return RequestContext(request_id=rid, keys=list(keys), input_length=len(keys) * BS + 1,
                          now_s=t, session_id=sid, seq=rid if isinstance(rid, int) else -1)


def _kinds(pol, pool, keys):
    out = {}
    for k in keys:
        b = pool.get_cached_block(k)
        out[k] = pol.heap.block_group[b].kind if b is not None else None
    return out


def test_skipped_blocks_go_stale_and_recomputed_ones_dup():
    pol = make_policy("hybrid", block_size=BS)
    pool = BlockPool(64, BS, pol)
    pool.free(pool.allocate(_req(1, ["a1", "a2", "a3", "a4", "a5", "a6"], 0.0)))
    assert set(_kinds(pol, pool, ["a1", "a6"]).values()) == {THREAD}
    # the next prompt keeps a1, branches off, and holds a5 further on (recomputed there)
    pool.free(pool.allocate(_req(2, ["a1", "x2", "x3", "x4", "a5"], 1.0)))
    kinds = _kinds(pol, pool, ["a1", "a2", "a3", "a4", "a5", "a6"])
    assert kinds["a1"] == THREAD
    assert kinds["a2"] == kinds["a3"] == kinds["a4"] == kinds["a6"] == STALE
    # a5 has two copies now; the old one is a duplicate, evicted before anything else
    dups = [b for b, g in pol.heap.block_group.items() if g.kind == DUP]
    assert len(dups) == 1 and pool.block_key[dups[0]] == "a5"
    assert list(pol.eviction_order())[0] == dups[0]
    assert pol.model.stale.n == 4


def test_stale_reuse_is_learned_through_ghosts():
    # many sessions each abandon a branch that is never requested again: skipped blocks
    # are learned dead and go before live threads
    pol = make_policy("hybrid", block_size=BS)
    pool = BlockPool(150, BS, pol)
    t = 0.0
    for s in range(40):
        sid = f"s{s}"
        base = [f"{sid}-{i}" for i in range(3)]
        pool.free(pool.allocate(_req(f"{sid}a", base + [f"{sid}-old{i}" for i in range(3)],
                                     t, sid)))
        t += 1.0
        pool.free(pool.allocate(_req(f"{sid}b", base + [f"{sid}-new{i}" for i in range(3)],
                                     t, sid)))
        t += 1.0
    st = pol.model.stale
    assert st.n >= 64 and st.hits == 0
    assert (st.hits + 1) / (st.n + 2) < pol.config.stale.dead_max_reuse  # learned dead
    pol._rescore()  # groups scored before it was learned get the new score
    stale = [g for g in pol.heap.nonempty.values() if g.kind == STALE]
    assert stale and all(g.K == INF for g in stale)
    # a request for an evicted stale key counts as a reuse (the ghost list), hits or not
    evicted_old = next(k for k in pol.model.ghost)
    before = pol.model.stale.hits
    pool.free(pool.allocate(_req("back", [evicted_old], t, "other")))
    assert pol.model.stale.hits == before + 1


def test_without_skips_nothing_goes_stale():
    pol = make_policy("hybrid", block_size=BS)
    pool = BlockPool(64, BS, pol)
    keys = ["k0"]
    for i in range(1, 8):  # each prompt extends the previous one
        keys = keys + [f"k{i}"]
        pool.free(pool.allocate(_req(i, keys, float(i))))
    assert pol.model.stale.n == 0
    assert all(g.kind != STALE for g in pol.heap.block_group.values())


def test_p_within_horizon():
    h = GapHistogram()
    for g in [1.0] * 10 + [100.0] * 10:
        h.add(g)
    h.add_end(5)
    assert h.p_within(0.0, INF) == pytest.approx(20 / 25)
    # within 10 s of e = 0 only the 1 s gaps come back
    assert h.p_within(0.0, 10.0) == pytest.approx(10 / 25, abs=0.02)
    # idle 10 s already: the 1 s gaps are gone; within 10 s nothing more comes
    assert h.p_within(10.0, 10.0) == pytest.approx(0.0, abs=0.02)
    assert h.p_within(10.0, 1000.0) == pytest.approx(10 / 15, abs=0.02)


def _first_request_sessions(signals: Signals):
    # 200 sessions: most send one request and never return; the others send six
    pol = make_policy("hybrid", block_size=BS, global_gaps="wait", signals=signals)
    pool = BlockPool(10_000, BS, pol)
    t = 0.0
    for s in range(200):
        sid = f"s{s}"
        keys = [f"{sid}-{i}" for i in range(2)]
        pool.free(pool.allocate(_req(f"{sid}-0", keys, t, sid)))
        if s % 4 == 0:
            tt = t
            for j in range(1, 6):
                tt += 1.0 if j % 2 else 3.0
                keys = keys + [f"{sid}-x{j}"]
                pool.free(pool.allocate(_req(f"{sid}-{j}", keys, tt, sid)))
        t += 20.0
    pol._rescore()  # ends the idle sessions, learns their ends
    return pol


def test_first_request_sessions_have_their_own_return_model():
    pol = _first_request_sessions(Signals())
    f = pol.model.first
    assert f.n >= 40 and f.ends > f.n  # most first requests were never followed
    assert pol.view._first_ready()
    one = pol.model.sessions["s199"]   # one request so far (s199 % 4 != 0)
    assert one.n == 1 and not one.ended
    w_first = pol.view.session_wait(one, pol._now)
    off = _first_request_sessions(Signals(first=False))  # no evictions: the same learning
    w_all = off.view.session_wait(off.model.sessions["s199"], off._now)
    assert w_first > w_all  # a fresh session is less likely to come back than an average one
