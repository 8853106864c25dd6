"""Fleet-level decisions the operator takes: replica count and tuned policy parameters.

Pure functions over plain data (no Kubernetes, Prometheus or kopf imports): ``signals``
(windowed fleet metrics), ``scaling`` (desired replicas with hysteresis, stabilization and
cooldown), ``tuning`` (digital-twin replay of candidate parameters and the adoption rule),
``params`` (CRD parameter names -> policy keyword arguments). See docs/autoscaling.md.
"""

from anchorage.autoscale.scaling import (AutoscaleConfig, ScaleDecision, ScalerState,
                                         decide_replicas)
from anchorage.autoscale.signals import FleetSignals, MetricsError

__all__ = ["AutoscaleConfig", "FleetSignals", "MetricsError", "ScaleDecision", "ScalerState",
           "decide_replicas"]
