"""The routing benchmark's protocol: the test set is disjoint from the tuning set and
covers what issue 39 names; parameters cannot be passed on the test set."""

import pytest

from bench import bench_routing_heldout as b
from bench.routing_protocol import ROUTERS, TEST, TUNING, overlap
from anchorage.trace.scenarios import TOPOLOGIES


def test_the_sets_are_disjoint_and_the_test_set_covers_the_issue():
    assert overlap() == set()
    kinds = {c.workload.split(":")[0] for c in TEST}
    assert kinds == {"scenario", "chatdev", "weka"}
    assert {c.workload.split(":")[1] for c in TEST if c.workload.startswith("scenario")} \
        == set(TOPOLOGIES)
    assert {c.replicas for c in TEST} == {2, 4, 8, 16}
    assert min(c.capacity_blocks for c in TEST) <= 800 <= 4000 <= max(c.capacity_blocks
                                                                       for c in TEST)
    assert all(c.workload.startswith("generated:") for c in TUNING)
    assert {"round_robin", "prefix", "precise_prefix", "llm_d", "dynamo_kv", "thunderagent",
            "agent"} <= set(ROUTERS)


def test_no_parameter_is_chosen_on_the_test_set():
    with pytest.raises(SystemExit):
        b.main(["--set", "test", "--router-param", "locality=2", "--only", "nothing"])


def test_the_verdict_reads_the_goals():
    def row(hit, p90):
        return {"hit_rate": hit, "ttft_p90_s": p90}
    r = {"cell": "c", "workload": "scenario:handoff:202", "capacity_blocks": 800,
         "rows": {"agent": row(0.50, 1.0), "prefix": row(0.47, 1.0), "round_robin": row(0.3, 2),
                  "pooled": row(0.6, 0.5)}}
    v = b.verdict(r)
    assert v["hit_goal"] and v["p90_goal"] and v["handing_goal"]
    assert v["best_peer"] == "prefix" and v["agent_minus_best_peer_points"] == pytest.approx(3)
    r["rows"]["agent"] = row(0.46, 1.06)
    v = b.verdict(r)
    assert not v["hit_goal"] and not v["p90_goal"] and not v["handing_goal"]
