"""The premature-eviction counter has one canonical name across exporter, operator and docs.

docs/metrics.md (the contract issue 4's metric list refers to) names it
``anchorage_evictions_reused_total``; the node agent exports exactly that; the operator's
query reads it first and still accepts the earlier ``anchorage_evictions_reused_soon_total``.
"""

from __future__ import annotations

import re
from pathlib import Path

from anchorage.node_agent.metrics import MetricsView, NodeAgentCollector
from anchorage.operator import prometheus as prom

REPO = Path(__file__).resolve().parents[2]
CANONICAL = "anchorage_evictions_reused_total"
LEGACY = "anchorage_evictions_reused_soon_total"


def test_node_agent_exports_the_name_the_operator_reads_first():
    view = MetricsView(model_name="m", policy="hybrid", evictions_reused=7)
    samples = {s.name: s.value for fam in NodeAgentCollector(lambda: view).collect()
               for s in fam.samples}
    assert samples[CANONICAL] == 7.0
    assert LEGACY not in samples
    assert prom.EVICTIONS_REUSED == CANONICAL
    assert prom.EVICTIONS_REUSED_SOON.split("|") == [CANONICAL, LEGACY]


def test_docs_dashboards_and_rules_use_the_canonical_name():
    metrics_md = (REPO / "docs" / "metrics.md").read_text()
    assert re.search(rf"^\| `{CANONICAL}` \| counter \|", metrics_md, re.M)
    assert f"rate({CANONICAL}[w])" in (REPO / "docs" / "autoscaling.md").read_text()
    chart = REPO / "charts" / "anchorage"
    used = [p for p in [*chart.glob("dashboards/*.json"), *chart.glob("rules/*.yaml")]
            if "anchorage_evictions_reused" in p.read_text()]
    assert used, "the fleet dashboard plots premature evictions"
    for p in used:
        text = p.read_text()
        assert CANONICAL in text and LEGACY not in text, p
