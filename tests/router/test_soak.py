"""The router soak (issue 21, "Done when"), bounded for CI: two router replicas in front
of 24 fake engines, one engine killed and restarted every few seconds, a steady client
load for a minute (``tests.router.soak``; ``bench/bench_router_soak.py`` runs it longer
and reports the figures)."""

from __future__ import annotations


def test_soak_loses_no_request_leaks_no_slot_and_ejects_only_the_killed(cluster):
    r = cluster["ns"]("soak", 24, 60.0, replicas=2, concurrency=12, kill_every_s=5.0,
                      down_s=2.5, warmup_s=15.0)
    summary = {k: v for k, v in r.items() if k != "rss_mib"}
    assert r["requests"] > 100 and r["kills"] >= 5, summary
    assert r["lost"] == 0, summary
    assert r["router_replicas_seen"] == 2 and r["inflight_after"] == 0, summary
    assert set(r["ejected"]) <= set(r["killed"]), summary
    assert r["rss_growth_mib"] < 30 + 0.1 * r["rss_after_warmup_mib"], r["rss_mib"]
