"""`anchorage operator`: run the AgentCachePolicy operator (kopf) against the current cluster.

Uses the in-cluster service account, else $KUBECONFIG / ~/.kube/config. Several replicas
may run; kopf peering keeps exactly one active: each replica takes a random peering
priority (unless --priority is given), the highest live one works and the others pause
until it is gone (its keep-alive expires). kopf pauses *all* operators that share a
priority, so replicas must not be given the same --priority. Install the CRDs first:
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
    p.add_argument("--priority", type=int, default=None,
                   help="kopf peering priority (default: random, so one replica is active)")
    p.add_argument("--peering-lifetime-s", type=float, default=None,
                   help="seconds a silent peer still counts as alive: a standby replica takes "
                        "over this long after the active one dies (default 60)")
    p.add_argument("--interval-s", type=float, default=None,
                   help="periodic reconcile (resync) period in seconds (default 15)")
    p.add_argument("--liveness", default=None,
                   help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=8080,
                   help="serve the operator's own /metrics on this port (0: off; default 8080)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics binds (default 127.0.0.1; 0.0.0.0 in a pod so "
                        "Prometheus can scrape it)")
    p.add_argument("--access-log-dir", default=None,
                   help="a directory (a volume you mounted) whose anchorage-trace/v1 files "
                        "spec.tuning.accessLogs may name; without it no file is read, only "
                        "the target's node-agent Services are fetched")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=run)


def _own_id() -> str:
    """An identity as kopf makes one outside a pod (user@host/start/random)."""
    import getpass
    import secrets
    import socket
    import time

    return f"{getpass.getuser()}@{socket.gethostname()}/{time.strftime('%Y%m%d%H%M%S')}/" \
           f"{secrets.token_hex(3)}"


def run(args) -> int:
    from anchorage.cli import CLIError

    if args.interval_s is not None:
        if args.interval_s <= 0:
            raise CLIError("--interval-s must be positive")
        os.environ["ANCHORAGE_OPERATOR_INTERVAL_S"] = str(args.interval_s)
    if args.access_log_dir is not None:
        if not os.path.isdir(args.access_log_dir):
            raise CLIError(f"--access-log-dir {args.access_log_dir}: not a directory")
        os.environ["ANCHORAGE_OPERATOR_ACCESS_LOG_DIR"] = os.path.realpath(args.access_log_dir)
    if args.peering_lifetime_s is not None:
        if args.peering_lifetime_s < 2:
            raise CLIError("--peering-lifetime-s must be at least 2 (seconds)")
        os.environ["ANCHORAGE_OPERATOR_PEERING_LIFETIME_S"] = str(args.peering_lifetime_s)
    if args.metrics_port < 0:
        raise CLIError("--metrics-port must be >= 0")
    os.environ["ANCHORAGE_OPERATOR_METRICS_PORT"] = str(args.metrics_port)
    os.environ["ANCHORAGE_OPERATOR_METRICS_HOST"] = args.metrics_host
    os.environ["ANCHORAGE_OPERATOR_NAMESPACES"] = ",".join(args.namespace or ())
    # kopf's peering identity; the periodic resync must know which peering entry is its own
    os.environ.setdefault("POD_ID", _own_id())
    try:
        import kopf
    except ImportError:
        from anchorage.cli import CommandFailed

        raise CommandFailed("the operator needs kopf: pip install 'anchorage[operator]'") from None
    import asyncio
    import logging
    import random

    import anchorage.operator.handlers  # noqa: F401  (registers the handlers)

    # The CLI already configured the root logger; kopf.configure() would add a second handler.
    logging.getLogger("kopf").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    asyncio.run(kopf.operator(
        namespaces=args.namespace or (), clusterwide=not args.namespace,
        peering_name=args.peering, standalone=args.standalone,
        priority=args.priority if args.priority is not None
        else random.SystemRandom().randint(1, 2**31 - 1),
        liveness_endpoint=args.liveness))
    return 0
