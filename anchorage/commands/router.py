"""`anchorage router`: run the OpenAI-compatible Ray Serve router in front of vLLM replicas.

    anchorage router --replicas http://10.0.0.5:8000,http://10.0.0.6:8000 --policy agent
    anchorage router --discovery kubernetes --k8s-selector app=vllm --k8s-port 8000
    anchorage router --mode epp --pool-name my-pool --pool-namespace llm   # behind a gateway

`--mode epp` serves the same routing decision as a Gateway API Inference Extension
endpoint picker (Envoy ext_proc over gRPC, port --grpc-port) instead of proxying:
endpoints from --replicas or the InferencePool --pool-name (Ready pods, target ports).

Secrets come from the environment, never flags: ANCHORAGE_TENANT_SECRET (keys the tenant
id and cache_salt hashes of API keys), ANCHORAGE_UPSTREAM_API_KEY (sent to the replicas),
ANCHORAGE_INTERNAL_TOKEN (callers sending it in x-anchorage-internal may mark warm-ups).
"""

from __future__ import annotations

import json
import os


def register(sub) -> None:
    p = sub.add_parser("router", help="run the Ray Serve router (OpenAI-compatible proxy)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="", help="comma-separated upstream base URLs (static discovery)")
    p.add_argument("--policy", default="agent",
                   help="routing policy: round_robin, least_loaded, session, prefix, "
                        "precise_prefix, agent, composite (default: agent)")
    p.add_argument("--policy-params", default="{}", help="JSON object of policy parameters")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--block-size", type=int, default=16, help="tokens per block for token-id prompts")
    p.add_argument("--max-inflight-per-replica", type=int, default=64)
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("--body-timeout-s", type=float, default=5.0,
                   help="a request body must arrive whole within this many seconds, else "
                        "408 (default: 5)")
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--discovery", choices=["static", "kubernetes"], default="static")
    p.add_argument("--k8s-namespace", default="default")
    p.add_argument("--k8s-selector", default="", help="label selector of the replicas' Endpoints")
    p.add_argument("--k8s-port", type=int, default=8000)
    p.add_argument("--k8s-kind", choices=["Endpoints", "EndpointSlice"], default="Endpoints")
    p.add_argument("--kv-events-port", type=int, default=0,
                   help="subscribe to each replica's vLLM KV events at tcp://<replica host>:PORT "
                        "(for precise_prefix; vLLM --kv-events-config with publisher zmq)")
    p.add_argument("--config-file", default="",
                   help="the operator's anchorage.yaml: its routing policy is applied on change")
    p.add_argument("--config-dir", default="",
                   help="a directory of <model>/anchorage.yaml (one routing policy per model)")
    p.add_argument("--num-replicas", type=int, default=1, help="router processes (Serve replicas)")
    p.add_argument("--ingress", choices=["haproxy", "serve"], default="haproxy",
                   help="haproxy: Serve's HAProxy with direct ingress (no actor call per "
                        "request; needs the variables set before Ray starts); serve: Serve's "
                        "proxy actor")
    p.add_argument("--hosting", choices=["ray", "process"], default="ray",
                   help="ray: Ray Serve (default; replicas, pod peers); process: this process "
                        "alone without Ray (uvicorn; one replica, no --peers/--peer-selector)")
    p.add_argument("--tokenizer", default="",
                   help="model directory with tokenizer files: key text and chat prompts by tokens")
    p.add_argument("--vocab-size", type=int, default=0,
                   help="refuse token ids >= this (0: from --tokenizer, else unchecked)")
    p.add_argument("--peers", default="",
                   help="comma-separated URLs of other router pods (each its own Ray) to share "
                        "routing decisions with (needs ANCHORAGE_INTERNAL_TOKEN)")
    p.add_argument("--peer-selector", default="",
                   help="label selector of the router's own Service Endpoints: the other "
                        "router pods, found as --discovery kubernetes finds engines")
    p.add_argument("--peer-port", type=int, default=8000, help="the router pods' port")
    p.add_argument("--pod-id", default="", help="this pod's name (default: $POD_NAME, hostname)")
    p.add_argument("--mode", choices=["proxy", "epp"], default="proxy",
                   help="proxy: the OpenAI-compatible router (default); epp: the endpoint "
                        "picker a Gateway API Inference Extension gateway calls (ext_proc)")
    e = p.add_argument_group("epp mode")
    e.add_argument("--grpc-port", type=int, default=9002,
                   help="ext_proc + gRPC health port (default 9002)")
    e.add_argument("--grpc-health-port", type=int, default=0,
                   help="also serve grpc.health.v1 on this port (0: only --grpc-port)")
    e.add_argument("--metrics-port", type=int, default=0, help="HTTP /metrics port (0: none)")
    e.add_argument("--pool-name", default="",
                   help="the InferencePool whose Ready pods are the endpoints (in cluster)")
    e.add_argument("--pool-namespace", default="default")
    e.add_argument("--fallbacks", type=int, default=2,
                   help="ranked fallback endpoints after the pick (default 2)")
    e.add_argument("--leader-election", action="store_true",
                   help="ready only while holding the Lease <pool>-epp (several EPP replicas)")
    e.add_argument("--lease-name", default="", help="the Lease's name (default <pool>-epp)")
    e.add_argument("--epp-peers", default="",
                   help="comma-separated HTTP URLs (their --metrics-port) of the other pickers "
                        "of this pool: the leader sends them its decisions (needs "
                        "--leader-election, --metrics-port, ANCHORAGE_INTERNAL_TOKEN)")
    e.add_argument("--epp-peer-selector", default="",
                   help="label selector of the other pickers' pods (found as --pool-name "
                        "finds engines; their --metrics-port): as --epp-peers")
    e.add_argument("--secure-serving", action="store_true",
                   help="TLS on --grpc-port (self-signed unless --cert-file/--key-file): "
                        "what the Inference Extension's gateways expect by default")
    e.add_argument("--cert-file", default="", help="TLS certificate (PEM) for --secure-serving")
    e.add_argument("--key-file", default="", help="TLS private key (PEM) for --secure-serving")
    p.add_argument("--print-config", action="store_true", help="validate, print the config, exit")
    p.set_defaults(func=run)


def make_config(args):
    from anchorage.cli import CLIError
    from anchorage.router.config import RouterConfig, env_secrets

    try:
        params = json.loads(args.policy_params)
    except ValueError as exc:
        raise CLIError(f"--policy-params is not valid JSON: {exc}") from None
    if not isinstance(params, dict):
        raise CLIError("--policy-params must be a JSON object")
    epp = getattr(args, "mode", "proxy") == "epp"
    cfg = RouterConfig(
        replicas=[u.strip() for u in args.replicas.split(",") if u.strip()],
        policy=args.policy, policy_params=params, block_size=args.block_size,
        max_inflight_per_replica=args.max_inflight_per_replica,
        max_body_bytes=args.max_body_bytes, body_timeout_s=args.body_timeout_s,
        retries=args.retries,
        discovery=("inferencepool" if epp and args.pool_name else args.discovery),
        k8s_namespace=args.k8s_namespace, k8s_selector=args.k8s_selector,
        k8s_port=args.k8s_port, k8s_kind=args.k8s_kind, kv_events_port=args.kv_events_port,
        config_file=args.config_file, config_dir=args.config_dir,
        num_replicas=args.num_replicas, ingress=args.ingress, tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        peers=[u.strip() for u in args.peers.split(",") if u.strip()],
        peer_selector=args.peer_selector, peer_port=args.peer_port, pod_id=args.pod_id,
        **env_secrets(os.environ))
    try:
        return cfg.validate()
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def make_epp_config(args):
    from anchorage.cli import CLIError
    from anchorage.router.epp import EppConfig

    e = EppConfig(host=args.host, port=args.grpc_port, health_port=args.grpc_health_port,
                  metrics_port=args.metrics_port, fallbacks=args.fallbacks,
                  pool_name=args.pool_name, pool_namespace=args.pool_namespace,
                  leader_election=args.leader_election, lease_name=args.lease_name,
                  tls=args.secure_serving, tls_cert_file=args.cert_file,
                  tls_key_file=args.key_file,
                  peers=[u.strip() for u in args.epp_peers.split(",") if u.strip()],
                  peer_selector=args.epp_peer_selector)
    try:
        return e.validate()
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def run_epp(args) -> int:
    from dataclasses import asdict

    from anchorage.cli import CLIError, CommandFailed
    if args.discovery == "kubernetes" or args.num_replicas != 1 or args.peers or args.peer_selector:
        raise CLIError("--mode epp finds endpoints with --replicas or --pool-name, and runs "
                       "one process (replicas: leader election): not --discovery kubernetes, "
                       "--num-replicas, --peers or --peer-selector")
    if args.pool_name and args.replicas:
        raise CLIError("--mode epp: give --replicas or --pool-name, not both")
    cfg, epp = make_config(args), make_epp_config(args)
    if (epp.peers or epp.peer_selector) and not cfg.trusted_token:
        raise CLIError("sharing decisions between pickers (--epp-peers / --epp-peer-selector) "
                       "needs the internal token (ANCHORAGE_INTERNAL_TOKEN)")
    if args.print_config:
        print(json.dumps({**cfg.to_dict(), "epp": asdict(epp)}, indent=1))
        return 0
    try:
        from anchorage.router.epp import serve
        import grpc  # noqa: F401
    except ImportError as exc:
        raise CommandFailed(f"--mode epp needs the [router] extra ({exc.name} missing): "
                            "pip install 'anchorage[router]'") from None
    try:
        serve(cfg, epp)
    except OSError as exc:
        raise CommandFailed(f"the endpoint picker could not start: {exc}") from None
    return 0


def run(args) -> int:
    if getattr(args, "mode", "proxy") == "epp":
        return run_epp(args)
    cfg = make_config(args)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    from anchorage.cli import CLIError, CommandFailed
    if args.hosting == "process":
        from anchorage.router.app import serve_process
        try:
            serve_process(cfg, host=args.host, port=args.port)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        return 0
    try:
        import ray

        from anchorage.router import app
    except ImportError as exc:
        raise CommandFailed(f"the router needs the [router] extra ({exc.name} missing): "
                            "pip install 'anchorage[router]'") from None
    if not ray.is_initialized():
        if not os.environ.get("RAY_ADDRESS"):       # a Ray we start: its ingress is ours
            os.environ.update(app.hosting_env(cfg))
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 namespace="anchorage")
    app.run(cfg, host=args.host, port=args.port, blocking=True)
    return 0
