"""anchorage.operator: the kopf operator for ``AgentCachePolicy`` (anchorage.dev/v1alpha1).

Layers: ``handlers`` (kopf registration, thin) -> ``reconcile`` (one pass: validate, write
the config map, decide and apply replicas, tune, build the status) -> adapters ``kube``
(scale subresource, ConfigMap) and ``prometheus`` (windowed fleet metrics). Decisions live
in the core (``anchorage.autoscale``).
"""
