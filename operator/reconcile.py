"""One reconcile pass over an AgentCachePolicy: plain data in, status and events out.

Order: validate what the schema cannot (-> Degraded) -> effective parameters (spec, or
the tuner's while the spec's generation is unchanged) -> ConfigMap (written only when its
content changes; generation bumped then) -> target scale (missing -> Ready=False) ->
metrics (unavailable -> MetricsAvailable=False, hold) -> replica decision and scale ->
tuning when due. Every write is absolute (set N replicas, replace the ConfigMap at its
resourceVersion) and the decision memory lives in ``status.decision``, so repeating a pass,
or a restarted operator running it, takes no duplicate action.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from anchorage.autoscale import AutoscaleConfig, FleetSignals, MetricsError, ScalerState, decide_replicas
from anchorage.autoscale.params import flatten, unflatten
from anchorage.autoscale.tuning import ParameterRange, tune
from anchorage.config import (DATA_KEY, GENERATION_ANNOTATION, TUNABLE, ConfigDocument,
                              ConfigError, PolicyParameters, Source, configmap_name, parse,
                              render)
from anchorage.operator import config as cfgmap
from anchorage.operator import access_logs
from anchorage.operator.access_logs import AccessLogError, load_access_logs
from anchorage.operator.kube import Scale
from anchorage.sim.replay import make_contexts


class Kube(Protocol):
    def get_scale(self, kind: str, namespace: str, name: str) -> Scale | None: ...
    def set_replicas(self, kind: str, namespace: str, name: str, replicas: int) -> None: ...
    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def put_configmap(self, namespace: str, body: dict[str, Any], resource_version: str | None) -> None: ...


class Metrics(Protocol):
    def fleet_signals(self, *, selector: str, window_s: int, replicas: int,
                      block_size: int = 16) -> FleetSignals: ...


@dataclass
class Event:
    type: str      # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    # For the operator's own metrics: observed_replicas, scaled ("up"/"down"),
    # tuning ("adopted"/"rejected"/"error"), metrics_ok (bool).
    facts: dict[str, Any] = field(default_factory=dict)


def iso(now_s: float) -> str:
    return dt.datetime.fromtimestamp(now_s, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conds: list[dict[str, Any]], type_: str, status: str, reason: str,
                  message: str, now_s: float, generation: int | None) -> list[dict[str, Any]]:
    """Replace the condition ``type_``; lastTransitionTime changes only with its status."""
    old = next((c for c in conds if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and \
        old.get("lastTransitionTime") else iso(now_s)
    new = {"type": type_, "status": status, "reason": reason, "message": message[:1000],
           "lastTransitionTime": since}
    if generation is not None:
        new["observedGeneration"] = generation
    return [c for c in conds if c.get("type") != type_] + [new]


def document_problems(spec: dict[str, Any]) -> list[str]:
    """What the configuration document (``anchorage.config``) refuses in the spec, and what
    the policy and the router refuse when built with their parameters."""
    try:
        doc = ConfigDocument.from_spec(spec)
    except ConfigError as e:
        return [str(e)]
    return [f"spec.{p}" for p in doc.policy.problems() + doc.routing.problems()]


def validate(spec: dict[str, Any]) -> list[str]:
    """Rules the CRD schema cannot state (cross-field, or needed only when enabled)."""
    problems = AutoscaleConfig.from_spec(spec.get("autoscaling")).problems()
    problems += document_problems(spec)
    tuning = spec.get("tuning") or {}
    names = [p.get("name") for p in tuning.get("parameters") or []]
    for p in tuning.get("parameters") or []:
        problems += ParameterRange.from_spec(p).problems()
        if p.get("name") not in TUNABLE:
            problems.append(f"tuning.parameters: {p.get('name')!r} is not tunable; tunable: "
                            f"{', '.join(TUNABLE)}")
    if len(set(names)) != len(names):
        problems.append("tuning.parameters names a parameter more than once")
    if tuning.get("enabled"):
        if not tuning.get("accessLogs"):
            problems.append("tuning is enabled but tuning.accessLogs is empty")
        if not tuning.get("capacityBlocks"):
            problems.append("tuning is enabled but tuning.capacityBlocks is not set")
        if not names:
            problems.append("tuning is enabled but tuning.parameters is empty")
    asc = spec.get("autoscaling") or {}
    if asc.get("enabled", True) is False and spec.get("replicas") is not None:
        lo, hi = asc.get("minReplicas", 1), asc.get("maxReplicas", 8)
        if not lo <= spec["replicas"] <= hi:
            problems.append(f"replicas {spec['replicas']} is outside [{lo}, {hi}]")
    sel = (spec.get("metrics") or {}).get("selector", "")
    if sel and (sel.count('"') % 2 or "{" in sel or "}" in sel):
        problems.append(f'metrics.selector {sel!r} is not a list of label matchers like a="b",c=~"d.*"')
    return problems


def trusted_sources(kube: Kube, namespace: str, spec: dict[str, Any],
                    access_log_dir: str | None) -> tuple[list[str], list[str]]:
    """(what to fetch, why a source is refused) for ``spec.tuning.accessLogs``
    (access_logs' rule): files as named, each Service URL as its checked ClusterIP."""
    target = spec["targetRef"]
    scale = None
    fetch, refused = [], []
    for i, src in enumerate((spec.get("tuning") or {}).get("accessLogs") or []):
        ref, why = access_logs.parse_source(str(src), namespace, access_log_dir)
        if why:
            refused.append(f"tuning.accessLogs[{i}]: {why}")
            continue
        if ref is None:
            fetch.append(str(src))
            continue
        if scale is None:
            scale = kube.get_scale(target.get("kind", "Deployment"), namespace,
                                   target["name"]) or False
        svc = kube.get_service(namespace, ref.service)
        why = access_logs.service_problems(ref, svc, scale.selector if scale else None)
        if why:
            refused += [f"tuning.accessLogs[{i}]: {w}" for w in why]
        else:
            fetch.append(ref.fetch_url(svc))
    return fetch, refused


def written_document(existing: dict[str, Any] | None) -> tuple[int, Any]:
    """(generation, content) of the ConfigMap's document; an unreadable one (edited by
    hand) gives its annotation's generation and no content, so it is rewritten."""
    if existing is None:
        return 0, None
    try:
        doc = parse((existing.get("data") or {}).get(DATA_KEY, ""))
    except ConfigError:
        ann = str((existing.get("annotations") or {}).get(GENERATION_ANNOTATION, ""))
        return (int(ann) if ann.isdigit() else 0), None
    return doc.generation, doc.content()


def reconcile(*, name: str, namespace: str, uid: str, generation: int | None,
              spec: dict[str, Any], status: dict[str, Any], kube: Kube,
              metrics_for: Callable[[str], Metrics], now_s: float,
              tuning_factory: Callable[..., Any] | None = None,
              access_log_dir: str | None = None) -> Outcome:
    """``access_log_dir``: the directory whose files ``spec.tuning.accessLogs`` may name
    (the operator's --access-log-dir; None: no file is read)."""
    status = dict(status or {})
    conds = list(status.get("conditions") or [])
    decision = dict(status.get("decision") or {})
    out = Outcome(status={"observedGeneration": generation})
    events = out.events

    problems = validate(spec)
    problems += access_logs.source_problems((spec.get("tuning") or {}).get("accessLogs") or [],
                                            namespace, access_log_dir)
    if problems:
        msg = "; ".join(problems)
        if not any(c.get("type") == "Degraded" and c.get("status") == "True"
                   and c.get("message") == msg for c in conds):
            events.append(Event("Warning", "InvalidSpec", msg))
        conds = set_condition(conds, "Degraded", "True", "InvalidSpec", msg, now_s, generation)
        conds = set_condition(conds, "Ready", "False", "InvalidSpec", msg, now_s, generation)
        out.status["conditions"] = conds
        return out
    conds = set_condition(conds, "Degraded", "False", "SpecValid", "spec is valid", now_s, generation)

    block_size = int((spec.get("tuning") or {}).get("blockSize", 16))

    # Parameters in force: the tuner's, until the spec changes.
    spec_params = flatten((spec.get("policy") or {}).get("parameters"))
    tuned = decision.get("tuned")
    if tuned is not None and decision.get("tunedGeneration") == generation:
        params, source = {**spec_params, **tuned}, "tuner"
    else:
        params, source = spec_params, "spec"
        decision["tuned"] = None  # null deletes the key in the status merge patch
        decision["tunedGeneration"] = None

    # Tuning.
    tuning = spec.get("tuning") or {}
    last_tuned = decision.get("lastTuning_s")
    if tuning.get("enabled") and (last_tuned is None or
                                  now_s - last_tuned >= tuning.get("intervalSeconds", 900)):
        decision["lastTuning_s"] = now_s
        out.status["lastTuningTime"] = iso(now_s)
        try:
            sources, refused = trusted_sources(kube, namespace, spec, access_log_dir)
            if refused:
                msg = "; ".join(refused)
                conds = set_condition(conds, "AccessLogsTrusted", "False", "UntrustedAccessLog",
                                      msg, now_s, generation)
                events.append(Event("Warning", "AccessLogRejected", msg))
                raise AccessLogError(f"refused (the access-log token goes only to this "
                                     f"policy's node agents): {msg}")
            conds = set_condition(conds, "AccessLogsTrusted", "True", "NodeAgentServices",
                                  "every access-log source is a node agent of the target",
                                  now_s, generation)
            recs = load_access_logs(sources, max_requests=int(tuning.get("maxRequests", 50000)))
            kw = {"factory": tuning_factory} if tuning_factory else {}
            res = tune(make_contexts(recs), capacity_blocks=int(tuning["capacityBlocks"]),
                       block_size=block_size,
                       policy=(spec.get("policy") or {}).get("name", "hybrid"),
                       current=params,
                       ranges=[ParameterRange.from_spec(p) for p in tuning["parameters"]],
                       min_improvement=float(tuning.get("minImprovement", 0.01)),
                       objective=tuning.get("objective", "hitRate"), **kw)
            out.status["lastTuningReason"] = res.reason
            out.facts["tuning"] = "adopted" if res.adopt else "rejected"
            if res.adopt:
                decision["tuned"] = {k: v for k, v in res.parameters.items()
                                     if spec_params.get(k) != v}
                decision["tunedGeneration"] = generation
                params, source = dict(res.parameters), "tuner"
                events.append(Event("Normal", "Tuned", res.reason))
            else:
                events.append(Event("Normal", "TuningKept", res.reason))
        except (AccessLogError, ValueError) as e:
            out.facts["tuning"] = "error"
            out.status["lastTuningReason"] = f"tuning failed: {e}"
            events.append(Event("Warning", "TuningFailed", str(e)))
    # ConfigMap: write only on a content change, bumping its generation.
    try:
        in_force = PolicyParameters.from_flat(params)
    except ConfigError as e:   # tuned values an older operator stored: back to the spec's
        events.append(Event("Warning", "TunedParametersDropped", str(e)))
        params, source = spec_params, "spec"
        decision["tuned"] = decision["tunedGeneration"] = None
        in_force = PolicyParameters.from_flat(params)
    doc = ConfigDocument.from_spec(spec, in_force, source)
    cm_name = configmap_name(name)
    existing = kube.get_configmap(namespace, cm_name)
    old_gen, old_content = written_document(existing)
    cm_gen = old_gen
    if existing is None or old_content != doc.content():
        cm_gen = old_gen + 1
        text = render(doc.with_generation(cm_gen, Source(namespace, name, generation)))
        kube.put_configmap(namespace, cfgmap.configmap_body(
            namespace=namespace, name=name, uid=uid, text=text, generation=cm_gen),
            existing["resourceVersion"] if existing else None)
        events.append(Event("Normal", "ConfigWritten",
                            f"ConfigMap {cm_name} generation {cm_gen} ({source} parameters)"))
    out.status.update(configMap=cm_name, configGeneration=cm_gen, parameters=unflatten(params),
                      parametersSource=source)

    # Target.
    target = spec["targetRef"]
    kind, tname = target.get("kind", "Deployment"), target["name"]
    scale = kube.get_scale(kind, namespace, tname)
    if scale is None:
        msg = f"{kind} {namespace}/{tname} not found"
        if not any(c.get("type") == "Ready" and c.get("reason") == "TargetNotFound" for c in conds):
            events.append(Event("Warning", "TargetNotFound", msg))
        conds = set_condition(conds, "Ready", "False", "TargetNotFound", msg, now_s, generation)
        out.status.update(conditions=conds, decision=decision)
        return out
    current = scale.spec_replicas
    out.status["selector"] = scale.selector
    out.facts["observed_replicas"] = scale.status_replicas

    # Metrics.
    asc = AutoscaleConfig.from_spec(spec.get("autoscaling"))
    m = spec.get("metrics") or {}
    signals: FleetSignals | None = None
    try:
        signals = metrics_for(m.get("prometheusURL", "")).fleet_signals(
            selector=m.get("selector", ""), window_s=int(m.get("windowSeconds", 120)),
            replicas=max(1, current), block_size=block_size)
        out.facts["metrics_ok"] = True
        conds = set_condition(conds, "MetricsAvailable", "True", "MetricsRead",
                              "fleet metrics read from Prometheus", now_s, generation)
        out.status.update(hitRate=signals.hit_rate, queueDepth=round(signals.queue_depth, 4),
                          kvUsage=round(signals.kv_usage, 4))

    except MetricsError as e:
        out.facts["metrics_ok"] = False
        if not any(c.get("type") == "MetricsAvailable" and c.get("status") == "False" for c in conds):
            events.append(Event("Warning", "MetricsUnavailable", f"{e}; holding the last decision"))
        conds = set_condition(conds, "MetricsAvailable", "False", "MetricsUnavailable",
                              f"{e}; holding the last decision", now_s, generation)

    # Replicas.
    if asc.enabled:
        state = ScalerState.from_json(decision.get("scaler"))
        d = decide_replicas(signals, current, asc, state, now_s)
        desired, reason, acted = d.desired, d.reason, d.desired != current
        decision["scaler"] = d.state.to_json()
    else:
        desired = spec.get("replicas", current)
        reason, acted = "autoscaling disabled: spec.replicas", desired != current
    if acted:
        kube.set_replicas(kind, namespace, tname, desired)
        out.facts["scaled"] = "up" if desired > current else "down"
        out.status.update(lastScaleTime=iso(now_s), lastScaleReason=reason)
        events.append(Event("Normal", "Scaled", f"{kind} {tname}: {reason}"))
    # replicas: what the workload reports running (its scale status); desired: the decision.
    out.status.update(replicas=scale.status_replicas, desiredReplicas=desired)
    conds = set_condition(conds, "Ready", "True", "Reconciled",
                          f"{kind} {tname} at {desired} replicas: {reason}", now_s, generation)

    out.status.update(conditions=conds, decision=decision)
    return out
