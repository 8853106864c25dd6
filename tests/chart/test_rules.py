"""The chart's Prometheus rules pass `promtool check rules` and their unit tests
(tests/chart/rules_test.yaml: recording rules, and each alert firing and staying silent)."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from tests.chart.conftest import CHART
from tests.conftest import REPO, need

RULES = CHART / "rules" / "anchorage.rules.yaml"
UNIT_TESTS = REPO / "tests" / "chart" / "rules_test.yaml"


def _promtool() -> str:
    path = shutil.which("promtool")
    need(path is not None, "promtool (Debian package prometheus)",
         "apt-get install prometheus (scripts/setup.d/40-prometheus.sh)")
    return path


def test_promtool_check_rules():
    r = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 12 rules found" in r.stdout


def test_promtool_unit_tests():
    r = subprocess.run([_promtool(), "test", "rules", str(UNIT_TESTS)], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_is_unit_tested():
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    records = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a["exp_alerts"]}
    silent = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if not a["exp_alerts"]}
    recorded = {e["expr"].split("{")[0] for t in tests for e in t.get("promql_expr_test", [])}
    assert alerts == fired, f"alerts never seen firing in rules_test.yaml: {alerts - fired}"
    assert {"AnchorageHitRateDrop", "AnchoragePolicyErrors", "AnchorageWarmupsWasted",
            "AnchorageOperatorNotReconciling"} <= silent
    assert records == recorded - {""}, f"recording rules without a test: {records - recorded}"
    for g in rules["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                assert r["labels"]["severity"] in ("info", "warning", "critical")
                assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_every_alert_links_its_runbook():
    """Each alert carries a runbook_url whose anchor is a section of docs/runbooks.md."""
    import re

    rules = yaml.safe_load(RULES.read_text())
    sections = {h.lower() for h in re.findall(r"^### (\w+)$", (REPO / "docs" / "runbooks.md")
                                             .read_text(), re.M)}
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for r in alerts:
        url = r["annotations"].get("runbook_url", "")
        assert url.startswith("https://github.com/anchorage-dev/anchorage/blob/main/docs/runbooks.md#"), r["alert"]
        assert url.rsplit("#", 1)[1] == r["alert"].lower() in sections, (r["alert"], url)
