"""The periodic resync (anchorage.operator.resync): kopf's peering rule and one round, fast.

The loop runs against a real kube-apiserver in test_operator_k8s.py (passes every second),
test_operator_peering.py (only the active replica resyncs) and tests/chart/test_install.py
(no finalizer: a policy deleted with no operator running goes at once).
"""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes.client.rest import ApiException

from anchorage.operator import resync
from anchorage.operator.reconcile import Event

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _peer(priority: int, age_s: float = 1.0, lifetime: int = 10) -> dict:
    return {"priority": priority, "lifetime": lifetime,
            "lastseen": (NOW - dt.timedelta(seconds=age_s)).isoformat()}


def _peering(**kw) -> resync.Peering:
    base = dict(name="anchorage", standalone=False, mandatory=True, clusterwide=True,
                priority=100, identity="me")
    return resync.Peering(**{**base, **kw})


def _read(status: dict | None):
    return lambda ns: None if status is None else {"status": status}


@pytest.mark.parametrize("status,expected", [
    ({"me": _peer(100)}, True),                              # alone
    ({"me": _peer(100), "low": _peer(50)}, True),            # the highest
    ({"me": _peer(100), "high": _peer(200)}, False),         # a higher one is alive
    ({"me": _peer(100), "high": _peer(200, age_s=30)}, True),  # ... but dead
    ({"me": _peer(100), "twin": _peer(100)}, False),         # kopf pauses a shared priority
    ({}, True),                                              # not registered yet
])
def test_active_follows_kopfs_peering_rule(status, expected):
    assert resync.active(_peering(), _read(status), (), now=NOW) is expected


def test_active_without_an_identity_takes_one_entry_of_its_priority_as_its_own():
    p = _peering(identity=None)
    assert resync.active(p, _read({"x": _peer(100)}), (), now=NOW)
    assert not resync.active(p, _read({"x": _peer(100), "y": _peer(100)}), (), now=NOW)
    assert not resync.active(p, _read({"x": _peer(100), "y": _peer(300)}), (), now=NOW)


def test_active_standalone_missing_and_unreadable_peering():
    assert resync.active(_peering(standalone=True), _read({"h": _peer(999)}), (), now=NOW)
    assert not resync.active(_peering(), _read(None), (), now=NOW)           # mandatory
    assert resync.active(_peering(mandatory=False), _read(None), (), now=NOW)

    def broken(ns):
        raise ApiException(status=403)
    assert not resync.active(_peering(), broken, (), now=NOW)


def test_active_namespaced_checks_every_watched_namespace():
    seen = []

    def read(ns):
        seen.append(ns)
        return {"status": {"me": _peer(100), **({"high": _peer(200)} if ns == "b" else {})}}
    p = _peering(clusterwide=False)
    assert not resync.active(p, read, ("a", "b"), now=NOW)
    assert seen == ["a", "b"]
    assert resync.active(p, read, ("a",), now=NOW)


class FakeAPI:
    """CustomObjectsApi + CoreV1Api, in memory: what Resync.round calls."""

    def __init__(self, policies, peers=None):
        self.policies = policies
        self.peers = peers
        self.status_patches, self.events = [], []

    def get_cluster_custom_object(self, group, version, plural, name):
        if self.peers is None:
            raise ApiException(status=404)
        return {"status": self.peers}

    def list_cluster_custom_object(self, group, version, plural):
        return {"items": self.policies}

    def patch_namespaced_custom_object_status(self, group, version, ns, plural, name, body):
        if name == "gone":
            raise ApiException(status=404)
        self.status_patches.append((ns, name, body))

    def create_namespaced_event(self, ns, body):
        self.events.append((ns, body))


def _policy(name, deleting=False):
    meta = {"name": name, "namespace": "llm", "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T12:00:00Z"
    return {"metadata": meta, "spec": {}}


def _loop(api, pass_fn, peering=None):
    r = resync.Resync(None, pass_fn, interval_s=1, namespaces=(),
                      peering=peering or _peering(identity="me"))
    r.co = r.core = api
    return r


def test_round_patches_status_posts_events_and_skips_deleting_gone_and_failing():
    api = FakeAPI([_policy("a"), _policy("dying", deleting=True), _policy("gone"),
                   _policy("bad"), _policy("b")], peers={"me": _peer(100)})
    api.peers["me"]["lastseen"] = dt.datetime.now(dt.UTC).isoformat()
    passed = []

    def pass_fn(body):
        name = body["metadata"]["name"]
        passed.append(name)
        if name == "bad":
            raise RuntimeError("boom")
        return {"phase": name}, [Event("Normal", "Configured", f"{name} done")]

    r = _loop(api, pass_fn)
    assert r.round() == 2 and r.passes == 2
    assert passed == ["a", "gone", "bad", "b"]
    assert [(n, b) for _, n, b in api.status_patches] == [("a", {"status": {"phase": "a"}}),
                                                         ("b", {"status": {"phase": "b"}})]
    ev = [b for _, b in api.events]
    assert [e["reason"] for e in ev] == ["Configured", "Configured"]
    assert ev[0]["involvedObject"] == {"apiVersion": "anchorage.dev/v1alpha1",
                                       "kind": "AgentCachePolicy", "name": "a",
                                       "namespace": "llm", "uid": "uid-a"}
    assert ev[0]["message"] == "a done" and ev[0]["type"] == "Normal"


def test_round_does_nothing_while_another_replica_is_active():
    api = FakeAPI([_policy("a")], peers={"me": _peer(100), "high": _peer(200)})
    now = dt.datetime.now(dt.UTC).isoformat()
    for v in api.peers.values():
        v["lastseen"] = now
    r = _loop(api, lambda body: pytest.fail("a paused replica reconciled"))
    assert r.round() == 0 and not api.status_patches


def test_locks_serialise_one_policy_and_idle_ones_are_pruned():
    a = resync.lock_for("uid-x")
    assert resync.lock_for("uid-x") is a
    with a:
        resync.prune_locks(set())
        assert resync.lock_for("uid-x") is a     # held: kept
    resync.prune_locks(set())
    assert resync.lock_for("uid-x") is not a


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        resync.Resync(None, lambda b: ({}, []), interval_s=0, namespaces=(), peering=_peering())
