"""Reconcile pass + Kubernetes adapter against kmock's in-process API emulator (fast).

Metrics come from a plain stub (the Prometheus adapter has its own tests against a real
Prometheus); the Kubernetes side is real HTTP through the official client to kmock.
"""

from __future__ import annotations

import asyncio
import itertools

import kmock
import pytest
import yaml
from kubernetes import client

from anchorage.autoscale import FleetSignals, MetricsError
from anchorage.operator.config import DATA_KEY, GENERATION_ANNOTATION
from anchorage.operator.kube import KubeIO
from anchorage.operator.reconcile import reconcile

_rv = itertools.count(1)


class Emulator(kmock.KubernetesEmulator):
    """Stamps metadata.resourceVersion on every write, as a real API server does."""

    async def _handle(self, request):
        if request.action in (kmock.action.CREATE, kmock.action.UPDATE) and isinstance(request.data, dict):
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(_rv))
        return await super()._handle(request)


pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=Emulator)]

NS, NAME, UID = "llm", "llama", "0000-uid"


class StubMetrics:
    def __init__(self, signals: FleetSignals | None = None, error: str | None = None):
        self.signals, self.error, self.calls = signals, error, 0

    def fleet_signals(self, **kw) -> FleetSignals:
        self.calls += 1
        if self.error:
            raise MetricsError(self.error)
        return self.signals


HOT = FleetSignals(hit_rate=0.6, queue_depth=12.0, kv_usage=0.5)
CALM = FleetSignals(hit_rate=0.9, queue_depth=0.0, kv_usage=0.1)


def spec(**over):
    s = {"targetRef": {"kind": "Deployment", "name": "web"},
         "policy": {"name": "hybrid", "parameters": {"horizon": 30}},
         "routing": {"policy": "agent"},
         "autoscaling": {"minReplicas": 1, "maxReplicas": 6, "scaleUpStabilizationSeconds": 0,
                         "scaleDownStabilizationSeconds": 0, "cooldownSeconds": 0},
         "metrics": {"prometheusURL": "http://127.0.0.1:9", "windowSeconds": 30}}
    s.update(over)
    return s


def deployment(replicas: int):
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": NS, "resourceVersion": "1"},
            "spec": {"replicas": replicas}}


async def run(km, sp, status, metrics, now_s=1000.0, generation=1, access_log_dir=None):
    cfg = client.Configuration()
    cfg.host = str(km.url).rstrip("/")
    io = KubeIO(client.ApiClient(cfg))
    try:
        return await asyncio.to_thread(
            reconcile, name=NAME, namespace=NS, uid=UID, generation=generation, spec=sp,
            status=status, kube=io, metrics_for=lambda url: metrics, now_s=now_s,
            access_log_dir=access_log_dir)
    finally:
        io.api.close()


def cond(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def writes(km, resource):
    return [r for r in list(km) if r.method.name in ("POST", "PUT", "PATCH")
            and resource in str(r.url)]


async def test_configmap_written_once_with_owner_and_generation(kmock):
    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    out = await run(kmock, spec(), {}, StubMetrics(CALM))
    cm = kmock.objects["v1/configmaps", NS, "llama-anchorage"]
    doc = yaml.safe_load(cm["data"][DATA_KEY])
    assert doc["generation"] == 1 and doc["policy"] == {
        "name": "hybrid", "parameters": {"horizon": 30}, "parametersSource": "spec"}
    assert doc["routing"]["policy"] == "agent"
    assert cm["metadata"]["annotations"][GENERATION_ANNOTATION] == "1"
    owner = cm["metadata"]["ownerReferences"][0]
    assert owner["uid"] == UID and owner["kind"] == "AgentCachePolicy" and owner["controller"]
    assert out.status["configGeneration"] == 1
    assert any(e.reason == "ConfigWritten" for e in out.events)
    # the same spec again: no write, same generation (idempotent)
    n = len(writes(kmock, "configmaps"))
    again = await run(kmock, spec(), {**out.status}, StubMetrics(CALM))
    assert len(writes(kmock, "configmaps")) == n and again.status["configGeneration"] == 1
    assert not any(e.reason == "ConfigWritten" for e in again.events)
    # a spec change bumps the generation
    changed = spec(routing={"policy": "prefix"})
    third = await run(kmock, changed, {**again.status}, StubMetrics(CALM), generation=2)
    doc = yaml.safe_load(kmock.objects["v1/configmaps", NS, "llama-anchorage"]["data"][DATA_KEY])
    assert doc["generation"] == 2 and doc["routing"]["policy"] == "prefix"
    assert third.status["configGeneration"] == 2


async def test_scales_target_through_scale_subresource(kmock):
    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    out = await run(kmock, spec(), {}, StubMetrics(HOT))
    assert kmock.objects["apps/v1/deployments", NS, "web"]["spec"]["replicas"] == 4
    assert [str(r.url).endswith("/deployments/web/scale") for r in writes(kmock, "deployments")] == [True]
    assert out.status["desiredReplicas"] == 4 and "scale out 2 -> 4" in out.status["lastScaleReason"]
    assert cond(out.status, "Ready")["status"] == "True"
    assert any(e.reason == "Scaled" for e in out.events) and out.facts["scaled"] == "up"
    from anchorage.operator import metrics as op_metrics
    op_metrics.record(NS, NAME, spec(), out.status, out.facts)
    assert op_metrics.REGISTRY.get_sample_value(
        "anchorage_operator_scale_events_total",
        {"acp_namespace": NS, "acp": NAME, "direction": "up"}) == 1
    assert op_metrics.REGISTRY.get_sample_value(
        "anchorage_operator_desired_replicas", {"acp_namespace": NS, "acp": NAME}) == 4
    # a repeated pass (e.g. after an operator restart) with the target already at 4 and calm
    # load inside the cooldown does not act again
    sp = spec(autoscaling={**spec()["autoscaling"], "cooldownSeconds": 600})
    again = await run(kmock, sp, out.status, StubMetrics(CALM), now_s=1001.0)
    assert len(writes(kmock, "deployments")) == 1 and again.status["desiredReplicas"] == 4


async def test_metrics_unavailable_holds_and_reports(kmock):
    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(3)
    out = await run(kmock, spec(), {}, StubMetrics(error="Prometheus at x unreachable"))
    assert writes(kmock, "deployments") == []
    c = cond(out.status, "MetricsAvailable")
    assert c["status"] == "False" and "unreachable" in c["message"]
    assert out.status["desiredReplicas"] == 3
    assert any(e.reason == "MetricsUnavailable" and e.type == "Warning" for e in out.events)


async def test_missing_target_is_not_ready(kmock):
    out = await run(kmock, spec(), {}, StubMetrics(HOT))
    c = cond(out.status, "Ready")
    assert c["status"] == "False" and c["reason"] == "TargetNotFound" and "llm/web" in c["message"]
    # the ConfigMap is still written for the consumers
    assert kmock.objects["v1/configmaps", NS, "llama-anchorage"]["data"][DATA_KEY]


async def test_invalid_spec_is_degraded_and_touches_nothing(kmock):
    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    bad = spec(autoscaling={"minReplicas": 5, "maxReplicas": 2},
               tuning={"enabled": True, "parameters": [{"name": "horizon", "min": 9, "max": 1}]})
    out = await run(kmock, bad, {}, StubMetrics(HOT))
    c = cond(out.status, "Degraded")
    assert c["status"] == "True"
    for needle in ("minReplicas (5) is greater than maxReplicas (2)", "min 9 > max 1",
                   "accessLogs is empty", "capacityBlocks"):
        assert needle in c["message"]
    assert writes(kmock, "deployments") == [] and writes(kmock, "configmaps") == []


async def test_tuning_adopts_better_parameters_and_writes_them(kmock, tmp_path):
    """The digital twin inside a reconcile pass, on the default policy: the recorded access
    log replays better under hybrid with a lower survival threshold than the example's 0.3,
    so the tuner's parameters go into status and the ConfigMap."""
    from tests.operator.access_log import write_access_log

    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    log = write_access_log(tmp_path / "access.jsonl")
    in_spec = {"survivalThreshold": 0.3, "horizon": 120, "recencyScale": 30, "rMin": 0.6}
    sp = spec(policy={"name": "hybrid", "parameters": in_spec},
              tuning={"enabled": True, "intervalSeconds": 600, "accessLogs": [str(log)],
                      "capacityBlocks": 180, "minImprovement": 0.01,
                      "parameters": [{"name": "survivalThreshold", "min": 0.05, "max": 0.8,
                                      "steps": 6}]})
    out = await run(kmock, sp, {}, StubMetrics(CALM), access_log_dir=tmp_path)
    assert out.status["parametersSource"] == "tuner", out.status.get("lastTuningReason")
    tuned = out.status["parameters"]
    assert tuned["survivalThreshold"] < 0.3 and tuned["horizon"] == 120
    assert "adopted" in out.status["lastTuningReason"] and out.facts["tuning"] == "adopted"
    doc = yaml.safe_load(kmock.objects["v1/configmaps", NS, "llama-anchorage"]["data"][DATA_KEY])
    assert doc["policy"]["parametersSource"] == "tuner"
    assert doc["policy"]["parameters"] == tuned
    assert any(e.reason == "Tuned" for e in out.events)
    # within the interval: no new tuning run, tuned parameters stay in force
    again = await run(kmock, sp, out.status, StubMetrics(CALM), now_s=1010.0,
                      access_log_dir=tmp_path)
    assert "lastTuningTime" not in again.status and again.status["parametersSource"] == "tuner"
    # a spec change (new generation) puts the spec's parameters back in force
    sp2 = {**sp, "tuning": {**sp["tuning"], "enabled": False}}
    third = await run(kmock, sp2, again.status, StubMetrics(CALM), now_s=1020.0, generation=2,
                      access_log_dir=tmp_path)
    assert third.status["parametersSource"] == "spec" and third.status["parameters"] == in_spec
    assert third.status["decision"]["tuned"] is None


async def test_tuning_with_unreadable_log_reports_failure(kmock, tmp_path):
    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "hash_ids": "oops", "output_length": 1}\n')
    sp = spec(tuning={"enabled": True, "accessLogs": [str(bad), str(tmp_path / "missing")],
                      "capacityBlocks": 96,
                      "parameters": [{"name": "horizon", "min": 1, "max": 5}]})
    out = await run(kmock, sp, {}, StubMetrics(CALM), access_log_dir=tmp_path)
    assert out.status["lastTuningReason"].startswith("tuning failed: ")
    assert "bad.jsonl:1" in out.status["lastTuningReason"]
    assert out.status["parametersSource"] == "spec" and out.facts["tuning"] == "error"


@pytest.mark.parametrize("over, needle", [
    ({"routing": {"policy": "composite", "weights": {"load": 1, "prefix": 2}}},
     "spec.routing.weights.load: not a scorer"),
    ({"routing": {"policy": "agent", "weights": {"session": 1}}},
     "scorer weights apply to the composite router only"),
    ({"routing": {"policy": "agent", "parameters": {"spred": 2}}},
     "bad parameters for router 'agent'"),
    ({"policy": {"name": "lru", "parameters": {"horizon": 30}}},
     "policy 'lru' does not accept parameter 'horizon_s'"),
    ({"tuning": {"parameters": [{"name": "ttl_s", "min": 0, "max": 1}]}}, "'ttl_s' is not tunable"),
])
async def test_document_rules_are_degraded_before_anything_is_written(kmock, over, needle):
    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    out = await run(kmock, spec(**over), {}, StubMetrics(HOT))
    c = cond(out.status, "Degraded")
    assert c["status"] == "True" and needle in c["message"], c["message"]
    assert writes(kmock, "configmaps") == [] and writes(kmock, "deployments") == []


async def test_composite_routing_reaches_the_document(kmock):
    from anchorage.config import parse

    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    sp = spec(routing={"policy": "composite", "weights": {"prefix": 2, "queue": 1},
                       "parameters": {"picker": "weighted_random"}})
    await run(kmock, sp, {}, StubMetrics(CALM))
    doc = parse(kmock.objects["v1/configmaps", NS, "llama-anchorage"]["data"][DATA_KEY])
    assert doc.routing.policy == "composite"
    assert doc.routing.router_kwargs() == {"picker": "weighted_random",
                                           "scorers": {"prefix": 2.0, "queue": 1.0}}


async def test_a_corrupt_configmap_is_rewritten_at_the_next_generation(kmock):
    kmock.objects["apps/v1/deployments", NS, "web"] = deployment(2)
    out = await run(kmock, spec(), {}, StubMetrics(CALM))
    cm = kmock.objects["v1/configmaps", NS, "llama-anchorage"]
    text = cm["data"][DATA_KEY]
    kmock.objects["v1/configmaps", NS, "llama-anchorage"] = {   # cut short (edited by hand)
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "llama-anchorage", "namespace": NS, "resourceVersion": "99",
                     "annotations": {GENERATION_ANNOTATION: "1"}},
        "data": {DATA_KEY: text[:40]}}
    again = await run(kmock, spec(), out.status, StubMetrics(CALM))
    doc = yaml.safe_load(kmock.objects["v1/configmaps", NS, "llama-anchorage"]["data"][DATA_KEY])
    assert doc["generation"] == 2 and again.status["configGeneration"] == 2
