"""``anchorage``: the full stack at its defaults, and one ablation per component, each
switched to the strongest peer's choice for that component.

Components (Anchorage's defaults): routing ``agent`` (``anchorage.routing.agent``), GPU
eviction ``hybrid``, admission ``prefix-aware`` with the deployment's TTFT target (the
setting's SLO: urgent requests first, late ones last; ``anchorage.policies.admission``),
host tier ``store-all`` (every turn's new blocks stored in host memory, reloaded at admission:
what the engine's offloading connector does, and what the peers do) with the node pool (each
GPU's host tier read by the node's other GPUs, one copy per node, with the node's capacity
and one LRU order over the node: ``TieringConfig.host_scope = "node-lru"``, the chart's
``hostTier.nodePool``, ``anchorage.node_agent.offload.node_pool`` and ``pool_manager``; a
thread the router moves off a busy replica reloads its history from host memory instead of
recomputing it; ``anchorage-own-host`` is the stack without the pool,
``anchorage-node-share`` the pool with each GPU's own capacity and order), and prefill chunks of
at most 2,048 tokens per step beside other requests (vLLM's ``long_prefill_token_threshold``,
the chart's ``longPrefillTokens``: a new coding-agent session's 100k-token prefill no longer
holds every turn behind it for seconds; ``anchorage-no-prefill-cap`` is the stack without it,
docs/research/fleet.md, "Long prefills"). The gated tier
``tokencake`` (the temporal gate, demotion and warm-up of ``anchorage.tiering``, plus the
spatial reservation) was the default until the ablations at WEKA's knee measured it below
store-all (0.168 vs 0.227 turns/s/GPU within the SLO, docs/research/fleet.md); it
stays as the variant ``anchorage-tokencake``, with its own two ablations. Ablations
(``anchorage-<component>``):

- ``-routing``: llm-d's scheduler (``llm_d``: precise prefix, KV utilisation and queue
  scorers), the router of the strongest peer on WEKA in the first runs (llm-d with CPU
  offload);
- ``-eviction``: vLLM's LRU (every peer's);
- ``-admission``: FCFS (vLLM's);
- ``-host``: no host tier (``off``), the GPU cache alone.

Variants of the gated tier: ``anchorage-tokencake`` (``tokencake``), and its ablations
``anchorage-tokencake-gate`` (every tool stall offloaded and reloaded, no gate:
``naive-incremental``) and ``anchorage-tokencake-spatial`` (no spatial reservation:
``temporal``). ``anchorage-thunderagent``: ThunderAgent's program gate (pause and resume
of programs by KV capacity, ``anchorage.sim.programs``) above Anchorage's engine policies;
the gate places programs itself, so Anchorage's router is not used. The router has no
program gate yet: this row measures what one would add, it is not a deployable stack.
``anchorage-node-pooled``: one allocator over the node's host memory instead of the node pool's
shared reads (``host_scope = "pooled"``, not deployable: a reference for what the shared reads
leave). ``anchorage-node-share``: the node pool as it first landed, each GPU's capacity and
LRU order its own (``host_scope = "node"``; the chart's ``hostTier.nodePool.growth: 1``
comes close: each engine within its own capacity, the node's oldest chunk still evicted
first).
``anchorage-no-target``: prefix-aware admission without the TTFT target (CacheWise's order,
Anchorage's default before the target), without the prefill cap and without the node pool;
the ablations and the other variants change one component of it.

Prefetch (CacheScout's between-step warm-up) is not part of the simulator, so it has no
ablation here.
"""

from dataclasses import replace

from anchorage.fleet.spec import StackSpec

FULL = StackSpec(
    name="anchorage",
    peer="Anchorage (agent routing, hybrid, prefix-aware, store-all host, node pool)",
    source="anchorage/routing/agent.py, policies/hybrid.py, policies/admission.py, "
           "tiering/replica.py (store-all), tiering/host_tier.py (lru_hosts: the node pool), "
           "sim/engine.py (long_prefill_tokens)",
    role="anchorage", router="agent", policy="hybrid", admission="prefix-aware",
    admission_params={"ttft_target_s": "$slo"}, tiering="store-all",
    tiering_params={"host_scope": "node-lru"}, long_prefill_tokens=2048)

# The ablations and variants change one component of ``anchorage-no-target`` (the full
# stack without the TTFT target, the prefill cap and the node pool), the stack they were
# measured against; ``anchorage-no-prefill-cap`` and ``anchorage-own-host`` measure the cap
# and the node pool.
NO_TARGET = dict(admission_params={}, long_prefill_tokens=0, tiering_params={})
ABLATIONS = {
    "routing": dict(router="llm_d", **NO_TARGET),
    "eviction": dict(policy="lru", **NO_TARGET),
    "admission": dict(admission="fcfs", **NO_TARGET),
    "host": dict(tiering="off", **NO_TARGET),
}
VARIANTS = {
    "no-target": NO_TARGET,
    "no-prefill-cap": dict(long_prefill_tokens=0),
    "own-host": dict(tiering_params={}),
    "node-pooled": dict(tiering_params={"host_scope": "pooled"}),
    "node-share": dict(tiering_params={"host_scope": "node"}),
    "tokencake": dict(tiering="tokencake", **NO_TARGET),
    "tokencake-gate": dict(tiering="naive-incremental", **NO_TARGET),
    "tokencake-spatial": dict(tiering="temporal", **NO_TARGET),
    "thunderagent": dict(program_gate="thunderagent", **NO_TARGET),
}

AS = {"routing": "llm-d's scheduler", "eviction": "vLLM's LRU", "admission": "FCFS",
      "host": "no host tier, as stock vLLM"}
STACKS = {"anchorage": FULL}
for comp, change in ABLATIONS.items():
    name = f"anchorage-{comp}"
    STACKS[name] = replace(FULL, name=name, role="ablation",
                           peer=f"Anchorage, {comp}: {AS[comp]}", **change)
for var, change in VARIANTS.items():
    name = f"anchorage-{var}"
    STACKS[name] = replace(FULL, name=name, role="ablation",
                           peer=f"Anchorage, {var}", **change)
