"""Policy parameters of the configuration document: the one table of their names.

Specification
-------------
``spec.policy.parameters`` of an ``AgentCachePolicy`` and ``policy.parameters`` of the
``anchorage.yaml`` document carry the same names, nested as in the CRD::

    survivalThreshold: 0.3            # -> survival_threshold   [0, 1]          default 0
    horizon: 120                      # -> horizon_s            (0, inf] s      default inf
    recencyScale: 30                  # -> recency_scale_s      (0, inf] s      default inf
    rMin: 0.6                         # -> r_min                [0, 1]          default 0
    prefetch: {enabled: true,         # -> prefetch             bool            default true
               ratePerSecond: 4}      # -> prefetch_rate_per_s  [0, inf) per s  default 4

``PARAMETERS`` (built from ``PolicyParameters``' field metadata) is the only list of these
names: the flat tuning names (``prefetchEnabled``, ``prefetchRatePerSecond``), the
policies' keyword arguments, the ranges, which ones the tuner may change and which ones the
node-agent sidecar applies to its warm-ups (``rMin`` -> ``WarmupConfig.r_min``,
``prefetch.enabled`` -> ``enabled``, ``prefetch.ratePerSecond`` -> ``rate_per_s``). The
CRD's schema, ``anchorage.autoscale.params``, the docs and the policies' own validation
(``policy_tuning``) are tested against it. An omitted parameter (``None``) takes the
policy's (or the sidecar's) built-in default. Ranges are the policies': the CRD may bound a
parameter more tightly (``horizon`` at most a day), never more loosely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

INF = math.inf


class ConfigError(ValueError):
    """A configuration document (or part of one) that cannot be applied; the message names
    the offending field and is one line, for a log or a status condition."""


@dataclass(frozen=True)
class Parameter:
    """One row of the table (``PolicyParameters`` field metadata)."""

    kwarg: str                 # the policies' keyword argument (= the dataclass field)
    path: tuple[str, ...]      # where it sits in policy.parameters (CRD names)
    kind: type                 # float or bool
    minimum: float = 0.0
    maximum: float = INF
    exclusive_minimum: bool = False
    default: Any = None        # the policies' built-in default
    tunable: bool = True       # may appear in spec.tuning.parameters
    warmup: str | None = None  # the sidecar's WarmupConfig field it sets
    meaning: str = ""

    @property
    def flat(self) -> str:
        """The tuner's flat name: ``horizon``, ``prefetchRatePerSecond``..."""
        head, *rest = self.path
        return head + "".join(p[:1].upper() + p[1:] for p in rest)

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    def range_text(self) -> str:
        if self.kind is bool:
            return "true or false"
        lo = "(" if self.exclusive_minimum else "["
        return f"{lo}{self.minimum:g}, {self.maximum:g}]"

    def check(self, value: Any, where: str) -> Any:
        """``value`` normalised (numbers as float), or ConfigError naming ``where``."""
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: must be true or false, not {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"{where}: must be a number, not {value!r}")
        v = float(value)
        if v < self.minimum or v > self.maximum or (self.exclusive_minimum and v == self.minimum):
            raise ConfigError(f"{where}: must be in {self.range_text()}, not {value!r}")
        return v


def _param(path: str, kind: type = float, **kw: Any) -> Any:
    return field(default=None, metadata={"parameter": dict(path=tuple(path.split(".")),
                                                           kind=kind, **kw)})


@dataclass(frozen=True)
class PolicyParameters:
    """``policy.parameters``: each None when omitted (the built-in default applies)."""

    survival_threshold: float | None = _param(
        "survivalThreshold", maximum=1.0, default=0.0,
        meaning="keep a free block while its predicted survival (probability of reuse "
                "within the horizon) is at least this; 0 = off")
    horizon_s: float | None = _param(
        "horizon", exclusive_minimum=True, default=INF,
        meaning="seconds ahead a reuse prediction counts; a group expected later is "
                "evicted first")
    recency_scale_s: float | None = _param(
        "recencyScale", exclusive_minimum=True, default=INF,
        meaning="time constant (s) of the recency term of groups without a signal")
    r_min: float | None = _param(
        "rMin", maximum=1.0, default=0.0, warmup="r_min",
        meaning="predictability gate R_min: transition terms, and the sidecar's warm-ups, "
                "apply only while R is at least this")
    prefetch_enabled: bool | None = _param(
        "prefetch.enabled", kind=bool, default=True, tunable=False, warmup="enabled",
        meaning="the sidecar issues warm-ups for predicted next agents")
    prefetch_rate_per_s: float | None = _param(
        "prefetch.ratePerSecond", default=4.0, warmup="rate_per_s",
        meaning="warm-ups per second at most (the sidecar's token bucket refill)")

    def __post_init__(self) -> None:
        for p in PARAMETERS.values():
            v = getattr(self, p.kwarg)
            if v is not None:
                object.__setattr__(self, p.kwarg, p.check(v, f"policy.parameters.{p.dotted}"))

    # -- the shapes each consumer reads -------------------------------------------------
    @classmethod
    def from_crd(cls, d: Any, where: str = "policy.parameters") -> "PolicyParameters":
        """From the CRD's nested mapping; unknown names are a ConfigError naming them."""
        if d is None:
            return cls()
        return cls(**{k: v for k, v in _walk(d, where, _TREE).items()})

    @classmethod
    def from_flat(cls, flat: dict[str, Any]) -> "PolicyParameters":
        """From the tuner's flat names (``prefetchRatePerSecond``...)."""
        by_flat = {p.flat: p.kwarg for p in PARAMETERS.values()}
        unknown = sorted(set(flat) - set(by_flat))
        if unknown:
            raise ConfigError(f"unknown policy parameter(s) {', '.join(unknown)}; known: "
                              f"{', '.join(by_flat)}")
        return cls(**{by_flat[k]: v for k, v in flat.items()})

    def to_crd(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in PARAMETERS.values():
            v = getattr(self, p.kwarg)
            if v is None:
                continue
            node = out
            for part in p.path[:-1]:
                node = node.setdefault(part, {})
            node[p.path[-1]] = _plain(v)
        return out

    def to_flat(self) -> dict[str, Any]:
        return {p.flat: _plain(getattr(self, p.kwarg)) for p in PARAMETERS.values()
                if getattr(self, p.kwarg) is not None}

    def policy_kwargs(self) -> dict[str, Any]:
        """The set parameters as the policies' keyword arguments (``make_policy``)."""
        return {POLICY_KWARGS[p.kwarg]: getattr(self, p.kwarg) for p in PARAMETERS.values()
                if getattr(self, p.kwarg) is not None}

    def warmup_overrides(self) -> dict[str, Any]:
        """The set parameters the sidecar applies, as ``WarmupConfig`` fields."""
        return {p.warmup: getattr(self, p.kwarg) for p in PARAMETERS.values()
                if p.warmup and getattr(self, p.kwarg) is not None}


def _plain(v: Any) -> Any:
    """Numbers as the YAML/JSON a user would write (120.0 -> 120)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return int(v)
    return v


PARAMETERS: dict[str, Parameter] = {
    f.name: Parameter(kwarg=f.name, **f.metadata["parameter"]) for f in fields(PolicyParameters)}
# The policies' keyword argument of each parameter (the policy's own spelling).
POLICY_KWARGS: dict[str, str] = {"prefetch_enabled": "prefetch",
                                 **{k: k for k in PARAMETERS if k != "prefetch_enabled"}}
TUNABLE: tuple[str, ...] = tuple(p.flat for p in PARAMETERS.values() if p.tunable)


def _tree() -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for p in PARAMETERS.values():
        node = tree
        for part in p.path[:-1]:
            node = node.setdefault(part, {})
        node[p.path[-1]] = p.kwarg
    return tree


_TREE = _tree()


def _walk(d: Any, where: str, tree: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: must be a mapping, not {type(d).__name__}")
    out: dict[str, Any] = {}
    for k, v in d.items():
        sub = tree.get(k)
        if sub is None:
            raise ConfigError(f"{where}.{k}: unknown parameter; known: {', '.join(tree)}")
        if isinstance(sub, dict):
            out.update(_walk(v, f"{where}.{k}", sub))
        elif v is not None:
            out[sub] = v
    return out


def policy_tuning() -> tuple[dict[str, Any], Callable[..., dict[str, Any]]]:
    """The policies' side of the table: (their defaults by keyword, their validator).

    The one place that knows where the policies keep them; tests check the table above
    against it (names, defaults and ranges)."""
    from dataclasses import asdict

    from anchorage.policies.group.config import TUNING_DEFAULTS, Tuning

    def check(**params: Any) -> dict[str, Any]:
        return asdict(Tuning(**params))   # TypeError: unknown name; ValueError: bad value

    return TUNING_DEFAULTS, check
