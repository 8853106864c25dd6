"""Every online policy must handle overlapping requests (as in vLLM and the timed
simulator): notifications of several requests interleave, and a request finishes long
after others have started. Regression for per-request state kept in a "current request"
slot instead of being keyed by request id."""

import random

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy, policy_names
from anchorage.pool.block_pool import BlockPool

ONLINE = policy_names(include_offline=False)


def ctx(i, session, keys, t, **kw):
    return RequestContext(request_id=i, keys=keys, input_length=len(keys) * 4, now_s=t,
                          session_id=session, **kw)


@pytest.mark.parametrize("name", ONLINE)
def test_interleaved_sessions(name):
    pool = BlockPool(20, 4, make_policy(name, block_size=4))
    a = pool.allocate(ctx(1, "A", ["a1", "a2"], 0.0, tool_name="grep"))
    b = pool.allocate(ctx(2, "B", ["b1", "b2"], 0.1))
    a.ctx.now_s = 1.0
    pool.free(a)
    b.ctx.now_s = 2.0
    pool.free(b)
    c = pool.allocate(ctx(3, "A", ["a1", "a2", "a3"], 3.0))
    assert c is not None and c.hit_blocks == 2
    pool.free(c)
    pool.check_invariants()


@pytest.mark.parametrize("name", ONLINE)
def test_random_overlap_keeps_invariants(name):
    rng = random.Random(7)
    pool = BlockPool(64, 4, make_policy(name, block_size=4))
    live, t, hist = [], 0.0, {}
    for i in range(400):
        t += rng.expovariate(5.0)
        if live and (len(live) > 4 or rng.random() < 0.5):
            al = live.pop(rng.randrange(len(live)))
            al.ctx.now_s = t
            pool.free(al)
        else:
            s = f"s{rng.randrange(12)}"
            agent = f"agent{rng.randrange(3)}"
            h = hist.setdefault(s, [])
            h.append(f"{s}-{len(h)}")
            keys = [f"{agent}-{j}" for j in range(3)] + h[-6:]
            al = pool.allocate(ctx(i, s, keys, t, tool_name=rng.choice([None, "grep", "test"])))
            if al is not None:
                live.append(al)
        pool.check_invariants()
    for al in live:
        pool.free(al)
    pool.check_invariants()
    assert pool.num_free_blocks == pool.capacity_blocks


@pytest.mark.parametrize("name", ["cachescout", "cachewise", "hybrid"])
def test_preempted_request_is_learnt_once(name):
    """vLLM (and the simulator) free a preempted request's blocks and admit it again
    later with the same id: that is not a new turn of the session."""
    pol = make_policy(name, block_size=4)
    pool = BlockPool(20, 4, pol)
    first = ctx(1, "A", ["a1", "a2"], 0.0)
    pool.free(pool.allocate(first))
    c = ctx(2, "A", ["a1", "a2", "a3"], 5.0)
    pool.free(pool.allocate(c))       # preempted
    c.now_s = 6.5
    pool.free(pool.allocate(c))       # re-admitted and finished
    assert pol.model.sessions["A"].n == 2
