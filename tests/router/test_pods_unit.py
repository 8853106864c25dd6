"""Decision batches between router pods (``router.replicaCount``, ``router.sync``) without Ray: what
is accepted, what is refused."""

from __future__ import annotations

import pytest

from anchorage.policies.base import RequestContext
from anchorage.router.config import RouterConfig
from anchorage.router.pods import PodPeers
from anchorage.router.state import RoutingState
from anchorage.router.sync import decode, encode


def ctx(keys, session="s1"):
    return RequestContext(request_id=1, keys=keys, input_length=16 * len(keys), now_s=0.0,
                          session_id=session, tenant="t-1", agent_hint="planner")


def test_a_batch_round_trips_as_json_with_64_bit_keys():
    keys = [2**64 - 1, 0, 12345]
    rows = decode(encode([("http://u0", "tiny", ctx(keys))]))
    (_, url, model, c), = rows
    assert (url, model, c.keys, c.session_id, c.tenant, c.agent_hint) == \
        ("http://u0", "tiny", keys, "s1", "t-1", "planner")


@pytest.mark.parametrize("payload", [b'{"a": 1}', b"[[1, 2]]", b'[[0, "u", null, null, null, null, ["x"], 3]]',
                                     b"not json", b'[[0, 1, null, null, null, null, [], 3]]'])
def test_malformed_batches_are_refused(payload):
    with pytest.raises(ValueError):
        decode(payload)


def peers(token="tok", pod="pod-a"):
    st = RoutingState(RouterConfig(replicas=["http://u0", "http://u1"], policy="agent"))
    return st, PodPeers(st, None, token, pod, ["http://10.0.0.2:8000", "http://10.0.0.1:8000"],
                        own_ip="10.0.0.1")


def test_the_token_guards_the_endpoint_and_a_pod_skips_its_own_address():
    _, p = peers()
    assert p.urls == ["http://10.0.0.2:8000"]
    assert p.authorised("tok") and not p.authorised("nope") and not p.authorised("")
    _, p = peers(token="")
    assert not p.authorised("")


def test_a_push_is_parsed_validated_and_ones_own_pod_dropped():
    _, p = peers()
    batch = encode([("http://u1", None, ctx([1, 2, 3]))])
    body = b'{"origin": "pod-b/r1", "pod": "pod-b", "load": {"http://u1": 3}, "batch": ' + batch + b"}"
    origin, payload, load = p.parse(body)
    assert origin == "pod-b/r1" and load == {"http://u1": 3} and len(decode(payload)) == 1
    own = body.replace(b'"pod": "pod-b"', b'"pod": "pod-a"')
    assert p.parse(own) is None
    with pytest.raises(ValueError):
        p.parse(body.replace(b'{"http://u1": 3}', b'{"http://u1": "3"}'))
    with pytest.raises(ValueError):
        p.parse(b'{"origin": "x", "pod": "pod-b", "batch": [[1]]}')


def test_peers_need_the_internal_token():
    with pytest.raises(ValueError, match="internal token"):
        RouterConfig(replicas=["http://u0"], peers=["http://10.0.0.2:8000"]).validate()


class FakePeer:
    """An aiohttp-like session whose peer answers ``statuses`` in turn (an exception
    instance: the transport fails) after ``delay_s``; records what it received."""

    def __init__(self, statuses, delay_s=0.0):
        self.statuses, self.delay_s = list(statuses), delay_s
        self.bodies, self.inflight, self.most_inflight = [], 0, 0

    def post(self, url, data, timeout, headers):
        peer = self

        class Answer:
            async def __aenter__(self):
                import asyncio
                peer.inflight += 1
                peer.most_inflight = max(peer.most_inflight, peer.inflight)
                try:
                    await asyncio.sleep(peer.delay_s)
                finally:
                    peer.inflight -= 1
                st = peer.statuses.pop(0) if peer.statuses else 200
                if isinstance(st, Exception):
                    raise st
                if st == 200:
                    peer.bodies.append(data)
                self.status = st
                return self

            async def __aexit__(self, *exc):
                return False

            async def read(self):
                return b"{}"
        return Answer()


def run_pushes(peer, batches, gap_s=0.01, settle_s=2.0):
    import asyncio
    import json

    from anchorage.router import pods

    async def go():
        st = RoutingState(RouterConfig(replicas=["http://u0"], policy="agent"))
        p = PodPeers(st, peer, "tok", "pod-a", ["http://10.0.0.2:8000"])
        for b in batches:
            p.push("r1", b, {})
            await asyncio.sleep(gap_s)
        deadline = asyncio.get_running_loop().time() + settle_s
        while any(not box.task.done() for box in p.outboxes.values()):
            assert asyncio.get_running_loop().time() < deadline, p.status()
            await asyncio.sleep(0.01)
        return p
    old = pods.RETRY_S
    pods.RETRY_S = 0.01
    try:
        p = asyncio.run(go())
    finally:
        pods.RETRY_S = old
    rows = [r for body in peer.bodies for r in json.loads(body)["batch"]]
    return p, rows


def batch(i):
    return encode([("http://u0", "tiny", ctx([i], session=f"s{i}"))])


def test_a_slow_peer_gets_every_decision_in_fewer_pushes_one_at_a_time():
    peer = FakePeer([], delay_s=0.05)
    p, rows = run_pushes(peer, [batch(i) for i in range(20)], gap_s=0.005)
    assert [r[4] for r in rows] == [f"s{i}" for i in range(20)]     # all, in order
    assert peer.most_inflight == 1 and len(peer.bodies) < 20 and p.errors == 0


def test_a_failed_push_is_sent_again_and_a_refused_one_dropped():
    import aiohttp
    peer = FakePeer([aiohttp.ClientConnectionError("down"), 503, 200])
    p, rows = run_pushes(peer, [batch(0)])
    assert [r[4] for r in rows] == ["s0"] and p.errors == 2
    peer = FakePeer([403])
    p, rows = run_pushes(peer, [batch(0), batch(1)], gap_s=0.05)
    assert [r[4] for r in rows] == ["s1"] and p.errors == 1


def test_an_outbox_is_bounded_oldest_dropped_first(monkeypatch):
    from anchorage.router import pods
    bs = [batch(i) for i in range(6)]
    # room for the last three (a batch's length varies with its timestamp's digits)
    monkeypatch.setattr(pods, "MAX_PENDING_BYTES", sum(len(b) for b in bs[-3:]))
    import aiohttp
    peer = FakePeer([aiohttp.ClientConnectionError("down")] * 3, delay_s=0.0)
    p, rows = run_pushes(peer, bs, gap_s=0.0)
    assert [r[4] for r in rows] == ["s3", "s4", "s5"] and p.errors == 3 + 3
