"""Configuration of group-scored eviction: signals, typed parameters, presets.

Specification
-------------
A policy built on ``GroupEvictionPolicy`` is a ``GroupConfig``: a name, the ``Signals`` it
uses, and typed parameter sections, each a frozen dataclass that validates its values
(ValueError naming the parameter and its range) and, being a dataclass, rejects unknown
names:

- ``Tuning`` (what the operator tunes: CRD ``spec.policy.parameters``, mapped by
  ``anchorage.autoscale.params``; docs/autoscaling.md):

  - ``horizon_s`` (seconds in (0, inf], default inf): a group expected back later than this
    is *far reuse*, ``K = inf`` (thread and anchor scorers; recency groups too);
  - ``survival_threshold`` ([0, 1], default 0 = off): keep a group only while the
    probability that it is used within ``horizon_s`` is at least this (thread and anchor
    scorers: *low survival*, ``K = inf``);
  - ``recency_scale_s`` (seconds in (0, inf], default None = inf): the recency term's time
    constant (``groups`` spec);
  - ``r_min`` ([0, 1], default 0): predictability gate: transition terms apply only while
    ``R >= r_min`` (``view`` spec); also the prefetch advisor's gate when positive;
  - ``prefetch`` (bool, default true), ``prefetch_rate_per_s`` (>= 0, default 4): read by
    the prefetch advisor only (``cachescout.PrefetchAdvisor``).

  The defaults leave the order unchanged (no horizon, no threshold, plain recency).
- ``ModelParams`` (the workload model, ``model`` and ``view`` specs): ``min_samples`` (16),
  ``end_factor`` (2.0), ``eps`` (0.1), ``max_sessions`` (4096), ``max_agents`` (64),
  ``max_tools`` (64), ``max_prefix_keys`` (2**18), ``global_gaps`` ("auto"),
  ``no_tool_context`` (False), ``turnover_gap_ratio`` (2.0), ``wait_min_gaps`` (64),
  ``reach_steps`` (2).
- the scorers' sections (``scorers/<kind>.py``), built from the signals, the tuning and
  ``dead_min_samples`` (64) / ``dead_max_reuse`` (0.02) (output and stale scorers).

``build_config(name, signals, block_size=..., cluster_fn=..., **params)`` distributes the
flat keyword parameters of ``make_policy`` over the sections; a name no section takes is an
``UnknownParameterError`` (a TypeError; the registry reports it as "policy ... does not
accept parameter ..."). A *preset* (``cachescout``, ``cachewise``, ``hybrid``) is a name and
its signals; nothing else differs between them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from anchorage.policies.group import params as P
from anchorage.policies.group.scorers.anchor import AnchorParams
from anchorage.policies.group.scorers.output import OutputParams
from anchorage.policies.group.scorers.stale import StaleParams
from anchorage.policies.group.scorers.thread import ThreadParams

INF = math.inf


@dataclass(frozen=True)
class Signals:
    """Which signals a policy uses. All False = LRU."""

    anchors: bool = True       # value shared prefixes by agent arrival rate
    transitions: bool = True   # per-session agent transitions (threads, anchor rates)
    gaps: bool = True          # session gap model conditioned on elapsed time
    tools: bool = True         # condition gaps on tool name / argument cluster
    dead_outputs: bool = True  # learn whether generated-token blocks are ever reused
    stale: bool = True         # a thread's blocks its next prompt skipped are stale
    first: bool = True         # sessions after one request: their own return model

    def __post_init__(self) -> None:
        for f in P.field_names(Signals):
            P.flag(f, getattr(self, f))


@dataclass(frozen=True)
class Tuning:
    """The operator-tuned parameters (module spec)."""

    survival_threshold: float = 0.0
    horizon_s: float = INF
    recency_scale_s: float | None = None
    r_min: float = 0.0
    prefetch: bool = True
    prefetch_rate_per_s: float = 4.0

    def __post_init__(self) -> None:
        s = object.__setattr__
        s(self, "survival_threshold", P.number("survival_threshold", self.survival_threshold,
                                               0.0, 1.0))
        s(self, "horizon_s", P.number("horizon_s", self.horizon_s, 0.0, lo_open=True))
        rs = INF if self.recency_scale_s is None else self.recency_scale_s
        s(self, "recency_scale_s", P.number("recency_scale_s", rs, 0.0, lo_open=True))
        s(self, "r_min", P.number("r_min", self.r_min, 0.0, 1.0))
        s(self, "prefetch_rate_per_s", P.number("prefetch_rate_per_s",
                                                self.prefetch_rate_per_s, 0.0))
        P.flag("prefetch", self.prefetch)


#: the tuning parameters and their defaults (``recency_scale_s`` None = inf)
TUNING_DEFAULTS: dict[str, Any] = {f: getattr(Tuning, f) for f in P.field_names(Tuning)}
GLOBAL_GAPS = ("auto", "wait", "survival", "off")


@dataclass(frozen=True)
class ModelParams:
    """The workload model's parameters (module spec; meanings in ``model`` and ``view``)."""

    min_samples: int = 16
    end_factor: float = 2.0
    eps: float = 0.1
    max_sessions: int = 4096
    max_agents: int = 64
    max_tools: int = 64
    max_prefix_keys: int = 1 << 18
    global_gaps: str = "auto"
    no_tool_context: bool = False
    turnover_gap_ratio: float = 2.0
    wait_min_gaps: int = 64
    reach_steps: int | str = 2

    def __post_init__(self) -> None:
        P.integer("min_samples", self.min_samples, 1)
        P.number("end_factor", self.end_factor, 0.0, lo_open=True)
        P.number("eps", self.eps, 0.0, lo_open=True)
        for f in ("max_sessions", "max_agents", "max_tools", "max_prefix_keys"):
            P.integer(f, getattr(self, f), 1)
        if self.global_gaps not in GLOBAL_GAPS:
            raise ValueError(f"global_gaps must be auto, wait, survival or off, got "
                             f"{self.global_gaps!r}")
        P.flag("no_tool_context", self.no_tool_context)
        P.number("turnover_gap_ratio", self.turnover_gap_ratio, 0.0)
        P.integer("wait_min_gaps", self.wait_min_gaps, 0)
        k = self.reach_steps
        if k != "turnover" and not (isinstance(k, int) and not isinstance(k, bool) and k >= 2):
            raise ValueError(f"reach_steps must be 'turnover' or an int >= 2, got {k!r}")


DEAD = ("dead_min_samples", "dead_max_reuse")  # output and stale scorers


@dataclass(frozen=True)
class GroupConfig:
    """Everything a ``GroupEvictionPolicy`` is built from."""

    name: str = "group"
    block_size: int = 16
    signals: Signals = field(default_factory=Signals)
    tuning: Tuning = field(default_factory=Tuning)
    model: ModelParams = field(default_factory=ModelParams)
    anchor: AnchorParams = field(default_factory=AnchorParams)
    thread: ThreadParams = field(default_factory=ThreadParams)
    output: OutputParams = field(default_factory=OutputParams)
    stale: StaleParams = field(default_factory=StaleParams)
    cluster_fn: Callable[[Any, Any], Hashable] | None = None

    def __post_init__(self) -> None:
        P.integer("block_size", self.block_size, 1)


def build_config(name: str, signals: Signals | None = None, *, block_size: int = 16,
                 cluster_fn: Callable[[Any, Any], Hashable] | None = None,
                 **params: Any) -> GroupConfig:
    """The flat ``make_policy`` parameters of a preset -> its ``GroupConfig`` (module
    spec). Unknown name: ``UnknownParameterError``; bad value: ValueError."""
    tun_names, mod_names = P.field_names(Tuning), P.field_names(ModelParams)
    P.reject_unknown(params, (*tun_names, *mod_names, *DEAD))
    sig = signals if signals is not None else Signals()
    if not isinstance(sig, Signals):
        raise ValueError(f"signals must be a Signals, got {sig!r}")
    tun = Tuning(**{k: v for k, v in params.items() if k in tun_names})
    mod = ModelParams(**{k: v for k, v in params.items() if k in mod_names})
    dead = {k: v for k, v in params.items() if k in DEAD}
    shared = dict(survival_threshold=tun.survival_threshold, horizon_s=tun.horizon_s)
    return GroupConfig(
        name=name, block_size=block_size, signals=sig, tuning=tun, model=mod,
        anchor=AnchorParams(enabled=sig.anchors, transitions=sig.transitions, **shared),
        thread=ThreadParams(gaps=sig.gaps, transitions=sig.transitions, **shared),
        output=OutputParams(dead_outputs=sig.dead_outputs, gaps=sig.gaps, **dead),
        stale=StaleParams(gaps=sig.gaps, **dead),
        cluster_fn=cluster_fn)

