"""`anchorage router` argument handling (the serving path runs in test_app)."""

import json

from anchorage.cli import main


def test_print_config_validates_and_hides_secrets(capsys, monkeypatch):
    monkeypatch.setenv("ANCHORAGE_TENANT_SECRET", "s3cret")
    monkeypatch.setenv("ANCHORAGE_UPSTREAM_API_KEY", "sk-up")
    assert main(["router", "--replicas", "http://127.0.0.1:9,http://127.0.0.1:10",
                 "--policy", "prefix", "--policy-params", '{"cache_threshold": 0.5}',
                 "--print-config"]) == 0
    out = capsys.readouterr().out
    cfg = json.loads(out)
    assert cfg["replicas"] == ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    assert cfg["policy_params"] == {"cache_threshold": 0.5}
    assert "s3cret" not in out and "sk-up" not in out and cfg["tenant_secret"] == "***"


def test_bad_arguments_are_one_line_errors(capsys):
    for argv, msg in ([["router"], "at least one replica URL"],
                      [["router", "--replicas", "http://a", "--policy", "nope"], "unknown router 'nope'"],
                      [["router", "--replicas", "http://a", "--policy-params", "[1"], "not valid JSON"],
                      [["router", "--replicas", "http://a", "--policy", "prefix",
                        "--policy-params", '{"bogus": 1}'], "bad parameters for router 'prefix'"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and err.count("\n") == 1


def test_secrets_come_from_the_environment_keyed_and_never_shown():
    """Issue 21 item 3: the tenant id and cache salt are keyed by ANCHORAGE_TENANT_SECRET
    (another secret, other ids and salts for the same API key), and no secret appears in
    the config's repr."""
    from anchorage.router.config import RouterConfig, env_secrets
    from anchorage.router.parsing import tenant_of
    from anchorage.routing.keys import tenant_salt

    env = {"ANCHORAGE_TENANT_SECRET": "k1-5ecret", "ANCHORAGE_INTERNAL_TOKEN": "t0ken-9f",
           "ANCHORAGE_UPSTREAM_API_KEY": "", "PATH": "/bin"}
    assert env_secrets(env) == {"tenant_secret": "k1-5ecret", "trusted_token": "t0ken-9f"}
    cfg = RouterConfig(replicas=["http://127.0.0.1:9"], **env_secrets(env)).validate()
    assert cfg.tenant_secret == "k1-5ecret"
    assert "k1-5ecret" not in repr(cfg) and "t0ken-9f" not in repr(cfg)
    h = {"authorization": "Bearer sk-tenant-a"}
    a1, a2 = tenant_of(h, "k1"), tenant_of(h, "k2")
    assert a1 != a2 and tenant_salt(a1, "k1") != tenant_salt(a1, "k2")
    assert "sk-tenant-a" not in a1 + tenant_salt(a1, "k1")
