import pytest

from anchorage.routing import NoReplicaError, make_router, router_names
from anchorage.routing.keys import agent_id, chain_keys, tenant_salt, text_block_keys, token_block_keys
from tests.routing.helpers import ctx, views


def test_registry_lists_every_policy():
    assert {"round_robin", "least_loaded", "session", "prefix", "precise_prefix", "agent",
            "composite"} <= set(router_names())


def test_unknown_router_and_bad_params_are_clear_errors():
    with pytest.raises(ValueError, match="unknown router 'nope'; known: .*agent"):
        make_router("nope")
    with pytest.raises(ValueError, match="bad parameters for router 'session'"):
        make_router("session", bogus=1)


@pytest.mark.parametrize("name", ["round_robin", "least_loaded", "session", "prefix",
                                  "precise_prefix", "agent", "composite"])
def test_every_router_skips_unhealthy_and_fails_clearly_without_any(name):
    r = make_router(name)
    reps = views(3, healthy=[False, True, False])
    for i in range(10):
        assert r.pick(ctx([1, 2, i], session=f"s{i}"), reps) == 1
    with pytest.raises(NoReplicaError):
        r.pick(ctx([1]), views(2, healthy=[False, False]))


def test_chain_keys_are_prefix_chained_and_salted():
    a = token_block_keys(list(range(64)), 16)
    b = token_block_keys(list(range(48)) + [7] * 16, 16)
    assert len(a) == 4 and a[:3] == b[:3] and a[3] != b[3]
    assert token_block_keys(list(range(70)), 16) == a          # partial block not keyed
    assert token_block_keys(list(range(64)), 16, salt="t1") != a
    assert chain_keys([b"x"], "t1") != chain_keys([b"x"], "t2")
    assert text_block_keys("a" * 600, 256) == text_block_keys("a" * 512 + "b" * 88, 256)


def test_tenant_salt_is_keyed_and_stable():
    assert tenant_salt("acme") == tenant_salt("acme") != tenant_salt("other")
    assert tenant_salt("acme", "k1") != tenant_salt("acme", "k2")
    assert tenant_salt(None) is None and "acme" not in tenant_salt("acme")


def test_agent_id_hint_scoped_by_tenant_else_anchor_key():
    assert agent_id(ctx([1, 2], agent="coder", tenant="a")) != agent_id(ctx([1, 2], agent="coder", tenant="b"))
    assert agent_id(ctx([1, 2, 3, 4, 5, 6])) == agent_id(ctx([1, 2, 3, 4, 9])) == ("fp", 4)
    assert agent_id(ctx([1, 2])) == ("fp", 2)
