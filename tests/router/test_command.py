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
