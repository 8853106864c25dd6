"""kopf handlers for AgentCachePolicy: create, update, resume and a periodic timer all run
one ``reconcile`` pass; the result is patched into ``status`` and posted as Events.

Run with ``anchorage operator`` (or ``kopf run -m anchorage.operator.handlers``). Several
replicas may run: kopf peering (``--peering``, default ``anchorage``) keeps one active.
Environment: ``ANCHORAGE_OPERATOR_INTERVAL_S`` (timer period, default 15 s),
``ANCHORAGE_OPERATOR_METRICS_PORT`` (the operator's own /metrics; unset or 0: not served),
``ANCHORAGE_OPERATOR_PEERING_LIFETIME_S`` (how long a silent peer counts as alive, i.e. how
soon a standby replica takes over from a killed active one; kopf's default 60 s),
``ANCHORAGE_OPERATOR_NAMESPACES`` (comma-separated namespaces watched; empty: all).

Finalizers: kopf puts its finalizer on every policy because of the timer (so that the timer
is stopped before the object goes). A policy deleted while a timer pass runs is re-checked
every second (kopf's default is a minute), and an exiting operator releases the finalizers
it holds: otherwise a policy deleted together with the operator (``helm uninstall``, a
namespace deletion) would stay Terminating forever. The next operator to start puts them
back on the policies that still exist.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import kopf

from anchorage.operator import metrics as op_metrics
from anchorage.operator.kube import KubeIO, release_finalizer
from anchorage.operator.prometheus import PrometheusClient
from anchorage.operator.reconcile import reconcile

GROUP, VERSION, PLURAL = "anchorage.dev", "v1alpha1", "agentcachepolicies"
INTERVAL_S = float(os.environ.get("ANCHORAGE_OPERATOR_INTERVAL_S", "15"))

_kube: KubeIO | None = None
_prom: dict[str, PrometheusClient] = {}


@kopf.on.login()
def login(**kw: Any) -> kopf.ConnectionInfo | None:
    # kopf's own readers (not the kubernetes client's, which fixes $KUBECONFIG at import).
    info = kopf.login_with_service_account(**kw)
    if info is None:
        return kopf.login_with_kubeconfig(**kw)
    return dataclasses.replace(info, server=in_cluster_server(os.environ) or info.server)


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The API server's URL from the address every pod is given (what client-go and the
    kubernetes client use): kopf's service-account login names it by cluster DNS
    (kubernetes.default.svc), which a cluster without DNS, or a pod with another dnsPolicy,
    cannot resolve. None outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _kube
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    _kube = KubeIO()
    port = int(os.environ.get("ANCHORAGE_OPERATOR_METRICS_PORT", "0") or 0)
    if port:
        op_metrics.serve(port, os.environ.get("ANCHORAGE_OPERATOR_METRICS_HOST", "127.0.0.1"))
    settings.posting.level = 20  # INFO and above become Events
    lifetime = os.environ.get("ANCHORAGE_OPERATOR_PEERING_LIFETIME_S")
    if lifetime:
        # keep-alives are sent every max(1, lifetime - 5..10) s, so >= 2 s leaves a margin
        settings.peering.lifetime = max(2, int(float(lifetime)))
    settings.watching.server_timeout = 60
    # A timer pass (a sync handler in a thread) cannot be interrupted: when its policy is
    # deleted mid-pass, check again in a second, not kopf's default minute.
    settings.background.cancellation_polling = 1.0
    settings.background.instant_exit_timeout = 0.1


@kopf.on.cleanup()
def release_finalizers(settings: kopf.OperatorSettings, logger: Any, **_: Any) -> None:
    """On exit, take this operator's finalizer off the policies it watches (see the module
    docstring); a failure is logged, never raised (the operator is exiting anyway)."""
    if _kube is None:
        return
    watched = os.environ.get("ANCHORAGE_OPERATOR_NAMESPACES", "")
    namespaces = tuple(n for n in watched.split(",") if n)
    try:
        released = release_finalizer(_kube.api, GROUP, VERSION, PLURAL,
                                     settings.persistence.finalizer, namespaces)
    except Exception as e:  # noqa: BLE001
        logger.warning("could not release finalizers on exit: %s", e)
        return
    if released:
        logger.info("released the finalizer of %d policies on exit: %s", len(released),
                    ", ".join(released))


def _metrics_for(url: str) -> PrometheusClient:
    if url not in _prom:
        _prom[url] = PrometheusClient(url)
    return _prom[url]


def _run(body: kopf.Body, patch: kopf.Patch, reason: str, logger: Any) -> None:
    meta = body["metadata"]
    spec = dict(body.get("spec") or {})
    try:
        res = reconcile(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                        generation=meta.get("generation"), spec=spec,
                        status=dict(body.get("status") or {}), kube=_kube,
                        metrics_for=_metrics_for, now_s=time.time())
    except Exception:
        op_metrics.record_error(meta["namespace"], meta["name"])
        raise
    op_metrics.record(meta["namespace"], meta["name"], spec, res.status, res.facts)
    for k, v in res.status.items():
        patch.status[k] = v
    for ev in res.events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message)
        logger.info("%s: %s", ev.reason, ev.message)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def reconcile_on_change(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
    _run(body, patch, "change", logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL_S, initial_delay=INTERVAL_S)
def reconcile_periodically(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
    _run(body, patch, "timer", logger)
