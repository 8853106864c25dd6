"""A serving stack as one typed configuration of the timed simulator, and the registry.

Specification
-------------
``StackSpec`` (frozen; an unknown field is a TypeError, a bad value a ValueError naming
it): ``name``; ``peer`` (who ships it); ``source`` (the code or document the behaviour
follows); ``role`` (``peer``, ``anchorage``, ``ablation``, ``limit``, ``paper``); the
replica's ``router`` (``anchorage.routing``) with ``router_params``, GPU eviction
``policy`` (``anchorage.policies``) with ``policy_params``, ``admission``
(``anchorage.sim.engine.ADMISSIONS``); the host tier's ``tiering`` mode
(``anchorage.tiering.params.MODES``; ``off``: no host tier) with ``gate``
(``GateParams`` fields) and ``tiering_params`` (other ``TieringConfig`` fields); a
``program_gate`` (``anchorage.sim.programs``) with its parameters; ``long_prefill_tokens``
(the engines' cap on one prefill chunk per step, vLLM's ``long_prefill_token_threshold``;
0, vLLM's default: none); ``retention``
(``anchorage.sim.retention``); ``limit``: ``none``, ``infinite-device`` (HBM large enough
for the whole workload, same compute), ``infinite-host`` (host DRAM without bound) or
``free-tiers`` (host DRAM without bound behind a link without cost: every eviction from
HBM reloaded at once, for free).
``router_params`` may hold the string ``"$block_size"``, replaced by the profile's block
size when the stack runs (the routers that count in blocks), and ``"$host_blocks"``, replaced
by the blocks one replica's host tier holds (``MemoryHierarchy.host_config``: what a router
sized to the CPU cache is configured with); ``admission_params``
(``anchorage.policies.admission.AdmissionParams`` fields, prefix-aware admission only) the
string ``"$slo"``, replaced by the setting's TTFT target (what a deployment configures as
its target).

Registry: every module of ``anchorage.fleet.stacks`` may define ``STACKS = {name: spec}``;
``stack_names(role=None)`` lists them in module order, ``get_stack(name)`` returns one (a
ValueError naming the known ones otherwise).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field

ROLES = ("peer", "anchorage", "ablation", "limit", "paper")
# vLLM's long_prefill_token_threshold as every stack of the table sets it (issue 40: a vLLM
# flag any peer can set, so the peers get it as Anchorage does; ``<peer>-no-prefill-cap``
# are the peers without it, ``anchorage.fleet.stacks.controls``)
PREFILL_CAP = 2048
LIMITS = ("none", "infinite-device", "infinite-host", "free-tiers")


@dataclass(frozen=True)
class StackSpec:
    name: str
    peer: str
    source: str
    role: str = "peer"
    router: str = "round_robin"
    router_params: dict = field(default_factory=dict)
    policy: str = "lru"
    policy_params: dict = field(default_factory=dict)
    admission: str = "fcfs"
    admission_params: dict = field(default_factory=dict)   # "$slo": the setting's SLO
    tiering: str = "off"
    gate: dict = field(default_factory=dict)
    tiering_params: dict = field(default_factory=dict)
    program_gate: str = "none"
    program_gate_params: dict = field(default_factory=dict)
    retention: str = "none"
    retention_params: dict = field(default_factory=dict)
    long_prefill_tokens: int = 0
    limit: str = "none"
    notes: str = ""

    def __post_init__(self) -> None:
        from anchorage.policies.registry import policy_names
        from anchorage.routing.registry import router_names
        from anchorage.sim.engine import ADMISSIONS
        from anchorage.sim.programs import PROGRAM_GATES
        from anchorage.tiering.params import MODES

        checks = [("role", self.role, ROLES), ("limit", self.limit, LIMITS),
                  ("admission", self.admission, ADMISSIONS), ("tiering", self.tiering, MODES),
                  ("program_gate", self.program_gate, PROGRAM_GATES),
                  ("retention", self.retention, ("none", "continuum")),
                  ("policy", self.policy, policy_names(include_offline=False))]
        if self.program_gate == "none":
            checks.append(("router", self.router, router_names() + ["pooled"]))
        for what, value, known in checks:
            if value not in known:
                raise ValueError(f"stack {self.name!r}: unknown {what} {value!r}; "
                                 f"known: {', '.join(known)}")
        if not self.source:
            raise ValueError(f"stack {self.name!r}: a stack names its source")
        if not isinstance(self.long_prefill_tokens, int) or self.long_prefill_tokens < 0:
            raise ValueError(f"stack {self.name!r}: long_prefill_tokens must be an integer "
                             f">= 0, got {self.long_prefill_tokens!r}")
        try:
            self.admission_kwargs(1.0)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"stack {self.name!r}: {exc}") from None
        if self.admission_params and self.admission != "prefix-aware":
            raise ValueError(f"stack {self.name!r}: admission_params need prefix-aware "
                             f"admission, not {self.admission!r}")

    def admission_kwargs(self, slo_s: float) -> dict:
        """``admission_params`` with ``"$slo"`` replaced by the setting's TTFT target
        (validated: ``anchorage.policies.admission.AdmissionParams``)."""
        from anchorage.policies.admission import AdmissionParams

        d = {k: (slo_s if v == "$slo" else v) for k, v in self.admission_params.items()}
        AdmissionParams.from_dict(d)
        return d

    def router_kwargs(self, block_size: int, host_blocks: int | None = None) -> dict:
        subst = {"$block_size": block_size, "$host_blocks": host_blocks}

        def sub(v):  # nested too: a composite router's scorer parameters
            if isinstance(v, dict):
                return {k: sub(x) for k, x in v.items()}
            if isinstance(v, list):
                return [sub(x) for x in v]
            if isinstance(v, str) and v in subst:
                if subst[v] is None:
                    raise ValueError(f"stack {self.name!r}: {v} needs a host tier")
                return subst[v]
            return v

        return sub(dict(self.router_params))

    @property
    def has_host_tier(self) -> bool:
        return self.tiering != "off"

    def describe(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


_STACKS: dict[str, StackSpec] = {}


def _load() -> None:
    if _STACKS:
        return
    import anchorage.fleet.stacks as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"anchorage.fleet.stacks.{info.name}")
        for name, spec in getattr(mod, "STACKS", {}).items():
            if name in _STACKS:
                raise ValueError(f"stack {name!r} defined twice")
            _STACKS[name] = spec


def stack_names(role: str | None = None) -> list[str]:
    _load()
    return [n for n, s in _STACKS.items() if role is None or s.role == role]


def get_stack(name: str) -> StackSpec:
    _load()
    if name not in _STACKS:
        raise ValueError(f"unknown stack {name!r}; known: {', '.join(_STACKS)}")
    return _STACKS[name]
