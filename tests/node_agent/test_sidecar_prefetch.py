"""The prefetch knobs from the AgentCachePolicy to the sidecar's behaviour: the operator's
reconcile pass turns each spec into the ConfigMap document, the document is swapped in as
the kubelet swaps a ConfigMap file, and the sidecar (against a fake engine and a snapshot
from the real exporter) sends warm-ups or not, at most at the document's rate.

spec.policy.parameters  ->  anchorage.yaml  ->  sidecar
  prefetch.enabled: false     no warm-ups (each wanted one counted skipped)
  prefetch.ratePerSecond: 2   warm-ups flow, at most burst + 2/s
  rMin: 0.95 (R = 0.9)        the gate closes: no more warm-ups
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from prometheus_client import generate_latest

from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
from anchorage.node_agent.state import PolicyStateExporter
from anchorage.warmup import WarmupConfig
from tests.node_agent.fake_engine import FakeEngine
from tests.node_agent.test_sidecar import BS, Stub, metric, until

AGENTS = [f"fp:{i:02d}" for i in range(40)]


class ConfigMaps:
    """The operator's Kube port, holding ConfigMaps in memory (no target: scaling skipped)."""

    def __init__(self):
        self.cms: dict[str, dict] = {}
        self.rv = 0

    def get_scale(self, kind, namespace, name):
        return None

    def set_replicas(self, *a):
        raise AssertionError("no target to scale")

    def get_configmap(self, namespace, name):
        cm = self.cms.get(name)
        return None if cm is None else {"data": cm["data"], "annotations": {},
                                        "resourceVersion": str(self.rv)}

    def put_configmap(self, namespace, body, resource_version):
        self.rv += 1
        self.cms[body["metadata"]["name"]] = body


def operator_writes(kube: ConfigMaps, path, generation: int, parameters: dict) -> int:
    """One reconcile pass of the policy at ``generation``; the document lands at ``path``
    (write + rename, as the kubelet swaps a ConfigMap). Returns the document's generation."""
    from anchorage.config import parse
    from anchorage.operator.reconcile import reconcile

    spec = {"targetRef": {"name": "llama"},
            "policy": {"name": "hybrid", "parameters": parameters},
            "autoscaling": {"enabled": False}}
    out = reconcile(name="llama", namespace="llm", uid="u", generation=generation, spec=spec,
                    status={}, kube=kube, metrics_for=lambda url: None, now_s=time.time())
    assert not [c for c in out.status["conditions"]
                if c["type"] == "Degraded" and c["status"] == "True"], out.status
    text = kube.cms["llama-anchorage"]["data"]["anchorage.yaml"]
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)
    return parse(text).generation


@pytest.fixture
def engine(tmp_path):
    eng = FakeEngine(f"ipc://{tmp_path}/kv.ipc")
    yield eng
    eng.close()


def test_prefetch_knobs_from_the_policy_spec_drive_the_sidecars_warmups(engine, tmp_path):
    stub = Stub()
    for i, a in enumerate(AGENTS):   # 40 predicted agents with known anchors, R = 0.9
        stub.anchor(a, [1000 + 8 * i + j for j in range(2 * BS)])
    stub.view["predictions"] = [{"agent": a, "probability": 0.9} for a in AGENTS]
    exp = PolicyStateExporter(stub, tmp_path / "state.json", interval_s=0.05, policy_name="hybrid")
    kube, cfg = ConfigMaps(), tmp_path / "anchorage.yaml"
    # spec 1: prefetch off
    assert operator_writes(kube, cfg, 1, {"rMin": 0.1, "prefetch": {"enabled": False}}) == 1

    async def main():
        # the node agent's own settings would warm up to 100/s, 10 per tick, gate 0.3
        sc = Sidecar(SidecarConfig(
            engine_url=engine.url, kv_events=f"ipc://{tmp_path}/kv.ipc",
            state_dir=str(tmp_path), port=0, tick_s=0.05, snapshot_max_age_s=2.0,
            policy_env="hybrid", config_path=str(cfg),
            warmup=WarmupConfig(rate_per_s=100, burst=1, cooldown_s=3600, max_per_tick=10)))
        await sc.start()
        exp.start()
        loop = asyncio.create_task(sc.run_loop())
        try:
            await until(lambda: sc.config_generation == 1 and sc.fresh(), "generation 1")
            await until(lambda: sc.warmups["skipped"] >= len(AGENTS), "skips (disabled)")
            assert engine.completions == [] and sc.scheduler.config.enabled is False
            assert sc.scheduler.config.r_min == 0.1

            # spec 2: prefetch on at 2 per second
            gen = operator_writes(kube, cfg, 2, {"rMin": 0.1,
                                                 "prefetch": {"enabled": True, "ratePerSecond": 2}})
            await until(lambda: sc.config_generation == gen == 2, "generation 2")
            t0 = time.monotonic()
            await until(lambda: len(engine.completions) >= 3, "warm-ups at 2/s", timeout_s=10)
            await asyncio.sleep(1.5)
            n, elapsed = len(engine.completions), time.monotonic() - t0
            # the token bucket: at most its burst (1) plus 2 per second since the switch
            assert 3 <= n <= 1 + 2 * elapsed + 1, (n, elapsed)
            assert {b["prompt"][0] for b in engine.completions} <= {1000 + 8 * i for i in range(40)}

            # spec 3: a gate above the workload's predictability (R = 0.9): no more warm-ups
            gen = operator_writes(kube, cfg, 3, {"rMin": 0.95,
                                                 "prefetch": {"enabled": True, "ratePerSecond": 2}})
            await until(lambda: sc.config_generation == gen == 3, "generation 3")
            settled = len(engine.completions)
            await asyncio.sleep(1.5)
            assert len(engine.completions) == settled and sc.scheduler.config.r_min == 0.95
            text = generate_latest(sc.registry).decode()
            assert metric(text, "anchorage_warmups_total", outcome="issued") == settled
        finally:
            sc.request_stop()
            await loop
            await sc.stop()
            exp.stop()

    asyncio.run(main())


def test_a_rate_change_keeps_the_tokens_already_spent():
    from anchorage.warmup import WarmupScheduler

    s = WarmupScheduler(WarmupConfig(rate_per_s=0.0, burst=3, cooldown_s=0, max_per_tick=10))
    pred = [(a, 0.9) for a in AGENTS[:10]]
    d = s.decide(0.0, running=0, waiting=0, r=0.9, predictions=pred, known=AGENTS)
    assert len(d.warm) == 3                       # the burst, then nothing at rate 0
    s.reconfigure(WarmupConfig(rate_per_s=1.0, burst=3, cooldown_s=0, max_per_tick=10))
    d = s.decide(0.0, running=0, waiting=0, r=0.9, predictions=pred, known=AGENTS)
    assert d.warm == ()                           # no fresh burst from the change itself
    d = s.decide(2.0, running=0, waiting=0, r=0.9, predictions=pred, known=AGENTS)
    assert len(d.warm) == 2                       # 2 s at the new rate
