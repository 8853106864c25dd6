import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.routing.base import RoundRobinRouter
from anchorage.routing.oracle import (
    RecordingRouter,
    ReplayRouter,
    replica_future_belady,
)
from anchorage.sim.replay import replay
from tests.routing.helpers import route, views


def _ctx(seq, keys):
    return RequestContext(request_id=seq, keys=list(keys), input_length=len(keys) * 16 + 1,
                          seq=seq)


def test_replay_router_reproduces_a_recorded_placement():
    rec = RecordingRouter(RoundRobinRouter())
    reps = views(3)
    ctxs = [_ctx(i, [f"k{i}"]) for i in range(7)]
    picked = [route(rec, c, reps) for c in ctxs]
    assert rec.assignment == dict(enumerate(picked)) and set(picked) == {0, 1, 2}
    replay_router = ReplayRouter(rec.assignment)
    # replicas listed in another order: the replay returns the position of the index
    shuffled = list(reversed(reps))
    for c, p in zip(ctxs, picked):
        assert shuffled[replay_router.pick(c, shuffled)].index == p
    with pytest.raises(KeyError, match="seq 99 has no recorded replica"):
        replay_router.pick(_ctx(99, ["z"]), reps)


def test_a_replica_belady_ignores_uses_on_other_replicas():
    # replica 0 serves A(x), B(y), E(z), D(y); C(x) in between goes to replica 1. E needs
    # two cached blocks evicted: x (used next on replica 1) or y (used next here, by D).
    trace = [_ctx(0, ["x1", "x2"]), _ctx(1, ["y1", "y2"]), _ctx(2, ["z1", "z2"]),
             _ctx(3, ["x1", "x2"]), _ctx(4, ["y1", "y2"])]
    assignment = {0: 0, 1: 0, 2: 0, 3: 1, 4: 0}
    mine = [c for c in trace if assignment[c.seq] == 0]
    own = replay(mine, 5, 16, replica_future_belady(trace, 16, assignment, 0),
                 include_output=False)
    fleet = replay(mine, 5, 16, make_policy("belady", block_size=16, contexts=trace),
                   include_output=False)
    assert own.hit_blocks == 2      # kept y for D
    assert fleet.hit_blocks == 0    # the trace-order future kept x for replica 1's C
