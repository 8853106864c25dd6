"""Policy parameters in the tuner's flat view, from the one table in ``anchorage.config.parameters``.

The CRD nests prefetch settings (``prefetch: {enabled, ratePerSecond}``); the tuner and the
replay use a flat view (``prefetchEnabled``, ``prefetchRatePerSecond``; the other names as
in the CRD), mapped to the policies' keyword arguments by ``POLICY_KWARGS``
(``survivalThreshold`` -> ``survival_threshold``, ``horizon`` -> ``horizon_s``...). The
names, ranges and defaults are ``anchorage.config.parameters.PARAMETERS``; nothing here
lists them again.

``policy_kwargs`` passes a name outside the table through unchanged: the tuner's replay of
a policy with parameters of its own (``ttl_s`` of ``ttl``), which only tests and the
simulator use; ``spec.tuning.parameters`` names are the table's tunable ones.
"""

from __future__ import annotations

from typing import Any

from anchorage.config.parameters import PARAMETERS
from anchorage.config.parameters import POLICY_KWARGS as _KWARGS

# flat name -> the policies' keyword argument
POLICY_KWARGS: dict[str, str] = {p.flat: _KWARGS[p.kwarg] for p in PARAMETERS.values()}
_NESTED = {p.flat: p.path for p in PARAMETERS.values() if len(p.path) > 1}
_GROUPS = {path[0] for path in _NESTED.values()}


def flatten(parameters: dict[str, Any] | None) -> dict[str, Any]:
    """CRD ``spec.policy.parameters`` -> flat tuning names."""
    params = parameters or {}
    out = {k: v for k, v in params.items() if k not in _GROUPS}
    for flat, (group, key) in _NESTED.items():
        sub = params.get(group) or {}
        if key in sub:
            out[flat] = sub[key]
    return out


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat tuning names -> the CRD's nested shape (inverse of ``flatten``)."""
    out: dict[str, Any] = {}
    for k, v in flat.items():
        if k in _NESTED:
            group, key = _NESTED[k]
            out.setdefault(group, {})[key] = v
        else:
            out[k] = v
    return out


def policy_kwargs(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat tuning names -> keyword arguments of the policy factories."""
    return {POLICY_KWARGS.get(k, k): v for k, v in flat.items()}
