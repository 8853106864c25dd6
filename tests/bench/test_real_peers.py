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
