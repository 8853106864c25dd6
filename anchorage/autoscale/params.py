"""Policy parameters: the CRD's names (``spec.policy.parameters``) and the policies' kwargs.

The CRD nests prefetch settings (``prefetch: {enabled, ratePerSecond}``); the tuner and the
replay use a flat view with these names, mapped to policy keyword arguments:

    survivalThreshold      -> survival_threshold     (0..1)
    horizon                -> horizon_s              (seconds)
    recencyScale           -> recency_scale_s        (seconds)
    rMin                   -> r_min                  (0..1, predictability gate)
    prefetchEnabled        -> prefetch               (bool)
    prefetchRatePerSecond  -> prefetch_rate_per_s    (warm-ups per second)

Names not in the table pass through unchanged (a policy may take extra parameters).
"""

from __future__ import annotations

from typing import Any

POLICY_KWARGS = {
    "survivalThreshold": "survival_threshold",
    "horizon": "horizon_s",
    "recencyScale": "recency_scale_s",
    "rMin": "r_min",
    "prefetchEnabled": "prefetch",
    "prefetchRatePerSecond": "prefetch_rate_per_s",
}


def flatten(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """CRD ``spec.policy.parameters`` -> flat tuning names."""
    out = {k: v for k, v in (parameters or {}).items() if k != "prefetch"}
    pre = (parameters or {}).get("prefetch") or {}
    if "enabled" in pre:
        out["prefetchEnabled"] = pre["enabled"]
    if "ratePerSecond" in pre:
        out["prefetchRatePerSecond"] = pre["ratePerSecond"]
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat tuning names -> the CRD's nested shape (inverse of ``flatten``)."""
    out = {k: v for k, v in flat.items() if k not in ("prefetchEnabled", "prefetchRatePerSecond")}
    pre = {}
    if "prefetchEnabled" in flat:
        pre["enabled"] = flat["prefetchEnabled"]
    if "prefetchRatePerSecond" in flat:
        pre["ratePerSecond"] = flat["prefetchRatePerSecond"]
    if pre:
        out["prefetch"] = pre
    return out


def policy_kwargs(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat tuning names -> keyword arguments of the policy factories."""
    return {POLICY_KWARGS.get(k, k): v for k, v in flat.items()}
