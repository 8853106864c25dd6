"""The prefetch knobs from the AgentCachePolicy to the node agent's behaviour: the
operator's reconcile pass turns each spec into the ConfigMap document, the document is
swapped in as the kubelet swaps a ConfigMap file, and the sidecar (tests/node_agent/
harness.py: a fake engine, a snapshot from the real exporter predicting 40 agents at R =
0.9) sends warm-ups or not, at most at the document's rate:

spec.policy.parameters  ->  anchorage.yaml  ->  node agent
  prefetch.enabled: false     no warm-ups (each wanted one counted skipped)
  prefetch.ratePerSecond: 2   warm-ups flow, at most burst (1) + 2/s
  rMin: 0.95 (R = 0.9)        the gate closes: no more warm-ups
"""

from __future__ import annotations

import time

from anchorage.warmup import WarmupConfig
from tests.node_agent.harness import NodeAgent, wait, write_atomically

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
    """One reconcile pass of the policy at ``generation``; its document lands at ``path``.
    Returns the document's generation."""
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
    write_atomically(path, text)
    return parse(text).generation


def test_prefetch_knobs_from_the_policy_spec_drive_the_node_agents_warmups(tmp_path):
    kube, cfg = ConfigMaps(), tmp_path / "anchorage.yaml"
    assert operator_writes(kube, cfg, 1, {"rMin": 0.1, "prefetch": {"enabled": False}}) == 1
    na = NodeAgent(tmp_path, cfg).start()
    sc = na.sidecar
    try:
        wait(lambda: sc.config_generation == 1 and sc.fresh(), "generation 1")
        wait(lambda: sc.warmups["skipped"] >= len(na.agents), "skips (disabled)")
        assert na.warmups_sent == 0 and sc.scheduler.config.enabled is False
        assert sc.scheduler.config.r_min == 0.1
        assert na.metric("anchorage_config_generation") == 1

        # spec 2: prefetch on, at 2 per second
        gen = operator_writes(kube, cfg, 2, {"rMin": 0.1,
                                             "prefetch": {"enabled": True, "ratePerSecond": 2}})
        wait(lambda: sc.config_generation == gen == 2, "generation 2")
        t0 = time.monotonic()
        wait(lambda: na.warmups_sent >= 3, "warm-ups at 2/s", 10)
        time.sleep(1.5)
        n, elapsed = na.warmups_sent, time.monotonic() - t0
        # the token bucket: at most its burst (1) plus 2 per second since the switch
        assert 3 <= n <= 1 + 2 * elapsed + 1, (n, elapsed)

        # spec 3: a gate above the workload's predictability (R = 0.9): no more warm-ups
        gen = operator_writes(kube, cfg, 3, {"rMin": 0.95,
                                             "prefetch": {"enabled": True, "ratePerSecond": 2}})
        wait(lambda: sc.config_generation == gen == 3, "generation 3")
        # both counters at one quiescent point (a warm-up issued just before the switch
        # may still be on its way to the engine): every issued warm-up reached it
        settled, issued = na.quiescent_counts()
        assert issued == settled >= n
        time.sleep(1.5)
        assert na.warmups_sent == settled and sc.scheduler.config.r_min == 0.95
        assert na.metric("anchorage_config_generation") == 3
    finally:
        na.stop()


def test_a_refused_document_changes_nothing(tmp_path):
    kube, cfg = ConfigMaps(), tmp_path / "anchorage.yaml"
    operator_writes(kube, cfg, 1, {"prefetch": {"enabled": False}})
    na = NodeAgent(tmp_path, cfg).start()
    try:
        wait(lambda: na.sidecar.config_generation == 1, "generation 1")
        text = cfg.read_text()
        write_atomically(cfg, text.replace("enabled: false", "enabled: true")[:-5])  # truncated
        time.sleep(0.5)
        assert na.sidecar.scheduler.config.enabled is False and na.warmups_sent == 0
        assert na.metric("anchorage_config_generation") == 1
        write_atomically(cfg, "")                                                   # empty
        time.sleep(0.5)
        assert na.sidecar.scheduler.config.enabled is False and na.warmups_sent == 0
    finally:
        na.stop()


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
