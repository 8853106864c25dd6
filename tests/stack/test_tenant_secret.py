"""`anchorage up` keys tenant ids (issue 21 item 3): the router it starts gets a tenant
secret in its environment (the user's, else a random one per stack, the same across the
router's restarts), never in the spec file it writes."""

from __future__ import annotations

from pathlib import Path

from anchorage.stack.router_main import router_config
from anchorage.stack.stack import router_env


def test_the_router_gets_a_tenant_secret_in_its_environment(tmp_path: Path):
    base = {"PATH": "/bin", "RAY_ADDRESS": "10.0.0.1:6379"}
    a, b = router_env(base, tmp_path), router_env(base, tmp_path)
    secret = a["ANCHORAGE_TENANT_SECRET"]
    assert len(secret) == 64 and int(secret, 16) >= 0
    assert b["ANCHORAGE_TENANT_SECRET"] != secret          # one per stack, random
    assert "RAY_ADDRESS" not in a and a["HOME"] == str(tmp_path)
    mine = router_env({**base, "ANCHORAGE_TENANT_SECRET": "the-users-own"}, tmp_path)
    assert mine["ANCHORAGE_TENANT_SECRET"] == "the-users-own"
    spec = {"router": {"replicas": ["http://127.0.0.1:9"], "policy": "agent"}}
    cfg = router_config(spec, a)
    assert cfg.tenant_secret == secret and secret not in repr(cfg)
    assert "tenant_secret" not in spec["router"]           # the spec file never holds it
    assert router_config(spec, {}).tenant_secret == ""
