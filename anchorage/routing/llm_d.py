"""``llm_d`` and ``llm_d_tiered``: the llm-d inference scheduler (EPP) with its
precise-prefix-cache-aware profile, and with its tiered-prefix-cache guide's profile.

Spec (``llm_d``): a ``composite`` router (``anchorage.routing.composite``: filter, weighted
scorers, max-score picker) configured as llm-d's well-lit path ships it
(llm-d/llm-d ``guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml``,
profile ``default``; plugins from llm-d-inference-scheduler
``pkg/epp/framework/plugins/scheduling/scorer``):

- filter ``decode-filter``: every healthy replica (aggregated serving, no prefill pods);
- ``precise-prefix-cache-scorer``, weight 2.0 (``precise_prefix``,
  ``anchorage.routing.scorers.prefix``): the replicas' KV events per medium (the GPU's, and
  the CPU tier's that vLLM 0.32's offloading connector publishes), each leading block
  credited with its best tier's weight (llm-d-kv-cache ``DefaultKVCacheBackendConfig``:
  GPU 1.0, CPU 0.8), over the request's blocks (main's ``absoluteScoredPods``,
  matched/total, since #1107; ``normalization="min-max"``: v0.8.0's
  ``indexedScoresToNormalizedScoredPods``, min-max across the pods with a match);
- ``kv-cache-utilization-scorer``, weight 1.0: ``1 - kv_usage``;
- ``queue-scorer``, weight 1.0: waiting-queue size, min-max normalised, fewer is better
  (``waiting_queue``);
- ``max-score-picker``: the highest total, ties at random (``seed``).

``total_r = 2 * P_r + (1 - kv_usage_r) + (max_q - q_r) / (max_q - min_q)`` (the last term 1
for all when the queues are equal; ``P_r`` the prefix scorer's normalised score).
Parameters: the weights (``prefix_weight`` 2.0, ``kv_weight`` 1.0, ``queue_weight`` 1.0),
``medium_weights`` (``{"GPU": 1.0, "CPU": 0.8}``), ``normalization`` (``"absolute"``) and
``seed`` (0).

Spec (``llm_d_tiered_router``, ``tiered_guide_params``: a ``composite`` router's
parameters): the router of llm-d's tiered-prefix-cache guide for CPU offloading
(llm-d/llm-d ``guides/tiered-prefix-cache/cpu/router/tiered-prefix-cache-cpu.values.yaml``,
profile ``default``; read in the zetxqx/llm-d mirror, commit 7808df6): ``queue-scorer``
weight 2, ``kv-cache-utilization-scorer`` 2.0, ``gpu-prefix-cache-scorer`` 1.0 (the
extension's approximate ``prefix-cache-scorer``: ``prefix``, an LRU per replica of its GPU
capacity, ``autoTune``) and ``cpu-prefix-cache-scorer`` 1.0 (the same scorer with
``autoTune: false`` and ``lruCapacityPerServer`` set to the CPU cache's blocks: ``prefix``
with ``capacity_from_view`` False and ``cpu_capacity_blocks``, which the fleet sets to the
replica's host-tier capacity as the guide sizes it to ``cpu_bytes_to_use``); max-score
picker. Parameters: ``queue_weight`` 2, ``kv_weight`` 2, ``gpu_prefix_weight`` 1,
``cpu_prefix_weight`` 1, ``cpu_capacity_blocks`` (> 0; default 41,000, the guide's value, "~100GB
for Qwen-32B"; the fleet sets the replica's host tier), ``seed`` 0.
"""

from __future__ import annotations

from anchorage.routing.composite import CompositeRouter


def llm_d_router(prefix_weight: float = 2.0, kv_weight: float = 1.0,
                 queue_weight: float = 1.0, medium_weights: dict | None = None,
                 normalization: str = "absolute", seed: int = 0) -> CompositeRouter:
    prefix = {"name": "precise_prefix", "weight": prefix_weight, "normalization": normalization}
    if medium_weights is not None:
        prefix["medium_weights"] = dict(medium_weights)
    r = CompositeRouter(filters=["healthy"],
                        scorers=[prefix,
                                 {"name": "kv_usage", "weight": kv_weight},
                                 {"name": "waiting_queue", "weight": queue_weight}],
                        picker="max_score", seed=seed)
    r.name = "llm_d"
    return r


def tiered_guide_params(cpu_capacity_blocks: int | str = 41_000, queue_weight: float = 2.0,
                        kv_weight: float = 2.0, gpu_prefix_weight: float = 1.0,
                        cpu_prefix_weight: float = 1.0, seed: int = 0) -> dict:
    """The tiered-prefix-cache guide's profile as ``composite`` router parameters
    (``cpu_capacity_blocks`` may be the fleet's ``"$host_blocks"``)."""
    return {"filters": ["healthy"],
            "scorers": [{"name": "waiting_queue", "weight": queue_weight},
                        {"name": "kv_usage", "weight": kv_weight},
                        {"name": "prefix", "weight": gpu_prefix_weight},
                        {"name": "prefix", "weight": cpu_prefix_weight,
                         "capacity_blocks": cpu_capacity_blocks, "capacity_from_view": False}],
            "picker": "max_score", "seed": seed}


def llm_d_tiered_router(cpu_capacity_blocks: int = 41_000, **weights) -> CompositeRouter:
    if not isinstance(cpu_capacity_blocks, int) or cpu_capacity_blocks <= 0:
        raise ValueError(f"cpu_capacity_blocks must be an integer > 0, got "
                         f"{cpu_capacity_blocks!r}")
    r = CompositeRouter(**tiered_guide_params(cpu_capacity_blocks, **weights))
    r.name = "llm_d_tiered"
    return r


# ``llm_d_tiered`` is not a registered policy (the CRD's and the chart's enums are the
# registry's): the fleet builds it as a ``composite`` router from ``tiered_guide_params``.
ROUTERS = {"llm_d": lambda **params: llm_d_router(**params)}
