"""bench/bench_real_peers.py's decision rules: the rotation of the stacks between repeats
and the per-repeat verdict against the SGLang gateway."""

from bench import bench_real_peers as b


def test_order_rotates_so_each_stack_runs_in_each_position():
    orders = [b.order(i) for i in range(3)]
    assert all(sorted(o) == sorted(b.CONFIGS) for o in orders)
    assert {o[0] for o in orders} == set(b.CONFIGS)
    assert {o[-1] for o in orders} == set(b.CONFIGS)


def _run(i, a_hit, a_p90, s_hit, s_p90):
    return {"repeat": i, "summaries": {
        "anchorage": {"hit_rate_engines": a_hit, "ttft_p90_s": a_p90},
        "smg": {"hit_rate_engines": s_hit, "ttft_p90_s": s_p90},
        "round_robin": {"hit_rate_engines": 0.1, "ttft_p90_s": 1.0}}}


def test_verdict_needs_both_figures_in_every_repeat():
    won = b.verdict([_run(0, 0.6, 0.2, 0.5, 0.3), _run(1, 0.7, 0.1, 0.5, 0.3)])
    assert won["all"] and won["repeats_won"] == 2
    # better hit rate but a worse TTFT p90 in one repeat: not won
    lost = b.verdict([_run(0, 0.6, 0.2, 0.5, 0.3), _run(1, 0.7, 0.4, 0.5, 0.3)])
    assert not lost["all"] and lost["repeats_won"] == 1
    assert lost["per_repeat"][1] == {"repeat": 1, "hit_rate_vs_smg": True, "ttft_p90_vs_smg": False,
                                     "hit_rate_vs_round_robin": True,
                                     "ttft_p90_vs_round_robin": True}
    # a stack that did not run is not a win
    gone = b.verdict([{"repeat": 0, "summaries": {"anchorage": {"hit_rate_engines": 0.6,
                                                                "ttft_p90_s": 0.1}}}])
    assert not gone["all"] and gone["per_repeat"][0]["hit_rate_vs_smg"] is None
    assert not b.verdict([])["all"]


def test_the_bound_stacks_are_judged_against_smg_like_anchorage():
    """--bound: `limit` (a pool nothing evicts) and `smg_again` (an A/A control) each get
    their own count of repeats better than smg, on both figures and on TTFT p90 alone;
    the anchorage verdict is unchanged by them."""
    assert [b.order(i, list(b.ALL_CONFIGS)) for i in range(5)][1][0] == "smg"
    assert b.ALL_CONFIGS["limit"].endswith(f"@{b.LIMIT_BLOCKS}")
    runs = []
    for i, (lim_p90, again_p90) in enumerate(((0.1, 0.4), (0.2, 0.2), (0.5, 0.25))):
        r = _run(i, 0.6, 0.2, 0.5, 0.3)
        r["summaries"]["limit"] = {"hit_rate_engines": 0.62, "ttft_p90_s": lim_p90}
        r["summaries"]["smg_again"] = {"hit_rate_engines": 0.5 + 0.01 * i, "ttft_p90_s": again_p90}
        runs.append(r)
    v = b.verdict(runs)
    assert v["repeats_won"] == 3 and v["all"]
    assert v["bounds"]["limit"]["repeats_won"] == 2
    assert v["bounds"]["limit"]["ttft_p90_repeats_won"] == 2
    # smg_again: hit rate 0.50 (not better), 0.51, 0.52; p90 0.4 (worse), 0.2, 0.25
    assert v["bounds"]["smg_again"]["repeats_won"] == 2
    assert v["bounds"]["smg_again"]["ttft_p90_repeats_won"] == 2
    assert "bounds" not in b.verdict([_run(0, 0.6, 0.2, 0.5, 0.3)])
    assert "| 1 | limit |" in b.table(runs)


def test_first_rotation_starts_a_batch_at_another_order(monkeypatch):
    """`--first-rotation K`: repeat i runs the stacks in order(K + i), so a second batch puts
    each stack after other neighbours; the repeat keeps its own index."""
    seen = []
    monkeypatch.setattr(b.subprocess, "call", lambda cmd, cwd=None: seen.append(cmd) or 0)
    r = b.run_once(0, [], bound=True, rotation=3)
    configs = seen[0][seen[0].index("--configs") + 1]
    assert [c.split("=")[0] for c in configs.split(",")] == b.order(3, list(b.ALL_CONFIGS))
    assert r["repeat"] == 0 and r["order"] == b.order(3, list(b.ALL_CONFIGS))
    b.run_once(2, [], bound=True)
    configs = seen[1][seen[1].index("--configs") + 1]
    assert [c.split("=")[0] for c in configs.split(",")] == b.order(2, list(b.ALL_CONFIGS))
