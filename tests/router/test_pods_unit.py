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
