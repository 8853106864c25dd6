"""Warm-up (prefetch) decisions for the node-agent sidecar.

Specification
-------------
Inputs, at each tick ``now_s``: the engine's load (running and waiting requests), the
policy's predictability ``R`` (CacheScout eq. 2) and its predicted next agents as
``(fingerprint, probability)`` pairs, the set of fingerprints whose anchors are known
(their token ids are in the plugin's registry), and the set already cached on the engine.

A warm-up for agent ``a`` is issued iff all hold:

1. the engine is idle enough: ``running <= max_running`` and ``waiting <= max_waiting``;
2. the gate passes: ``R >= r_min`` (CacheScout eq. 11);
3. ``a`` is predicted with probability ``>= min_probability``;
4. its anchor is known and not already cached;
5. ``a`` was not warmed within ``cooldown_s`` (an anchor just warmed is in the cache or
   was evicted for a reason: hammering it wastes compute);
6. the token bucket allows it: ``rate_per_s`` tokens per second, burst ``burst``.

Candidates are taken in decreasing probability, at most ``max_per_tick`` per tick.
Parameters and defaults are in ``WarmupConfig``. Outcomes (``used`` when a real request
hit the warmed anchor before it was evicted, ``wasted`` when it was evicted unused,
``skipped`` with a reason) are counted by the caller from the engine's events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence


@dataclass(frozen=True)
class WarmupConfig:
    enabled: bool = True
    r_min: float = 0.3              # predictability gate
    min_probability: float = 0.2    # predicted next-agent probability to act on
    max_running: int = 2            # engine "idle enough": running requests
    max_waiting: int = 0            # ... and queued requests
    rate_per_s: float = 2.0         # token bucket refill
    burst: int = 4                  # token bucket size
    cooldown_s: float = 30.0        # per-agent minimum time between warm-ups
    max_per_tick: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.r_min <= 1.0:
            raise ValueError("r_min must be in [0, 1]")
        if not 0.0 <= self.min_probability <= 1.0:
            raise ValueError("min_probability must be in [0, 1]")
        if self.rate_per_s < 0 or self.burst < 0 or self.cooldown_s < 0:
            raise ValueError("rate_per_s, burst and cooldown_s must be >= 0")


class TokenBucket:
    """``rate_per_s`` tokens per second, at most ``burst`` held; starts full. Time read
    backwards (an earlier ``now_s``) adds nothing."""

    __slots__ = ("rate_per_s", "burst", "tokens", "_last")

    def __init__(self, rate_per_s: float, burst: int):
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens = float(burst)
        self._last: float | None = None

    def refill(self, now_s: float) -> None:
        if self._last is not None and now_s > self._last:
            self.tokens = min(float(self.burst),
                              self.tokens + (now_s - self._last) * self.rate_per_s)
        self._last = now_s if self._last is None else max(self._last, now_s)

    def take(self) -> bool:
        """Spend one token if there is one."""
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass(frozen=True)
class Decision:
    warm: tuple[str, ...]
    skipped: dict[str, str] = field(default_factory=dict)  # fingerprint -> reason


class WarmupScheduler:
    """Stateful only in its token bucket and per-agent cooldowns (both bounded)."""

    def __init__(self, config: WarmupConfig | None = None, *, max_tracked: int = 4096):
        self.config = config or WarmupConfig()
        self._bucket = TokenBucket(self.config.rate_per_s, self.config.burst)
        self._last_warm: dict[str, float] = {}
        self._max_tracked = max_tracked

    def reconfigure(self, config: WarmupConfig) -> None:
        """Put ``config`` in force from the next decision. A new ``rate_per_s`` or ``burst``
        gets a new bucket holding no more than the old one held (a rate change neither
        grants a fresh burst nor forgets the warm-ups already spent); cooldowns carry over."""
        old = self.config
        self.config = config
        if (config.rate_per_s, config.burst) != (old.rate_per_s, old.burst):
            bucket = TokenBucket(config.rate_per_s, config.burst)
            bucket.tokens = min(float(config.burst), self._bucket.tokens)
            bucket._last = self._bucket._last
            self._bucket = bucket

    def decide(self, now_s: float, *, running: int, waiting: int, r: float,
               predictions: Sequence[tuple[str, float]], known: Iterable[str],
               cached: Iterable[str] = ()) -> Decision:
        cfg = self.config
        self._bucket.refill(now_s)
        cands = sorted(predictions, key=lambda p: (-p[1], p[0]))
        if not cfg.enabled:
            return Decision((), {a: "disabled" for a, _ in cands})
        if running > cfg.max_running or waiting > cfg.max_waiting:
            return Decision((), {a: "engine_busy" for a, _ in cands})
        if r < cfg.r_min:
            return Decision((), {a: "unpredictable" for a, _ in cands})
        known_set, cached_set = set(known), set(cached)
        warm: list[str] = []
        skipped: dict[str, str] = {}
        for agent, prob in cands:
            if prob < cfg.min_probability:
                skipped[agent] = "low_probability"
            elif agent not in known_set:
                skipped[agent] = "anchor_unknown"
            elif agent in cached_set:
                skipped[agent] = "already_cached"
            elif now_s - self._last_warm.get(agent, float("-inf")) < cfg.cooldown_s:
                skipped[agent] = "cooldown"
            elif len(warm) >= cfg.max_per_tick:
                skipped[agent] = "tick_limit"
            elif not self._bucket.take():
                skipped[agent] = "rate_limited"
            else:
                self._last_warm[agent] = now_s
                warm.append(agent)
        if len(self._last_warm) > self._max_tracked:
            for a, _ in sorted(self._last_warm.items(), key=lambda kv: kv[1])[
                    : len(self._last_warm) - self._max_tracked]:
                del self._last_warm[a]
        return Decision(tuple(warm), skipped)


# -- scheduled reloads (the temporal controller's, node_agent/temporal.py) ------------------


@dataclass(frozen=True)
class ReloadConfig:
    """Reload warm-ups: a pending reload is sent once its ``at_s`` has come, at most
    ``rate_per_s`` per second (burst ``burst``); one more than ``max_late_s`` overdue is
    dropped (``expired``: the session is likely back already, the request loads itself)."""
    enabled: bool = True
    rate_per_s: float = 4.0
    burst: int = 8
    max_late_s: float = 30.0
    max_tracked: int = 4096

    def __post_init__(self) -> None:
        if self.rate_per_s < 0 or self.burst < 0 or self.max_late_s < 0:
            raise ValueError("rate_per_s, burst and max_late_s must be >= 0")


class ReloadScheduler:
    """Which pending reloads (``{"id", "at_s", ...}`` dicts from the plugin's snapshot) to
    send now. Each id is sent at most once; state: a ``TokenBucket`` and the ids handled
    (bounded, oldest forgotten)."""

    def __init__(self, config: ReloadConfig | None = None):
        self.config = config or ReloadConfig()
        self._bucket = TokenBucket(self.config.rate_per_s, self.config.burst)
        self._done: dict[str, None] = {}
        self.expired = self.rate_limited = 0

    def due(self, now_s: float, pending: Sequence[dict]) -> list[dict]:
        cfg = self.config
        self._bucket.refill(now_s)
        if not cfg.enabled:
            return []
        out = []
        for r in sorted(pending, key=lambda r: (r["at_s"], r["id"])):
            rid = r["id"]
            if rid in self._done or r["at_s"] > now_s:
                continue
            if now_s - r["at_s"] > cfg.max_late_s:
                self._mark(rid)
                self.expired += 1
                continue
            if not self._bucket.take():
                self.rate_limited += 1
                break  # the rest waits for the next tick, in time order
            self._mark(rid)
            out.append(r)
        return out

    def _mark(self, rid: str) -> None:
        self._done[rid] = None
        while len(self._done) > self.config.max_tracked:
            del self._done[next(iter(self._done))]


def reload_body(model: str, r: dict) -> dict:
    """The warm-up that reloads a session (``POST /v1/completions``): its last prompt,
    one output token, marked as a warm-up, under the session's id and cache salt."""
    xargs = {"anchorage.warmup": 1}
    if r.get("agent"):
        xargs["anchorage.agent"] = r["agent"]
    if r.get("tenant"):
        xargs["anchorage.tenant"] = r["tenant"]
    body = {"model": model, "prompt": list(r["token_ids"]), "max_tokens": 1,
            "session_id": r["session"], "vllm_xargs": xargs}
    if r.get("cache_salt"):
        body["cache_salt"] = r["cache_salt"]
    return body
