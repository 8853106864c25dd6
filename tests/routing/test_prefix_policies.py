from anchorage.routing import make_router
from anchorage.routing.events import AllBlocksCleared, BlockRemoved, BlockStored
from tests.routing.helpers import ctx, route, views


def test_prefix_routes_to_best_match_when_balanced():
    r = make_router("prefix")
    reps = views(4)
    first = route(r, ctx([1, 2, 3, 4]), reps)
    assert r.pick(ctx([1, 2, 3, 9]), views(4, loads=[3, 3, 3, 3])) == first
    assert r.predicted_hit_blocks(ctx([1, 2, 3, 9]), first) == 3


def test_prefix_low_match_goes_to_most_room_and_spreads_distinct_prefixes():
    r = make_router("prefix")
    reps = views(4)
    picks = {route(r, ctx([100 * i + j for j in range(5)]), reps) for i in range(4)}
    assert picks == {0, 1, 2, 3}


def test_prefix_yields_to_load_when_imbalanced():
    r = make_router("prefix", balance_abs_threshold=4, balance_rel_threshold=1.5)
    first = route(r, ctx([1, 2, 3]), views(2))
    loads = [0, 0]
    loads[first] = 10
    assert r.pick(ctx([1, 2, 3]), views(2, loads=loads)) == 1 - first
    loads[first] = 3                       # diff 3 <= abs threshold: affinity wins
    assert r.pick(ctx([1, 2, 3]), views(2, loads=loads)) == first


def test_prefix_tenants_salted_keys_do_not_match_across_tenants():
    from anchorage.sim.replay import record_keys
    from anchorage.trace.format import TraceRecord
    rec = lambda t: TraceRecord(timestamp=0, input_length=64, output_length=1,  # noqa: E731
                                hash_ids=[1, 2, 3], tenant=t)
    r = make_router("prefix")
    a = route(r, ctx(record_keys(rec("a")), tenant="a"), views(2))
    assert r.predicted_hit_blocks(ctx(record_keys(rec("b")), tenant="b"), a) == 0
    assert r.predicted_hit_blocks(ctx(record_keys(rec("a")), tenant="a"), a) == 3


def test_precise_prefix_follows_kv_events_only():
    r = make_router("precise_prefix")
    reps = views(3)
    c = ctx([1, 2, 3])
    route(r, c, reps)                       # routing alone teaches it nothing
    assert all(r.predicted_hit_blocks(c, i) == 0 for i in range(3))
    r.on_kv_event(2, BlockStored([1, 2, 3]))
    assert r.pick(ctx([1, 2, 3, 4]), reps) == 2
    r.on_kv_event(2, BlockRemoved([3]))
    assert r.predicted_hit_blocks(c, 2) == 2
    r.on_kv_event(2, AllBlocksCleared())
    assert r.predicted_hit_blocks(c, 2) == 0


def test_a_match_on_a_replica_not_offered_does_not_break_the_choice():
    # the index still knows replica 2 (ejected, or excluded for a retry): the choice is
    # among the replicas offered
    from anchorage.routing import make_router
    from tests.routing.helpers import ctx, route, views
    for name in ("prefix", "agent"):
        r = make_router(name)
        keys = list(range(40))
        route(r, ctx(keys), views(3)[2:])          # only replica 2 offered: it holds keys
        assert r.pick(ctx(keys + [99]), views(2)) in (0, 1), name
