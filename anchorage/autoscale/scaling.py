"""Desired replica count from cache efficiency and load, with hysteresis and cooldown.

Specification (docs/autoscaling.md explains the reasoning). Inputs: the current replica
count R, the window's ``FleetSignals`` (hit rate h, waiting requests per replica q, KV usage
u, capacity-miss rate m), the ``AutoscaleConfig`` and the ``ScalerState`` carried between
evaluations (persisted by the operator in ``status.decision`` so a restart resumes it).

1. Bounds: R outside [minReplicas, maxReplicas] -> clamp at once.
2. No metrics (signals is None) -> hold R, reset the pressure timers.
3. Pressure is HIGH when any of
     q > maxQueueDepth                       want ceil(R * q / maxQueueDepth)
     u > maxKvUsage                          want ceil(R * u / maxKvUsage)
     h < targetHitRate and m > 0 and h + m >= targetHitRate
                                             want R + 1 (capacity explains the shortfall:
                                             winning back the blocks evicted and then
                                             reused soon would reach the target)
   want = min(maxReplicas, R + maxScaleUpStep, max(wants)). A hit rate below target that
   capacity does not explain (cold prefixes, poor routing) never scales out.
4. Pressure is LOW when one replica fewer (N = R - 1 >= minReplicas, factor f = R / N) keeps
     q * f <= (1 - tolerance) * maxQueueDepth
     u * f <= (1 - tolerance) * maxKvUsage
     projected hit rate h' = h - m * (f - 1) >= targetHitRate + tolerance * (1 - targetHitRate)
       (capacity misses grow with the working set each replica must hold; h None = no
       traffic = no objection)
     N >= the cache floor (a count that cache pressure forced within the last
       4 scale-down stabilization windows), so a cache-driven scale-out is not undone by the
       next quiet spell.
   The gap between the HIGH and LOW thresholds is the hysteresis band.
5. HIGH continuously for scaleUpStabilizationSeconds, or LOW continuously for
   scaleDownStabilizationSeconds, and no scale action in the last cooldownSeconds -> act
   (scale-in removes one replica per action). Any other evaluation resets the timer of the
   condition that did not hold.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from anchorage.autoscale.signals import FleetSignals

CACHE_FLOOR_WINDOWS = 4


@dataclass(frozen=True)
class AutoscaleConfig:
    enabled: bool = True
    min_replicas: int = 1
    max_replicas: int = 8
    target_hit_rate: float = 0.5
    max_queue_depth: float = 4.0
    max_kv_usage: float = 0.9
    tolerance: float = 0.1
    scale_up_stabilization_s: float = 30.0
    scale_down_stabilization_s: float = 300.0
    cooldown_s: float = 60.0
    max_scale_up_step: int = 2

    _SPEC_NAMES = {
        "enabled": "enabled", "minReplicas": "min_replicas", "maxReplicas": "max_replicas",
        "targetHitRate": "target_hit_rate", "maxQueueDepth": "max_queue_depth",
        "maxKvUsage": "max_kv_usage", "tolerance": "tolerance",
        "scaleUpStabilizationSeconds": "scale_up_stabilization_s",
        "scaleDownStabilizationSeconds": "scale_down_stabilization_s",
        "cooldownSeconds": "cooldown_s", "maxScaleUpStep": "max_scale_up_step",
    }

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> "AutoscaleConfig":
        """From ``spec.autoscaling`` (camelCase, as the CRD names them)."""
        kw = {py: spec[k] for k, py in cls._SPEC_NAMES.items() if spec and k in spec}
        return cls(**kw)

    def problems(self) -> list[str]:
        """Rules the CRD schema cannot express (cross-field); empty when valid."""
        out = []
        if self.min_replicas > self.max_replicas:
            out.append(f"autoscaling.minReplicas ({self.min_replicas}) is greater than "
                       f"maxReplicas ({self.max_replicas})")
        if self.min_replicas < 1:
            out.append("autoscaling.minReplicas must be at least 1")
        for name in ("target_hit_rate", "max_kv_usage"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                out.append(f"autoscaling.{name} must be within 0..1, got {v}")
        if not 0 <= self.tolerance < 1:
            out.append(f"autoscaling.tolerance must be within [0, 1), got {self.tolerance}")
        return out


@dataclass(frozen=True)
class ScalerState:
    high_since_s: float | None = None
    low_since_s: float | None = None
    last_scale_s: float | None = None
    cache_floor: int | None = None
    cache_floor_since_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field, unset ones as null (a status merge patch then clears them)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "ScalerState":
        if not d:
            return cls()
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    reason: str
    state: ScalerState
    pressure: str  # "high", "low", "steady", "hold", "bounds"
    projected_hit_rate: float | None = None


def _want_up(s: FleetSignals, r: int, cfg: AutoscaleConfig) -> tuple[int, list[str], bool]:
    wants, reasons, cache = [], [], False
    if s.queue_depth > cfg.max_queue_depth:
        wants.append(math.ceil(r * s.queue_depth / cfg.max_queue_depth)
                     if cfg.max_queue_depth > 0 else r + 1)
        reasons.append(f"queue {s.queue_depth:.2f}/replica > {cfg.max_queue_depth:g}")
    if s.kv_usage > cfg.max_kv_usage:
        wants.append(math.ceil(r * s.kv_usage / cfg.max_kv_usage) if cfg.max_kv_usage > 0
                     else r + 1)
        reasons.append(f"KV usage {s.kv_usage:.2f} > {cfg.max_kv_usage:g}")
    h, m = s.hit_rate, s.capacity_miss_rate
    if h is not None and h < cfg.target_hit_rate and m > 0 and h + m >= cfg.target_hit_rate:
        wants.append(r + 1)
        cache = True
        reasons.append(f"hit rate {h:.2f} < target {cfg.target_hit_rate:g} with "
                       f"{m:.2f} lost to evictions of soon-reused blocks")
    want = min(cfg.max_replicas, r + cfg.max_scale_up_step, max(wants + [r + 1]))
    return want, reasons, cache


def _scale_in_ok(s: FleetSignals, r: int, cfg: AutoscaleConfig, state: ScalerState,
                 now_s: float) -> tuple[bool, str, float | None]:
    n = r - 1
    if n < cfg.min_replicas:
        return False, f"at minReplicas {cfg.min_replicas}", s.hit_rate
    f = r / n
    keep = 1.0 - cfg.tolerance
    if s.queue_depth * f > keep * cfg.max_queue_depth:
        return False, f"queue after scale-in {s.queue_depth * f:.2f}/replica too close to limit", s.hit_rate
    if s.kv_usage * f > keep * cfg.max_kv_usage:
        return False, f"KV usage after scale-in {s.kv_usage * f:.2f} too close to limit", s.hit_rate
    projected = None
    if s.hit_rate is not None:
        projected = max(0.0, s.hit_rate - s.capacity_miss_rate * (f - 1))
        floor = cfg.target_hit_rate + cfg.tolerance * (1 - cfg.target_hit_rate)
        if projected < floor:
            return False, (f"projected hit rate after scale-in {projected:.2f} < "
                           f"{floor:.2f}"), projected
    if (state.cache_floor is not None and n < state.cache_floor
            and state.cache_floor_since_s is not None
            and now_s - state.cache_floor_since_s < CACHE_FLOOR_WINDOWS * cfg.scale_down_stabilization_s):
        return False, f"cache pressure needed {state.cache_floor} replicas recently", projected
    return True, f"low pressure (queue {s.queue_depth:.2f}, KV {s.kv_usage:.2f}" + (
        f", projected hit rate {projected:.2f})" if projected is not None else ", no traffic)"), projected


def decide_replicas(signals: FleetSignals | None, replicas: int, cfg: AutoscaleConfig,
                    state: ScalerState, now_s: float) -> ScaleDecision:
    """One evaluation of the rules in the module docstring."""
    r = replicas
    bounded = min(cfg.max_replicas, max(cfg.min_replicas, r))
    if bounded != r:
        return ScaleDecision(bounded, f"scale to {bounded}: {r} is outside "
                             f"[{cfg.min_replicas}, {cfg.max_replicas}]",
                             replace(state, high_since_s=None, low_since_s=None,
                                     last_scale_s=now_s), "bounds")
    if signals is None:
        return ScaleDecision(r, "metrics unavailable: holding the last decision",
                             replace(state, high_since_s=None, low_since_s=None), "hold")
    in_cooldown = state.last_scale_s is not None and now_s - state.last_scale_s < cfg.cooldown_s
    want, reasons, cache = _want_up(signals, r, cfg)
    if reasons:
        why = "; ".join(reasons)
        st = replace(state, low_since_s=None,
                     high_since_s=state.high_since_s if state.high_since_s is not None else now_s)
        if want <= r:
            return ScaleDecision(r, f"at maxReplicas {cfg.max_replicas}: {why}", st, "high")
        waited = now_s - st.high_since_s
        if waited < cfg.scale_up_stabilization_s:
            return ScaleDecision(r, f"high pressure for {waited:.0f}s of "
                                 f"{cfg.scale_up_stabilization_s:g}s: {why}", st, "high")
        if in_cooldown:
            return ScaleDecision(r, f"cooldown ({cfg.cooldown_s:g}s): {why}", st, "high")
        st = replace(st, high_since_s=None, last_scale_s=now_s)
        if cache:
            st = replace(st, cache_floor=want, cache_floor_since_s=now_s)
        return ScaleDecision(want, f"scale out {r} -> {want}: {why}", st, "high")
    ok, why, projected = _scale_in_ok(signals, r, cfg, state, now_s)
    if not ok:
        return ScaleDecision(r, f"steady: {why}",
                             replace(state, high_since_s=None, low_since_s=None), "steady",
                             projected)
    st = replace(state, high_since_s=None,
                 low_since_s=state.low_since_s if state.low_since_s is not None else now_s)
    waited = now_s - st.low_since_s
    if waited < cfg.scale_down_stabilization_s:
        return ScaleDecision(r, f"low pressure for {waited:.0f}s of "
                             f"{cfg.scale_down_stabilization_s:g}s: {why}", st, "low", projected)
    if in_cooldown:
        return ScaleDecision(r, f"cooldown ({cfg.cooldown_s:g}s): {why}", st, "low", projected)
    st = replace(st, low_since_s=None, last_scale_s=now_s)
    return ScaleDecision(r - 1, f"scale in {r} -> {r - 1}: {why}", st, "low", projected)
