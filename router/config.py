"""Router configuration: typed, validated once at the edge (CLI flags or a dict)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

INGRESS = ("haproxy", "serve")
# "inferencepool": the EPP mode's (router/epp.py follows the pool; the proxy never sets it)
DISCOVERY = ("static", "kubernetes", "inferencepool")
# Secrets come from the environment, never from flags or the Serve config (and never in
# repr, logs or --print-config): field -> variable.
SECRET_ENV = {"tenant_secret": "ANCHORAGE_TENANT_SECRET",
              "upstream_api_key": "ANCHORAGE_UPSTREAM_API_KEY",
              "trusted_token": "ANCHORAGE_INTERNAL_TOKEN"}


def env_secrets(environ) -> dict[str, str]:
    """The router's secrets that ``environ`` sets (``SECRET_ENV``)."""
    return {f: environ[v] for f, v in SECRET_ENV.items() if environ.get(v)}


@dataclass
class RouterConfig:
    replicas: list[str] = field(default_factory=list)   # static upstream base URLs
    policy: str = "agent"
    policy_params: dict[str, Any] = field(default_factory=dict)
    model: str | None = None               # /v1/models fallback when no replica answers
    # request keys
    block_size: int = 16                   # token-id prompts: tokens per block
    chars_per_block: int = 64              # text prompts without a tokenizer: characters per block
    tokenizer: str = ""                    # local model dir: key text and chat prompts by tokens
    # keys the tenant id and cache_salt hashes (HMAC): without it tenant ids are unkeyed
    tenant_secret: str = field(default="", repr=False)
    # sent to replicas (vLLM --api-key); never the client's
    upstream_api_key: str = field(default="", repr=False)
    # x-anchorage-internal: callers that may mark warm-ups
    trusted_token: str = field(default="", repr=False)
    # limits (each breach is a 4xx with an OpenAI error object)
    max_body_bytes: int = 4 * 1024 * 1024
    max_prompt_chars: int = 2_000_000
    max_header_bytes: int = 16 * 1024      # all request headers together (431)
    max_session_id_chars: int = 256
    max_hint_chars: int = 256              # anchorage.agent, anchorage.tool_name
    max_tool_args_chars: int = 8192        # anchorage.tool_args, as JSON text
    max_n: int = 16                        # n and best_of
    max_json_depth: int = 64
    # the whole body must arrive within this (408; a client that stops part-way holds no
    # connection); a local router's HAProxy gives the headers the same time (router/ingress.py)
    body_timeout_s: float = 5.0
    vocab_size: int = 0                    # token ids must be < this (0: unchecked)
    vocab_sizes: dict[str, int] = field(default_factory=dict)   # per served model name
    max_inflight_per_replica: int = 64     # every healthy replica at this -> 429
    retry_after_s: int = 1
    # upstream
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0
    max_connections: int = 256
    retries: int = 2                       # extra attempts after a connect error
    # health
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    eject_after_failures: int = 2          # transport failures of distinct requests
    # discovery: "static", "kubernetes" (Endpoints) or "inferencepool" (EPP mode)
    discovery: str = "static"
    k8s_namespace: str = "default"
    k8s_selector: str = ""                 # label selector of the replicas' Endpoints
    k8s_port: int = 8000
    k8s_kind: str = "Endpoints"            # or "EndpointSlice"
    # KV events (precise routing): replica URL -> ZMQ endpoint, and/or one port for all
    # replicas (tcp://<replica host>:<port>); empty: no subscription
    kv_events: dict[str, str] = field(default_factory=dict)
    kv_events_port: int = 0
    kv_events_topic: str = "kv"
    # the operator's anchorage.yaml: one file, or a directory of <model>/anchorage.yaml
    config_file: str = ""
    config_dir: str = ""
    config_poll_s: float = 2.0
    # hosting (Ray Serve): router replicas, the ingress in front of them, shared state
    num_replicas: int = 1
    ingress: str = "haproxy"               # haproxy (Serve's HAProxy + direct ingress) | serve
    sync_interval_s: float = 0.05          # decisions shared between router replicas
    # router pods with their own Ray (Deployment mode, several pods): share decisions over
    # HTTP (router/pods.py); static URLs of the other pods and/or the label selector of
    # the router's own Service Endpoints (port ``peer_port``); needs ``trusted_token``
    peers: list[str] = field(default_factory=list)
    peer_selector: str = ""
    peer_port: int = 8000
    pod_id: str = ""                       # default: $POD_NAME, else the host name
    gc_freeze_after_s: float = 60.0        # warm-up, then gc.freeze() once (0: never)
    actor_name: str = "anchorage-routing-state"

    def validate(self) -> "RouterConfig":
        from anchorage.routing import make_router
        if self.discovery not in DISCOVERY:
            raise ValueError(f"discovery must be one of {', '.join(DISCOVERY)}, "
                             f"not {self.discovery!r}")
        if self.discovery == "static" and not self.replicas:
            raise ValueError("static discovery needs at least one replica URL")
        for u in self.replicas:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"replica URL must start with http:// or https://: {u!r}")
        for name in ("block_size", "chars_per_block", "max_body_bytes", "max_inflight_per_replica",
                     "eject_after_failures", "max_header_bytes", "max_session_id_chars",
                     "max_hint_chars", "max_tool_args_chars", "max_n", "max_json_depth",
                     "body_timeout_s", "num_replicas", "sync_interval_s", "config_poll_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.retries < 0 or self.vocab_size < 0:
            raise ValueError("retries and vocab_size must be >= 0")
        if self.ingress not in INGRESS:
            raise ValueError(f"ingress must be one of {', '.join(INGRESS)}, not {self.ingress!r}")
        if (self.peers or self.peer_selector) and not self.trusted_token:
            raise ValueError("sharing decisions between router pods (peers / peer_selector) "
                             "needs the internal token (ANCHORAGE_INTERNAL_TOKEN)")
        for u in self.peers:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"peer URL must start with http:// or https://: {u!r}")
        make_router(self.policy, **self.policy_params)   # raises ValueError with a message
        return self

    def vocab_for(self, model: str | None) -> int:
        return self.vocab_sizes.get(model or "", self.vocab_size)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for secret in SECRET_ENV:  # never shown
            d[secret] = "***" if d[secret] else ""
        return d
