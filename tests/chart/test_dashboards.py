"""The Grafana dashboards: generated from build.py, loadable by the Grafana dashboard model
library, and every panel query accepted by a real Prometheus and returning data while
exporters emit the series docs/metrics.md documents (with the chart's recording rules
loaded)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.chart.conftest import CHART
from tests.chart.exporters import DocumentedExporter, documented
from tests.conftest import need, need_module

DASHBOARDS = {p.stem: p for p in sorted((CHART / "dashboards").glob("*.json"))}
RULES = CHART / "rules" / "anchorage.rules.yaml"
# Dashboard variables as Grafana substitutes them for "All" / the test namespace.
VARIABLES = {"$namespace": "llm", "$model": ".*", "$__rate_interval": "20s"}


def _load(name: str) -> dict:
    return json.loads(DASHBOARDS[name].read_text())


def _targets(dash: dict) -> list[tuple[str, str, dict]]:
    return [(p["title"], t["expr"], t) for p in dash["panels"] if p.get("type") != "row"
            for t in p.get("targets", [])]


def _substitute(expr: str) -> str:
    for k in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(k, VARIABLES[k])
    return expr


def test_dashboards_present():
    assert set(DASHBOARDS) == {"fleet", "policy", "router"}


@pytest.mark.parametrize("name", ["fleet", "policy", "router"])
def test_generated_json_is_up_to_date(name):
    need_module("grafana_foundation_sdk", "grafana-foundation-sdk (pip install grafana-foundation-sdk)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("anchorage_dashboards_build",
                                                  CHART / "dashboards" / "build.py")
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build   # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(build)
    assert build.render(name) == DASHBOARDS[name].read_text(), (
        f"{name}.json is stale: run `.venv/bin/python charts/anchorage/dashboards/build.py`")


@pytest.mark.parametrize("name", ["fleet", "policy", "router"])
def test_dashboard_loads_with_grafana_model(name):
    need_module("grafana_foundation_sdk", "grafana-foundation-sdk (pip install grafana-foundation-sdk)")
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    raw = _load(name)
    model = Dashboard.from_json(raw)
    assert model.title == raw["title"] and model.uid == f"anchorage-{name}"
    assert len(model.panels) == len(raw["panels"]) >= 8
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert _targets(again) == _targets(raw)   # nothing lost in the model round trip
    ids = [p["id"] for p in raw["panels"]]
    assert len(ids) == len(set(ids))
    for p in raw["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"] and p["description"], p["title"]
    assert {v["name"] for v in raw["templating"]["list"]} >= {"datasource", "namespace"}


def test_issue_panels_present():
    titles = {n: {p["title"] for p in _load(n)["panels"]} for n in DASHBOARDS}
    assert {"Hit rate: fleet vs target", "Hit rate per replica", "Recomputed prefill tokens",
            "Time to first token", "Queue depth", "KV cache usage", "Replicas: desired vs actual",
            "Scale events"} <= titles["fleet"]
    assert {"Predictability R", "Next-agent prediction accuracy", "Protected blocks",
            "Warm-ups by outcome", "Wasted warm-ups", "Evictions by reason",
            "Policy errors and fall-backs"} <= titles["policy"]
    assert {"Requests by policy and outcome", "Requests by replica", "Decision latency",
            "Predicted vs observed cached tokens", "Retries", "Replicas and ejections",
            "Rejected (429) and errors"} <= titles["router"]
    ttft = [e for t, e, _ in _targets(_load("fleet")) if "time_to_first_token" in e]
    assert {q for e in ttft for q in re.findall(r"histogram_quantile\((0\.\d+)", e)} >= {"0.5", "0.9", "0.99"}


def _metric_names(text: str) -> set[str]:
    names = set(re.findall(r"\b(anchorage_[a-z_]+|vllm:[a-z_]+)", text))
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}


def test_every_queried_metric_is_documented():
    doc = {s.name for s in documented()}
    used = set()
    for p in DASHBOARDS.values():
        used |= _metric_names(p.read_text())
    used |= _metric_names(RULES.read_text())
    missing = sorted(n for n in used if n not in doc)
    assert not missing, f"queried but not in docs/metrics.md: {missing}"
    emitters = {s.emitter for s in documented()}
    assert emitters == {"node-agent", "router", "operator", "vllm"}
    unused = sorted(n for n in doc if n not in used)
    assert not unused, f"documented in docs/metrics.md but on no dashboard or rule: {unused}"


# ---- a real Prometheus ------------------------------------------------------------------

def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


class Prometheus:
    def __init__(self, workdir: Path, jobs: dict[str, list[tuple[int, dict]]], rules: Path):
        from tests.support.procs import free_port, spawn, wait_until

        self.port = free_port()
        scrape = []
        for job, targets in jobs.items():
            scrape.append({"job_name": job, "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{port}"], "labels": labels} for port, labels in targets]})
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "rule_files": [str(rules)], "scrape_configs": scrape}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.proc = spawn([shutil.which("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                           f"--storage.tsdb.path={workdir / 'data'}",
                           f"--web.listen-address=127.0.0.1:{self.port}"], workdir / "prometheus.log")
        wait_until(lambda: urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200,
                   "prometheus", 30, self.proc, workdir / "prometheus.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> tuple[int, dict]:
        return _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))

    def stop(self) -> None:
        from tests.support.procs import stop

        stop(self.proc)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    need(shutil.which("prometheus") is not None, "the prometheus server binary",
         "apt-get install prometheus (scripts/setup.d/40-prometheus.sh)")
    need_module("prometheus_client")
    work = tmp_path_factory.mktemp("prometheus")
    # The chart's rules, evaluated every second so recorded series appear within the test.
    rules = yaml.safe_load(RULES.read_text())
    for g in rules["groups"]:
        g["interval"] = "1s"
    (work / "rules.yaml").write_text(yaml.safe_dump(rules))
    # Two vLLM pods (+ node agents) behind one exporter, so their samples share timestamps.
    exps = {"models": DocumentedExporter({"node-agent", "vllm"},
                                         pods={"llama-8b-0": 0.6, "llama-8b-1": 0.3}),
            "router": DocumentedExporter({"router"}),
            "operator": DocumentedExporter({"operator"})}
    jobs = {"models": [(exps["models"].port, {})],
            "router": [(exps["router"].port, {"namespace": "llm", "pod": "router-0"})],
            "operator": [(exps["operator"].port, {"namespace": "anchorage-system", "pod": "op-0"})]}
    prom = Prometheus(work, jobs, work / "rules.yaml")
    try:
        # Wait until every target was scraped twice (rates need two samples) and rules ran.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            code, body = prom.query('count(count_over_time(up[1m]) >= 3) == 3 and '
                                    'count(anchorage:fleet_prefix_cache_hit_ratio:rate5m) > 0')
            if code == 200 and body["data"]["result"]:
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not scrape the exporters and evaluate the rules in 60 s; "
                        f"see {work / 'prometheus.log'}")
        yield prom
    finally:
        prom.stop()
        for e in exps.values():
            e.close()


@pytest.mark.parametrize("name", ["fleet", "policy", "router"])
def test_every_panel_query_returns_data(prometheus, name):
    failures = []
    for title, expr, _ in _targets(_load(name)):
        code, body = prometheus.query(_substitute(expr))
        if code != 200:
            failures.append(f"{title}: HTTP {code} {body.get('error')}: {expr}")
        elif not body["data"]["result"]:
            failures.append(f"{title}: no data: {expr}")
    assert not failures, "\n".join(failures)


def test_variable_queries_return_values(prometheus):
    for name in DASHBOARDS:
        for var in _load(name)["templating"]["list"]:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
            assert m, var["query"]
            selector, label = _substitute(m.group(1)), m.group(2)
            code, body = _get(f"{prometheus.url}/api/v1/label/{label}/values?"
                              + urllib.parse.urlencode({"match[]": selector}))
            assert code == 200 and body["data"], (var["name"], body)
    assert "llm" in body["data"] or "llama-8b" in body["data"]


def test_bad_query_is_rejected(prometheus):
    """The check above is meaningful: Prometheus answers 400 to a malformed query."""
    code, body = prometheus.query("sum by (pod (rate(vllm:prefix_cache_hits_total[1m]))")
    assert code == 400 and body["errorType"] == "bad_data"


def test_fleet_hit_rate_value(prometheus):
    """The fleet hit-rate stat computes the token-weighted rate: (600 + 300) / 2000."""
    expr = next(e for t, e, _ in _targets(_load("fleet")) if t == "Fleet hit rate")
    code, body = prometheus.query(_substitute(expr))
    assert code == 200
    assert float(body["data"]["result"][0]["value"][1]) == pytest.approx(0.45, abs=0.01)
    code, body = prometheus.query('anchorage:prefix_cache_hit_ratio:rate5m{pod="llama-8b-0"}')
    assert float(body["data"]["result"][0]["value"][1]) == pytest.approx(0.6, abs=0.01)


def test_rules_loaded_without_errors(prometheus):
    code, body = _get(prometheus.url + "/api/v1/rules")
    assert code == 200
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    assert len(rules) == 12
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
