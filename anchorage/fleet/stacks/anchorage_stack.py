"""``anchorage``: the full stack at its defaults, and one ablation per component, each
switched to the strongest peer's choice for that component.

Components (Anchorage's defaults): routing ``agent`` (``anchorage.routing.agent``), GPU
eviction ``hybrid``, admission ``prefix-aware`` (``anchorage.policies.admission``), host
tier ``tokencake`` (the temporal gate, demotion and warm-up of ``anchorage.tiering``, plus
the spatial reservation). Ablations (``anchorage-<component>``):

- ``-routing``: llm-d's scheduler (``llm_d``: precise prefix, KV utilisation and queue
  scorers), the router of the strongest peer on WEKA in the first runs (llm-d with CPU
  offload);
- ``-eviction``: vLLM's LRU (every peer's);
- ``-admission``: FCFS (vLLM's);
- ``-host``: the peers' host policy, every turn's new blocks stored, reloaded at admission
  (``store-all``: vLLM's offloading connector, LMCache, KVBM);
- ``-gate``: every tool stall offloaded and reloaded, no gate (``naive-incremental``);
- ``-spatial``: no spatial reservation (``temporal``).

Prefetch (CacheScout's between-step warm-up) is not part of the simulator, so it has no
ablation here.
"""

from dataclasses import replace

from anchorage.fleet.spec import StackSpec

FULL = StackSpec(
    name="anchorage", peer="Anchorage (agent routing, hybrid, prefix-aware, tokencake)",
    source="anchorage/routing/agent.py, policies/hybrid.py, policies/admission.py, "
           "tiering/ (controller, temporal, spatial)",
    role="anchorage", router="agent", policy="hybrid", admission="prefix-aware",
    tiering="tokencake")

ABLATIONS = {
    "routing": dict(router="llm_d"),
    "eviction": dict(policy="lru"),
    "admission": dict(admission="fcfs"),
    "host": dict(tiering="store-all"),
    "gate": dict(tiering="naive-incremental"),
    "spatial": dict(tiering="temporal"),
}

STACKS = {"anchorage": FULL}
for comp, change in ABLATIONS.items():
    name = f"anchorage-{comp}"
    STACKS[name] = replace(FULL, name=name, role="ablation",
                           peer=f"Anchorage, {comp} as the peers do it", **change)
