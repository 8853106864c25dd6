import random

import pytest

from anchorage.routing import make_router
from anchorage.routing.agent import agent_label
from anchorage.routing.events import BlockStored
from anchorage.routing.prefix import PrefixRouter
from tests.routing.helpers import ctx, route, views


def anchor(agent, n=4):
    return [agent * 1000 + i for i in range(n)]


def req(agent, session, turn, now=0.0, **kw):
    return ctx(anchor(agent) + [hash((session, t)) for t in range(turn + 1)],
               session=session, now=now, **kw)


def test_a_whole_prefix_on_an_idle_replica_is_never_sent_elsewhere():
    # the floor: replica 2 holds the request's whole prefix (its KV events say so: a
    # warm-up, or another router's request) and is idle; whatever the router's own model,
    # placement or thread says, and however loaded the others are, it goes there
    rng = random.Random(7)
    for trial in range(50):
        r = make_router("agent")
        keys = anchor(trial % 5) + [hash(("hist", trial, i)) for i in range(30)]
        home = route(r, ctx(keys[:12], session="s"), views(4))   # the thread's home
        target = (home + 1 + trial % 3) % 4
        r.on_kv_event(target, BlockStored(tuple(keys)))
        reps = views(4, loads=[rng.randint(0, 20) for _ in range(4)])
        reps[target].running = 0
        reps[target].queued_tokens = 0
        for i, v in enumerate(reps):
            if i != target:
                v.queued_tokens = rng.choice([0, 0, 500, 5000])
        assert r.pick(ctx(keys, session="s"), reps) == target, trial


def test_sessions_stick_while_home_holds_their_history():
    r = make_router("agent")
    reps = views(4)
    homes = {}
    for s in range(8):
        homes[s] = route(r, req(s % 4, f"s{s}", 0), reps)
    for t in range(1, 6):
        for s in range(8):
            assert route(r, req(s % 4, f"s{s}", t), reps) == homes[s]
    assert r.decisions["moved"] == 0


def test_a_thread_leaves_home_when_its_queue_costs_more_than_its_history_saves():
    # 40 blocks of 16 tokens cached at home: with locality 1 the history is worth
    # 2 x 640 tokens of queue there; an idle replica costs the whole prompt twice
    def at(queued):
        r = make_router("agent", locality=1.0, request_tokens=0, guard=False)
        keys = [hash(("t", i)) for i in range(40)]
        home = route(r, ctx(keys, session="s"), views(2))
        reps = views(2)
        reps[home].queued_tokens = queued
        return home, r.pick(ctx(keys + [1, 2], session="s"), reps)

    home, p = at(1000)
    assert p == home
    home, p = at(1400)
    assert p != home


def test_costs_are_seconds_of_each_replicas_own_prefill_rate():
    # replica 0 prefills 4x faster: its longer queue is the shorter wait
    r = make_router("agent", guard=False)
    reps = views(2)
    reps[0].queued_tokens, reps[0].prefill_tokens_per_s = 8000, 40_000.0
    reps[1].queued_tokens, reps[1].prefill_tokens_per_s = 3000, 10_000.0
    assert r.pick(ctx([1, 2, 3], session="x"), reps) == 0
    reps[0].prefill_tokens_per_s = 0.0         # unknown: priced as the known one
    assert r.pick(ctx([1, 2, 3], session="y"), reps) == 1


def test_agents_behind_a_shared_preamble_are_told_apart():
    # every agent's prompt opens with the same 8-block framework preamble; the anchor is
    # the longest run two sessions share, so agents differ by what follows it
    r = make_router("agent")
    pre = list(range(100, 108))
    reps = views(4)
    for a in (1, 2):
        for s in range(2):
            route(r, ctx(pre + anchor(a) + [hash((a, s))], session=f"{a}-{s}"), reps)
    one = r.agent_of(ctx(pre + anchor(1) + [9], session="n"))
    two = r.agent_of(ctx(pre + anchor(2) + [9], session="m"))
    assert one != two
    assert one == ("fp", anchor(1)[-1]) and two == ("fp", anchor(2)[-1])


def test_a_home_with_a_host_tier_keeps_a_thread_its_gpu_evicted():
    def run(host_tier):
        r = make_router("agent", guard=False)
        keys = [hash(("h", i)) for i in range(60)]
        home = route(r, ctx(keys, session="s"), views(2))
        reps = views(2)
        reps[home].queued_tokens = 200
        for v in reps:
            v.host_tier = host_tier
        r.index.clear(home)             # the router's GPU model: the history was evicted
        return home, r.pick(ctx(keys + [7], session="s"), reps)

    home, p = run(False)
    assert p != home
    home, p = run(True)
    assert p == home


def test_a_replica_reporting_the_anchor_attracts_it():
    c = req(5, "s", 0)
    learned = agent_label(("fp", c.keys[3]))
    r = make_router("agent", guard=False)
    extra = [{}, {}, {"anchors": ["fp:0000000000000001", learned]}, {}]
    assert r.pick(c, views(4, extra=extra)) == 2
    hinted = ctx([1, 2], agent="coder", tenant="acme")
    assert agent_label(r.agent_of(hinted)) == "acme/coder"


def _noisy_fleet(router, n=4, requests=600, seed=3, noise=True):
    """Sessions of 6 agents, loads that swing at random: a router that chases load
    scatters histories."""
    rng = random.Random(seed)
    choices = []
    for i in range(requests):
        s = rng.randrange(40)
        c = ctx(anchor(s % 6) + [hash((s, t)) for t in range(i // 40 + 1)], session=f"s{s}")
        reps = views(n, loads=[rng.randint(0, 3) if noise else 1 for _ in range(n)])
        p = router.pick(c, reps)
        router.on_start(c, reps[p].index)
        choices.append((c, reps, p))
    return choices


def test_the_guard_falls_back_to_prefix_routing_where_its_own_rule_loses():
    # locality 0 and a heavy price per running request: the own rule follows the noise;
    # its shadow world finds less cached than prefix routing's, so the guard takes over
    # and from then on the choice is prefix routing's on the same model and loads
    r = make_router("agent", locality=0.0, request_tokens=10_000, guard_window=50,
                    guard_sample=1.0)
    _noisy_fleet(r)
    assert r.fallback and r.decisions["guard"] > 300
    assert r.gain_prefix > r.gain_own
    ref = PrefixRouter()
    c = req(1, "probe", 3)
    reps = views(4, loads=[2, 0, 1, 3])
    ref.index = r.index                  # the same model: the same choice
    assert r.pick(c, reps) == ref.pick(c, reps)
    calm = make_router("agent", guard_window=50, guard_sample=1.0)
    _noisy_fleet(calm, noise=False)         # loads level: its own rule keeps histories
    assert calm.decisions["guard"] == 0 and calm.gain_own >= calm.gain_prefix


def test_without_the_guard_the_own_rule_decides():
    r = make_router("agent", locality=0.0, request_tokens=10_000, guard=False)
    _noisy_fleet(r)
    assert not r.fallback and r.decisions["guard"] == 0


def test_peer_decisions_are_followed():
    r = make_router("agent", guard=False)
    c = req(3, "s", 0)
    r.on_peer_start(c, 2)
    assert r.sessions[(None, "s", r.agent_of(c))][0] == 2
    assert r.pick(req(3, "s", 1), views(4)) == 2


def test_a_removed_replica_is_forgotten():
    r = make_router("agent")
    reps = views(3)
    p = route(r, req(2, "s", 0), reps)
    r.on_replica_removed(reps[p].index)
    rest = [v for v in reps if v.index != p]
    q = r.pick(req(2, "s", 1), rest)
    assert rest[q].index != p and r.index.size(reps[p].index) == 0


def test_state_is_bounded():
    r = make_router("agent", max_sessions=50, max_anchor_keys=300)
    reps = views(4)
    for i in range(500):
        route(r, req(i, f"s{i}", 0, now=float(i)), reps)
    assert len(r.sessions) == 50 and len(r.owners) <= 300


def test_unknown_and_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="bad parameters for router 'agent'"):
        make_router("agent", spill_ratio=2)
    with pytest.raises(ValueError, match="locality"):
        make_router("agent", locality=-1)
