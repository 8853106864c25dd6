"""`anchorage operator`: run the AgentCachePolicy operator (kopf) against the current cluster.

Uses the in-cluster service account, else $KUBECONFIG / ~/.kube/config. Several replicas
may run; kopf peering keeps exactly one active. Install the CRD first:
``kubectl apply -f manifests/crd/``.
"""

from __future__ import annotations

import os


def register(sub) -> None:
    p = sub.add_parser("operator", help="run the AgentCachePolicy operator (kopf)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--namespace", "-n", action="append", default=None,
                   help="watch only this namespace (repeatable; default: all namespaces)")
    p.add_argument("--peering", default="anchorage",
                   help="kopf peering name for one active operator (default: anchorage)")
    p.add_argument("--standalone", action="store_true", help="no peering (a single replica)")
    p.add_argument("--interval-s", type=float, default=None,
                   help="reconcile timer period in seconds (default 15)")
    p.add_argument("--liveness", default=None,
                   help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=8080,
                   help="serve the operator's own /metrics on this port (0: off; default 8080)")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from anchorage.cli import CLIError

    if args.interval_s is not None:
        if args.interval_s <= 0:
            raise CLIError("--interval-s must be positive")
        os.environ["ANCHORAGE_OPERATOR_INTERVAL_S"] = str(args.interval_s)
    if args.metrics_port < 0:
        raise CLIError("--metrics-port must be >= 0")
    os.environ["ANCHORAGE_OPERATOR_METRICS_PORT"] = str(args.metrics_port)
    try:
        import kopf
    except ImportError:
        raise CLIError("the operator needs kopf: pip install 'anchorage[operator]'") from None
    import asyncio
    import logging

    import anchorage.operator.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(verbose=args.verbose)
    logging.getLogger("kopf.objects").setLevel(logging.INFO)
    asyncio.run(kopf.operator(
        namespaces=args.namespace or None, clusterwide=not args.namespace,
        peering_name=args.peering, standalone=args.standalone,
        liveness_endpoint=args.liveness))
    return 0
