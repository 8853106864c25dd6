"""The router's Prometheus series (``anchorage_router_*``), in one private registry per
router process (each replica serves its own counts; Prometheus sums them).

The ``replica`` label is the upstream's pod name when discovery knows it (the Endpoints'
or EndpointSlice's ``targetRef``), its URL otherwise (static replicas); when a replica
leaves, every series of it is deleted (``forget_replica``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._children: dict = {}
        self.requests = Counter("anchorage_router_requests", "Requests by replica, policy and outcome",
                                ["replica", "policy", "outcome"], registry=r)
        self.decision = Histogram("anchorage_router_decision_seconds", "Routing decision time",
                                  buckets=(1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3, 1e-2),
                                  registry=r)
        self.predicted = Counter("anchorage_router_predicted_cached_tokens",
                                 "Cached prompt tokens the router predicted", ["replica"], registry=r)
        self.observed = Counter("anchorage_router_observed_cached_tokens",
                                "Cached prompt tokens replicas reported (usage.prompt_tokens_details)",
                                ["replica"], registry=r)
        self.prompt = Counter("anchorage_router_prompt_tokens", "Prompt tokens replicas reported",
                              ["replica"], registry=r)
        self.retries = Counter("anchorage_router_retries", "Attempts retried on another replica",
                               ["replica", "reason"], registry=r)
        self.ejections = Counter("anchorage_router_ejections", "Replicas ejected as unhealthy",
                                 ["replica"], registry=r)
        self.rejected = Counter("anchorage_router_rejected", "Requests refused (429 saturated, 4xx)",
                                ["reason"], registry=r)
        self.healthy = Gauge("anchorage_router_replica_healthy", "1 if the replica is in rotation",
                             ["replica"], registry=r)
        self.inflight = Gauge("anchorage_router_replica_inflight", "Requests in flight per replica",
                              ["replica"], registry=r)
        self.queued_tokens = Gauge("anchorage_router_replica_queued_tokens",
                                   "Estimated prefill tokens queued per replica (sent, no "
                                   "first byte yet, less predicted cache hits)",
                                   ["replica"], registry=r)

        self.peer_staleness = Histogram(
            "anchorage_router_peer_staleness_seconds",
            "Age of another router replica's decision when this one applied it",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=r)
        self.peer_decisions = Counter("anchorage_router_peer_decisions",
                                      "Decisions of other router replicas applied here", registry=r)
        self.peer_lost = Counter("anchorage_router_peer_batches_lost",
                                 "Batches of peer decisions dropped before this replica read them",
                                 registry=r)
        self.peer_sync_errors = Counter("anchorage_router_peer_sync_errors",
                                        "Failed exchanges with the shared routing state", registry=r)
        self.config_generation = Gauge("anchorage_router_config_generation",
                                       "Generation of the operator's document in force",
                                       ["model"], registry=r)
        self.config_rejected = Counter("anchorage_router_config_rejected",
                                       "Operator documents the router refused to apply",
                                       ["model"], registry=r)

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, memoised (the request path looks each up per request)."""
        key = (id(metric), labels)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = metric.labels(*labels)
        return got

    def forget_replica(self, replica: str) -> None:
        """Delete every series labelled ``replica=<replica>`` and its memoised children."""
        for m in (self.requests, self.predicted, self.observed, self.prompt, self.retries,
                  self.ejections, self.healthy, self.inflight, self.queued_tokens):
            m.remove_by_labels({"replica": replica})
        self._children = {k: v for k, v in self._children.items() if replica not in k[1]}

    def text(self) -> bytes:
        return generate_latest(self.registry)
