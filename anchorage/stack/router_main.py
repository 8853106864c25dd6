"""``python -m anchorage.stack.router_main CONFIG.json``: a local Ray (no dashboard) with
Serve's ingress on ``127.0.0.1:<port>`` (HAProxy with direct ingress unless the config says
``ingress: serve``) and the Anchorage router deployed from a ``RouterConfig`` dict.
SIGTERM/SIGINT shut Serve and Ray down. With ``hosting: process`` in the config the router
runs in this process without Ray (``anchorage.router.app.serve_process``); SIGTERM/SIGINT
stop it.

Ray is kept on loopback by ``anchorage.stack.ray_loopback`` (node IP 127.0.0.1, Serve
replicas' gRPC port on 127.0.0.1; the stack prepares HOME so that no cloud metadata
server is probed)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def router_config(spec: dict, environ):
    """The router's settings: the spec's, and its secrets from ``environ`` (never the
    spec file: ``ANCHORAGE_TENANT_SECRET``, set by the stack, keys the tenant ids)."""
    from anchorage.router.config import RouterConfig, env_secrets

    return RouterConfig(**{**env_secrets(environ), **spec["router"]}).validate()


def main(path: str) -> int:
    spec = json.loads(open(path).read())
    from anchorage.stack import ray_loopback

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for k, v in ray_loopback.ENV.items():
        os.environ.setdefault(k, v)
    from anchorage.router.app import APP_NAME, build_app, hosting_env, serve_process

    cfg = router_config(spec, os.environ)
    hosting = spec.get("hosting", "ray")
    if hosting == "process":
        serve_process(cfg, "127.0.0.1", spec["port"],
                      on_ready=lambda: print("anchorage router ready", flush=True))
        return 0
    if hosting != "ray":
        raise ValueError(f"hosting must be ray or process, got {hosting!r}")
    os.environ.update(hosting_env(cfg, spec.get("haproxy_dir")))   # before Ray starts
    import ray
    from ray import serve

    stop = {"now": False}

    def on_signal(signum, frame):  # noqa: ARG001
        stop["now"] = True

    ray.init(num_cpus=spec.get("num_cpus", 2), include_dashboard=False, namespace="anchorage",
             logging_level="WARNING", log_to_driver=False, _temp_dir=spec.get("ray_temp_dir"),
             **ray_loopback.init_kwargs())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": spec["port"]})
        serve.run(build_app(cfg), name=APP_NAME, route_prefix="/")
        # after ray.init and Serve: Ray installs its own SIGTERM handler, which would end
        # this process without shutting Serve and Ray down
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        print("anchorage router ready", flush=True)
        while not stop["now"]:
            time.sleep(0.2)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
