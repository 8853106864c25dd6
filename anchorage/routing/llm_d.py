"""``llm_d``: the llm-d inference scheduler (EPP) with its precise-prefix-cache-aware
scheduling profile.

Spec: a ``composite`` router (``anchorage.routing.composite``: filter, weighted scorers,
max-score picker) configured as llm-d's well-lit path ships it
(llm-d/llm-d ``guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml``,
profile ``default``; plugins from llm-d-inference-scheduler ``pkg/epp/.../scorer``):

- filter ``decode-filter``: every healthy replica (aggregated serving, no prefill pods);
- ``precise-prefix-cache-scorer``, weight 2.0: matched leading blocks / request blocks,
  over the replicas' KV events (``precise_prefix``);
- ``kv-cache-utilization-scorer``, weight 1.0: ``1 - kv_usage``;
- ``queue-scorer``, weight 1.0: waiting-queue size, min-max normalised, fewer is better
  (``waiting_queue``);
- ``max-score-picker``: the highest total, ties at random (``seed``).

``total_r = 2 * m_r / |K| + (1 - kv_usage_r) + (max_q - q_r) / (max_q - min_q)`` (the last
term 1 for all when the queues are equal). Parameters: the weights
(``prefix_weight`` 2.0, ``kv_weight`` 1.0, ``queue_weight`` 1.0) and ``seed`` (0).
"""

from __future__ import annotations

from anchorage.routing.composite import CompositeRouter


def llm_d_router(prefix_weight: float = 2.0, kv_weight: float = 1.0,
                 queue_weight: float = 1.0, seed: int = 0) -> CompositeRouter:
    r = CompositeRouter(filters=["healthy"],
                        scorers=[{"name": "precise_prefix", "weight": prefix_weight},
                                 {"name": "kv_usage", "weight": kv_weight},
                                 {"name": "waiting_queue", "weight": queue_weight}],
                        picker="max_score", seed=seed)
    r.name = "llm_d"
    return r


ROUTERS = {"llm_d": lambda **params: llm_d_router(**params)}
