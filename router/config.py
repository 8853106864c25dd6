"""Router configuration: typed, validated once at the edge (CLI flags or a dict)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RouterConfig:
    replicas: list[str] = field(default_factory=list)   # static upstream base URLs
    policy: str = "agent"
    policy_params: dict[str, Any] = field(default_factory=dict)
    model: str | None = None               # /v1/models fallback when no replica answers
    # request keys
    block_size: int = 16                   # token-id prompts: tokens per block
    chars_per_block: int = 64              # text prompts: characters per block (approx.)
    tenant_secret: str = ""                # keys the tenant id and cache_salt hashes
    upstream_api_key: str = ""             # sent to replicas (vLLM --api-key); never the client's
    # limits
    max_body_bytes: int = 4 * 1024 * 1024
    max_prompt_chars: int = 2_000_000
    max_inflight_per_replica: int = 64     # every healthy replica at this -> 429
    retry_after_s: int = 1
    # upstream
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0
    max_connections: int = 256
    retries: int = 2                       # extra attempts on connect errors / 5xx
    # health
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    eject_after_failures: int = 2
    # discovery: "static" or "kubernetes"
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
    actor_name: str = "anchorage-routing-state"

    def validate(self) -> "RouterConfig":
        from anchorage.routing import make_router
        if self.discovery not in ("static", "kubernetes"):
            raise ValueError(f"discovery must be 'static' or 'kubernetes', not {self.discovery!r}")
        if self.discovery == "static" and not self.replicas:
            raise ValueError("static discovery needs at least one replica URL")
        for u in self.replicas:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"replica URL must start with http:// or https://: {u!r}")
        for name in ("block_size", "chars_per_block", "max_body_bytes", "max_inflight_per_replica",
                     "eject_after_failures"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.retries < 0:
            raise ValueError("retries must be >= 0")
        make_router(self.policy, **self.policy_params)   # raises ValueError with a message
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for secret in ("tenant_secret", "upstream_api_key"):
            d[secret] = "***" if d[secret] else ""
        return d
