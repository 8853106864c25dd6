"""The configuration document ``anchorage.yaml``: typed, rendered and parsed in one place.

Specification
-------------
The operator writes it from an ``AgentCachePolicy`` into the ConfigMap
``<policy name>-anchorage``, data key ``anchorage.yaml``; the vLLM plugin, the node-agent
sidecar and the router read it (``ANCHORAGE_CONFIG`` / their mount)::

    generation: 3                 # bumped whenever the content below changes
    source: {kind: AgentCachePolicy, namespace: llm, name: llama-8b, observedGeneration: 7}
    policy:
      name: hybrid                # an online eviction policy (anchorage.policies.registry)
      parameters: {horizon: 120, rMin: 0.6, prefetch: {enabled: true, ratePerSecond: 4}}
      parametersSource: spec      # spec | tuner
    routing:
      policy: composite           # a router (anchorage.routing.registry)
      weights: {prefix: 2, queue: 1}   # composite only: scorer name -> weight
      parameters: {seed: 0}       # the router's constructor parameters
    target: {kind: Deployment, name: llama-8b}
    ...

Rules (``parse``), each violation one ``ConfigError`` naming the field:

- the text is one YAML mapping ending with YAML's document end marker ``...`` (``render``
  writes it): an empty file, or one cut short (no end marker), is rejected like any
  invalid document; nothing falls back to defaults;
- ``generation`` (a non-negative integer) and ``policy`` (with ``name``) are required;
  ``source``, ``routing`` and ``target`` may be omitted (their defaults: no source,
  ``agent`` routing without weights or parameters, a Deployment without a name);
- unknown keys are errors at every level; ``policy.parameters`` are exactly the names of
  ``anchorage.config.parameters`` with their ranges; the policy must be an online policy,
  the router a registered one, weight names the composite router's scorers (``SCORERS``)
  with non-negative values, and weights are accepted only with ``composite``.

Whether the policy or router accepts its parameters is decided by building it
(``PolicySection.problems``, ``RoutingSection.problems``): the operator does so before it
writes, the engine and router when they apply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from anchorage.config.parameters import ConfigError, PolicyParameters

DATA_KEY = "anchorage.yaml"
GENERATION_ANNOTATION = "anchorage.dev/config-generation"
END_MARKER = "..."
PARAMETER_SOURCES = ("spec", "tuner")


def configmap_name(policy_name: str) -> str:
    return f"{policy_name}-anchorage"


def _mapping(d: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: must be a mapping, not {type(d).__name__}")
    unknown = [k for k in d if k not in keys]
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field; known: {', '.join(keys)}")
    return d


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ConfigError(f"{where}: must be a non-empty string, not {v!r}")
    return v.strip()


@dataclass(frozen=True)
class Source:
    """The AgentCachePolicy the document was written from."""

    namespace: str
    name: str
    observed_generation: int | None = None
    kind: str = "AgentCachePolicy"

    @classmethod
    def parse(cls, d: Any) -> "Source":
        d = _mapping(d, "source", ("kind", "namespace", "name", "observedGeneration"))
        og = d.get("observedGeneration")
        if og is not None and (type(og) is not int or og < 0):
            raise ConfigError(f"source.observedGeneration: must be a non-negative integer, "
                              f"not {og!r}")
        return cls(_name(d.get("namespace"), "source.namespace"),
                   _name(d.get("name"), "source.name"), og,
                   _name(d.get("kind", "AgentCachePolicy"), "source.kind"))

    def to_yaml(self) -> dict[str, Any]:
        return {"kind": self.kind, "namespace": self.namespace, "name": self.name,
                "observedGeneration": self.observed_generation}


@dataclass(frozen=True)
class PolicySection:
    """The eviction policy the engines run, its parameters and where they came from."""

    name: str = "hybrid"
    parameters: PolicyParameters = field(default_factory=PolicyParameters)
    parameters_source: str = "spec"

    def __post_init__(self) -> None:
        from anchorage.policies.registry import is_offline, policy_names

        name = _name(self.name, "policy.name").lower()
        object.__setattr__(self, "name", name)
        if name not in policy_names(include_offline=True):
            raise ConfigError(f"policy.name: {name!r} is not a known policy; known: "
                              f"{', '.join(policy_names(include_offline=False))}")
        if is_offline(name):
            raise ConfigError(f"policy.name: {name!r} reads the future and exists only in "
                              "the simulator")
        if self.parameters_source not in PARAMETER_SOURCES:
            raise ConfigError(f"policy.parametersSource: must be spec or tuner, not "
                              f"{self.parameters_source!r}")

    @classmethod
    def parse(cls, d: Any) -> "PolicySection":
        d = _mapping(d, "policy", ("name", "parameters", "parametersSource"))
        if "name" not in d:
            raise ConfigError("policy.name: required")
        return cls(d["name"], PolicyParameters.from_crd(d.get("parameters")),
                   d.get("parametersSource", "spec"))

    def to_yaml(self) -> dict[str, Any]:
        return {"name": self.name, "parameters": self.parameters.to_crd(),
                "parametersSource": self.parameters_source}

    def problems(self, block_size: int = 16) -> list[str]:
        """Why the policy refuses its parameters (built once to check); [] when it takes them."""
        from anchorage.policies.registry import make_policy

        try:
            make_policy(self.name, block_size=block_size, params=self.parameters.policy_kwargs())
        except (TypeError, ValueError) as exc:
            return [f"policy.parameters: {exc}"]
        return []


def scorer_names() -> list[str]:
    """The composite router's scorers: the names ``routing.weights`` may use."""
    from anchorage.routing.composite import SCORERS

    return list(SCORERS)


@dataclass(frozen=True)
class RoutingSection:
    """The router's policy; ``weights`` are the composite router's scorer weights."""

    policy: str = "agent"
    weights: dict[str, float] = field(default_factory=dict)
    parameters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from anchorage.routing import router_names

        policy = _name(self.policy, "routing.policy")
        object.__setattr__(self, "policy", policy)
        if policy not in router_names():
            raise ConfigError(f"routing.policy: {policy!r} is not a known router; known: "
                              f"{', '.join(router_names())}")
        if not isinstance(self.weights, dict):
            raise ConfigError(f"routing.weights: must be a mapping, not "
                              f"{type(self.weights).__name__}")
        known = scorer_names()
        weights = {}
        for k, v in self.weights.items():
            if k not in known:
                raise ConfigError(f"routing.weights.{k}: not a scorer; known: {', '.join(known)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
                raise ConfigError(f"routing.weights.{k}: must be a number >= 0, not {v!r}")
            weights[k] = float(v)
        object.__setattr__(self, "weights", weights)
        if weights and policy != "composite":
            raise ConfigError(f"routing.weights: scorer weights apply to the composite router "
                              f"only (routing.policy is {policy!r})")
        if not isinstance(self.parameters, dict) or not all(
                isinstance(k, str) for k in self.parameters):
            raise ConfigError("routing.parameters: must be a mapping of parameter names")
        if "scorers" in self.parameters and weights:
            raise ConfigError("routing.parameters.scorers: give scorer weights in "
                              "routing.weights or in parameters.scorers, not both")

    @classmethod
    def parse(cls, d: Any) -> "RoutingSection":
        d = _mapping(d, "routing", ("policy", "weights", "parameters"))
        return cls(d.get("policy", "agent"), d.get("weights") or {}, d.get("parameters") or {})

    def to_yaml(self) -> dict[str, Any]:
        return {"policy": self.policy, "weights": dict(self.weights),
                "parameters": dict(self.parameters)}

    def router_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``make_router(self.policy, ...)``."""
        kw = dict(self.parameters)
        if self.weights:
            kw["scorers"] = dict(self.weights)
        return kw

    def problems(self) -> list[str]:
        from anchorage.routing import make_router

        try:
            make_router(self.policy, **self.router_kwargs())
        except (TypeError, ValueError) as exc:
            return [f"routing: {exc}"]
        return []


@dataclass(frozen=True)
class Target:
    kind: str = "Deployment"
    name: str | None = None

    @classmethod
    def parse(cls, d: Any) -> "Target":
        d = _mapping(d, "target", ("kind", "name"))
        name = d.get("name")
        return cls(_name(d.get("kind", "Deployment"), "target.kind"),
                   None if name is None else _name(name, "target.name"))

    def to_yaml(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name}


@dataclass(frozen=True)
class ConfigDocument:
    generation: int
    policy: PolicySection
    routing: RoutingSection = field(default_factory=RoutingSection)
    target: Target = field(default_factory=Target)
    source: Source | None = None

    def __post_init__(self) -> None:
        if type(self.generation) is not int or self.generation < 0:
            raise ConfigError(f"generation: must be a non-negative integer, not "
                              f"{self.generation!r}")

    def content(self) -> tuple[PolicySection, RoutingSection, Target]:
        """What the consumers apply (generation and source aside): compared to decide
        whether a new generation is due."""
        return (self.policy, self.routing, self.target)

    def with_generation(self, generation: int, source: Source | None) -> "ConfigDocument":
        return replace(self, generation=generation, source=source)

    @classmethod
    def from_spec(cls, spec: dict[str, Any], parameters: PolicyParameters | None = None,
                  parameters_source: str = "spec", generation: int = 0,
                  source: Source | None = None) -> "ConfigDocument":
        """From an AgentCachePolicy ``spec`` (``parameters``: those in force, default the
        spec's own). Raises ConfigError naming the ``spec.`` field."""
        policy = spec.get("policy") or {}
        routing = spec.get("routing") or {}
        target = spec.get("targetRef") or {}
        try:
            params = (parameters if parameters is not None
                      else PolicyParameters.from_crd(policy.get("parameters")))
            return cls(generation,
                       PolicySection(policy.get("name", "hybrid"), params, parameters_source),
                       RoutingSection(routing.get("policy", "agent"),
                                      dict(routing.get("weights") or {}),
                                      dict(routing.get("parameters") or {})),
                       Target(target.get("kind", "Deployment"), target.get("name")), source)
        except ConfigError as exc:
            raise ConfigError(f"spec.{exc}") from None


def render(doc: ConfigDocument) -> str:
    import yaml

    out: dict[str, Any] = {"generation": doc.generation}
    if doc.source is not None:
        out["source"] = doc.source.to_yaml()
    out.update(policy=doc.policy.to_yaml(), routing=doc.routing.to_yaml(),
               target=doc.target.to_yaml())
    return yaml.safe_dump(out, sort_keys=False, explicit_end=True)


def parse(text: str) -> ConfigDocument:
    """The document ``text`` holds; ConfigError (one line naming the field) otherwise."""
    import yaml

    if not text.strip():
        raise ConfigError("the document is empty")
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if lines[-1] != END_MARKER:
        raise ConfigError(f"the document does not end with the end marker {END_MARKER!r}: "
                          "truncated, or not written by anchorage.config.render")
    if not any(ln and not ln.startswith("#") for ln in lines[:-1]):
        raise ConfigError("the document is empty")
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if d is None:
        raise ConfigError("the document is empty")
    d = _mapping(d, "document", ("generation", "source", "policy", "routing", "target"))
    for required in ("generation", "policy"):
        if required not in d:
            raise ConfigError(f"{required}: required")
    return ConfigDocument(
        d["generation"], PolicySection.parse(d["policy"]),
        RoutingSection.parse(d["routing"]) if d.get("routing") is not None else RoutingSection(),
        Target.parse(d["target"]) if d.get("target") is not None else Target(),
        Source.parse(d["source"]) if d.get("source") is not None else None)


def read(path: str | Path) -> ConfigDocument:
    """``parse`` of a file; an unreadable file is a ConfigError too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read it ({exc.__class__.__name__}: {exc})") from None
    return parse(text)
