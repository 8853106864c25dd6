from collections import Counter

from anchorage.routing import make_router
from anchorage.routing.agent import agent_label
from anchorage.routing.keys import agent_id
from tests.routing.helpers import ctx, route, views


def anchor(agent):
    return [agent * 1000 + i for i in range(4)]


def req(agent, session, turn, now=0.0, **kw):
    return ctx(anchor(agent) + [hash((session, t)) for t in range(turn + 1)],
               session=session, now=now, **kw)


def test_sessions_stick_and_new_sessions_follow_their_agents_anchor():
    r = make_router("agent")
    reps = views(8)
    for a in range(8):                      # eight equally loaded agents: one replica each
        route(r, req(a, f"warm{a}", 0), reps)
    homes = {a: set(r.placement[agent_id(req(a, "x", 0))]) for a in range(8)}
    assert all(len(h) == 1 for h in homes.values())
    assert len(set.union(*homes.values())) == 8   # anchors spread, one per replica
    for a in range(8):
        for s in range(3):
            for t in range(3):
                p = route(r, req(a, f"{a}-{s}", t), reps)
                assert {p} == homes[a]


def test_hot_agent_gets_more_replicas_cold_ones_share():
    r = make_router("agent")
    reps = views(4)
    for i in range(200):
        a = 0 if i % 2 == 0 else 1 + (i // 2) % 6    # agent 0: half the traffic
        route(r, req(a, f"s{i}", 0, now=i * 0.01), reps)
    sizes = {a: len(r.placement[agent_id(req(a, "x", 0))]) for a in range(7)}
    assert sizes[0] >= 2 and all(sizes[a] == 1 for a in range(1, 7))


def test_overloaded_home_spills_and_the_session_moves_with_its_history():
    r = make_router("agent", spill_ratio=1.5, spill_abs=2)
    p0 = route(r, req(1, "s", 0), views(3))
    loads = [0, 0, 0]
    loads[p0] = 20
    p1 = route(r, req(1, "s", 1), views(3, loads=loads))
    assert p1 != p0 and r.spills == 1
    assert p1 in r.placement[agent_id(req(1, "s", 0))]
    assert route(r, req(1, "s", 2), views(3)) == p1   # now sticks to where its history is


def test_replica_policy_state_attracts_the_anchor():
    c = req(5, "s", 0)
    label = agent_label(agent_id(c))
    extra = [{}, {}, {"anchors": [label]}, {}]
    r = make_router("agent")
    assert r.pick(c, views(4, extra=extra)) == 2
    hinted = ctx([1, 2], agent="coder", tenant="acme")
    assert agent_label(agent_id(hinted)) == "acme/coder"


def test_removed_replica_sessions_and_anchors_are_replaced():
    r = make_router("agent")
    reps = views(3)
    p = route(r, req(2, "s", 0), reps)
    r.on_replica_removed(reps[p].index)
    rest = [v for v in reps if v.index != p]
    q = route(r, req(2, "s", 1), rest)
    assert rest[q].index != p
    assert r.placement[agent_id(req(2, "s", 0))] == [rest[q].index]


def test_agent_state_is_bounded():
    r = make_router("agent", max_sessions=50, half_life_s=1.0)
    reps = views(4)
    for i in range(500):
        route(r, req(i, f"s{i}", 0, now=float(i)), reps)
    assert len(r.sessions) == 50
    assert len(r.placement) < 60            # decayed agents are forgotten
    assert Counter(len(m) for m in r.placement.values())[1] == len(r.placement)


def test_new_sessions_leave_a_busier_anchor_replica_known_sessions_stay():
    r = make_router("agent", new_ratio=1.25, new_abs=2, spill_abs=100)
    home = route(r, req(3, "old", 0), views(2))
    loads = [0, 0]
    loads[home] = 5                          # > 1.25 * 0 + 2: too busy for a new session
    assert route(r, req(3, "old", 1), views(2, loads=loads)) == home      # history wins
    assert route(r, req(3, "new", 0), views(2, loads=loads)) == 1 - home  # anchor re-placed
    assert set(r.placement[agent_id(req(3, "x", 0))]) == {0, 1}
    off = make_router("agent", new_ratio=0, spill_abs=100)
    h = route(off, req(3, "old", 0), views(2))
    loads = [0, 0]
    loads[h] = 5
    assert route(off, req(3, "new", 0), views(2, loads=loads)) == h


def test_a_new_session_joins_its_anchor_unless_the_queue_there_costs_more_than_it_saves():
    # defaults: a member's extra load (requests) against w(anchor) = matched blocks x
    # tokens per block / tokens_per_request (2048): the same trade as a thread's move
    r = make_router("agent", spill_abs=100)
    home = route(r, req(3, "old", 0), views(2))
    loads = [0, 0]
    assert route(r, req(3, "level", 0), views(2, loads=loads)) == home
    loads[home] = 2                         # a 4-block anchor saves ~64 tokens: leave it
    assert route(r, req(3, "new", 0), views(2, loads=loads)) == 1 - home

    def long(s):                            # 400 shared blocks, ~6,400 tokens: ~3.1 requests
        return ctx(list(range(5000, 5400)) + [hash((s, 0))], session=s)

    r = make_router("agent", spill_abs=100)
    home = route(r, long("a"), views(2))
    loads = [0, 0]
    loads[home] = 3
    assert route(r, long("b"), views(2, loads=loads)) == home
    loads[home] = 4
    assert route(r, long("c"), views(2, loads=loads)) == 1 - home


def test_a_replica_reporting_a_learned_anchor_of_another_length_attracts_it():
    c = req(6, "s", 0)                      # anchor keys 6000..6003, then history
    learned = agent_label(("fp", c.keys[1]))   # the replica's policy learned a 2-block anchor
    r = make_router("agent")
    assert r.pick(c, views(3, extra=[{}, {"anchors": ["fp:0000000000000001", learned]}, {}])) == 1


def test_a_session_switching_agents_follows_each_agents_anchor_and_thread():
    # a session's prompts for agent a extend a's previous prompt (anchor(a) + history), so
    # the history that sticks is the (session, agent) thread, not the session
    r = make_router("agent")
    reps = views(4)
    homes = {}
    for a in range(4):
        homes[a] = route(r, req(a, f"warm{a}", 0), reps)
    assert len(set(homes.values())) == 4
    for t in range(3):
        for a in (0, 1, 2):                 # one session hands over between three agents
            assert route(r, req(a, "multi", t), reps) == homes[a]


def test_queued_prefill_tokens_make_a_home_overloaded():
    r = make_router("agent", spill_ratio=1.5, spill_abs=4)
    p0 = route(r, req(1, "s", 0), views(3))
    reps = views(3)
    reps[p0].running = 1                    # one request each: counts alone are balanced
    for i, v in enumerate(reps):
        v.running = 1
    reps[p0].queued_tokens = 64 * 2048      # but 64 requests' worth of prefill is queued there
    p1 = route(r, req(1, "s", 1), reps)
    assert p1 != p0 and r.spills == 1
    off = make_router("agent", spill_ratio=1.5, spill_abs=4, tokens_per_request=0)
    q0 = route(off, req(1, "s", 0), views(3))
    reps[q0].queued_tokens, reps[p0].queued_tokens = 64 * 2048, 0
    assert route(off, req(1, "s", 1), reps) == q0      # request counts alone: stays


def test_a_home_with_a_host_tier_keeps_its_threads_through_a_full_gpu_cache():
    # a full GPU cache moves a thread off a replica without a host tier (its history is
    # being evicted there anyway), not off one that keeps evicted KV in host memory
    def run(host_tier):
        r = make_router("agent", kv_spill=0.98, spill_abs=100)
        reps = views(2)
        home = route(r, req(2, "s", 0), reps)
        for t in range(1, 40):          # a long thread: 40 blocks of history
            route(r, req(2, "s", t), reps)
        full = views(2, kv=[1.0 if i == home else 0.2 for i in range(2)],
                     loads=[6 if i == home else 0 for i in range(2)])
        for v in full:
            v.host_tier = host_tier
        r.index.clear(home)             # the router's GPU model: the history was evicted
        return home, route(r, req(2, "s", 40), full)

    home, p = run(host_tier=False)
    assert p != home                    # nothing of its history left there: it moves
    home, p = run(host_tier=True)
    assert p == home                    # its history is in home's host memory: it stays


def test_a_tiered_home_still_sheds_a_short_thread_when_its_queue_is_far_longer():
    r = make_router("agent", spill_ratio=1.5, spill_abs=2)
    home = route(r, req(1, "s", 0), views(3))
    loads = [0, 0, 0]
    loads[home] = 20                    # 20 requests queued; the thread's history: 5 blocks
    reps = views(3, loads=loads)
    for v in reps:
        v.host_tier = True
    assert route(r, req(1, "s", 1), reps) != home


def test_a_context_on_another_clock_does_not_break_the_router():
    """A context stamped far before the router's load epoch (another clock: a peer decision
    on time.monotonic after hours of uptime, then a context at 0) is routed like one at the
    epoch: no ZeroDivisionError (2^-x underflowed to 0 past ~1,074 half-lives), and the
    session still sticks to its replica."""
    r = make_router("agent")
    reps = views(4)
    home = route(r, ctx([1, 2, 3, 4, 5], session="s", now=70_000.0), reps)   # 19 h of uptime
    assert route(r, ctx([1, 2, 3, 4, 5, 6], session="s", now=0.0), reps) == home
    assert route(r, ctx([9, 8, 7, 6, 5], session="t", now=-1e9), reps) in range(4)


def test_among_members_a_longer_match_is_weighed_against_the_load_it_costs():
    # both replicas hold the agent's anchor; replica `home` also holds two more shared
    # blocks (~32 tokens: 0.016 requests of prefill at 2,048 tokens a request). A member's
    # cost is its load less the prefill its match saves, so a busier home loses a new
    # thread to the idle member; the longest match first (tokens_per_request 0) keeps it.
    def shared(s, extra):                    # anchor(4) + 2 shared blocks, then its own
        return ctx(anchor(4) + [77, 78] + [hash((s, i)) for i in range(extra)], session=s)

    for tpr, expect_home in ((2048, False), (0, True)):
        r = make_router("agent", spill_abs=100, new_ratio=0, tokens_per_request=tpr)
        home = route(r, shared("a", 1), views(2))
        # another router placed a session of the agent on the other replica: a member now
        r.on_peer_start(ctx(anchor(4) + [hash("b")], session="b"), 1 - home)
        assert set(r.placement[agent_id(shared("x", 0))]) == {0, 1}
        loads = [0, 0]
        loads[home] = 1
        assert r.index.match_len(home, shared("c", 1).keys) == 6
        assert r.index.match_len(1 - home, shared("c", 1).keys) == 4
        got = route(r, shared("c", 1), views(2, loads=loads))
        assert (got == home) == expect_home, (tpr, got, home)
