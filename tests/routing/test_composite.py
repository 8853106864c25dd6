import pytest

from anchorage.routing import make_router
from anchorage.routing.events import BlockStored
from tests.routing.helpers import ctx, route, views


def test_default_composite_prefers_cached_prefix_then_queue():
    r = make_router("composite")
    first = route(r, ctx([1, 2, 3, 4]), views(3))
    assert r.pick(ctx([1, 2, 3, 4, 5]), views(3)) == first
    loads = [1, 1, 1]
    loads[first] = 2                        # prefix weight 2 outweighs queue weight 1
    assert r.pick(ctx([1, 2, 3, 4, 5]), views(3, loads=loads)) == first
    assert r.pick(ctx([9]), views(3, loads=[4, 0, 4])) == 1


def test_overload_filter_excludes_then_falls_back_when_all_overloaded():
    r = make_router("composite", filters=["healthy", {"name": "overload", "max_load": 5}],
                    scorers={"queue": 1})
    assert r.pick(ctx([1]), views(3, loads=[9, 9, 6])) == 2
    r2 = make_router("composite", filters=[{"name": "overload", "max_load": 5}],
                     scorers={"kv_usage": 1})
    assert r2.pick(ctx([1]), views(3, loads=[9, 1, 9], kv=[0, 0.5, 0])) == 1


def test_session_and_anchor_scorers_and_precise_events():
    r = make_router("composite", scorers=[{"name": "session", "weight": 1},
                                          {"name": "precise_prefix", "weight": 1}])
    p = route(r, ctx([1], session="s"), views(4))
    assert all(r.pick(ctx([7], session="s"), views(4)) == p for _ in range(5))
    r.on_kv_event(3, BlockStored([5, 6]))
    assert r.pick(ctx([5, 6]), views(4)) == 3
    a = make_router("composite", scorers={"anchor": 1}, anchor_blocks=1) if False else \
        make_router("composite", scorers=[{"name": "anchor", "anchor_blocks": 1}])
    assert a.pick(ctx([42]), views(3, extra=[{}, {"anchors": ["fp:42"]}, {}])) == 1


@pytest.mark.parametrize("cfg, msg", [
    ({"scorers": {"nope": 1}}, "unknown scorer 'nope'"),
    ({"filters": ["nope"]}, "unknown filter 'nope'"),
    ({"picker": "nope"}, "unknown picker 'nope'"),
    ({"scorers": [{"name": "prefix", "bogus": 1}]}, "bad parameters for scorer 'prefix'"),
    ({"scorers": {}}, "at least one scorer"),
])
def test_bad_configuration_is_a_clear_error(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        make_router("composite", **cfg)
