import math

import pytest

from anchorage.tiering.temporal import (
    Decision,
    GateInput,
    GateParams,
    decide_offload,
    first_fit,
    hold_until_s,
    reload_at_s,
    reload_outcome,
    stall_action,
    worth_moving,
)

P = GateParams()


def good(**kw) -> GateInput:
    base = dict(stall_s=10.0, offload_s=0.5, reload_s=0.5, gpu_usage=0.9,
                host_free_blocks=1000, offload_blocks=100, freed_blocks=100, free_blocks=0,
                waiting=[(50, 800)], tokens_per_s=10_000.0, since_move_s=math.inf,
                criticality=0.0)
    base.update(kw)
    return GateInput(**base)


def test_accepts_a_long_stall_under_pressure():
    d = decide_offload(good(), P)
    assert d.offload and d.reason == "ok"
    assert d.window_s == pytest.approx(9.0)
    assert d.fit_index == 0


def test_rejects_when_host_has_no_room():
    d = decide_offload(good(host_free_blocks=99), P)
    assert not d.offload and d.reason == "host_full"


def test_rejects_a_stall_shorter_than_the_round_trip():
    d = decide_offload(good(stall_s=1.0), P)  # window = 1 - (0.5 + 0.5) = 0
    assert not d.offload and d.reason == "stall_short"
    assert decide_offload(good(stall_s=1.01, tokens_per_s=1e6), P).reason != "stall_short"


def test_rejects_below_the_pressure_watermark():
    d = decide_offload(good(gpu_usage=0.49), P)
    assert not d.offload and d.reason == "low_pressure"
    assert decide_offload(good(gpu_usage=0.7), GateParams(watermark=0.8)).reason == "low_pressure"


def test_rejects_when_no_waiting_request_fits():
    assert decide_offload(good(waiting=[]), P).reason == "no_fit"
    # demand larger than free + freed blocks
    assert decide_offload(good(waiting=[(101, 10)]), P).reason == "no_fit"
    # fits in blocks, but its prefill exceeds the window's token capacity (9 s x 10 tok/s)
    assert decide_offload(good(waiting=[(50, 91)], tokens_per_s=10.0), P).reason == "no_fit"
    # free blocks count too
    assert decide_offload(good(waiting=[(101, 10)], free_blocks=1), P).offload


def test_first_fit_takes_the_first_in_queue_order():
    q = [(500, 10), (0, 10), (40, 10), (30, 10)]
    assert first_fit(q, 100, math.inf) == 2
    assert first_fit(q, 10, math.inf) == -1
    d = decide_offload(good(waiting=q), P)
    assert d.fit_index == 2


def test_rejects_a_session_moved_recently():
    d = decide_offload(good(since_move_s=1.0), P)
    assert not d.offload and d.reason == "churn"
    assert decide_offload(good(since_move_s=2.0), P).offload


def test_penalises_critical_agents_with_an_emergency_exception():
    d = decide_offload(good(gpu_usage=0.6, criticality=1.0), P)
    assert not d.offload and d.reason == "low_score"
    assert decide_offload(good(gpu_usage=0.6, criticality=0.2), P).offload
    e = decide_offload(good(gpu_usage=0.99, criticality=1.0, stall_s=20.0), P)
    assert e.offload  # severe pressure and a large margin
    short = decide_offload(good(gpu_usage=0.99, criticality=1.0, stall_s=2.0,
                                since_move_s=math.inf), GateParams(threshold=2.0))
    assert not short.offload and short.reason == "low_score"  # margin 0.5 < 0.8


def test_reload_starts_ahead_of_the_predicted_return():
    # turn ended at 100 s, stall 10 s, reload 0.5 s, lead 10 % of the stall = 1 s
    assert reload_at_s(100.0, 10.0, 0.5, 100.2, P) == pytest.approx(108.5)
    # never before the offload completed
    assert reload_at_s(100.0, 1.0, 0.9, 100.5, P) == pytest.approx(100.5)
    # the lead has a floor
    assert reload_at_s(0.0, 0.01, 0.0, 0.0, P) == pytest.approx(0.01 - 0.005)


def test_reload_outcomes():
    assert reload_outcome(5.0, 6.0) == "in_time"
    assert reload_outcome(5.0, 5.0) == "in_time"
    assert reload_outcome(6.0, 5.0) == "late"
    assert reload_outcome(5.0, None) == "wasted"


def test_bad_parameters():
    with pytest.raises(ValueError):
        GateParams(watermark=1.5)
    with pytest.raises(ValueError):
        GateParams(churn_s=-1)
    with pytest.raises(ValueError, match="hold_margin"):
        GateParams(hold_margin=-0.1)
    with pytest.raises(ValueError, match="backup_ratio"):
        GateParams(backup_ratio=-1)


def test_count_reload_off_needs_only_the_copy_out_to_fit():
    inp = good(stall_s=0.8, tokens_per_s=1e6)  # round trip 1.0 s, copy out 0.5 s
    assert decide_offload(inp, P).reason == "stall_short"
    d = decide_offload(inp, GateParams(count_reload=False))
    assert d.reason != "stall_short" and d.window_s == pytest.approx(0.3)


def rejected(reason: str) -> Decision:
    return Decision(False, reason, 0.0)


def test_an_offload_is_an_offload():
    d = decide_offload(good(), P)
    assert stall_action(d, 10.0, 1.0, P) == "offload"
    assert stall_action(d, 10.0, math.inf, P) == "offload"


def test_a_short_stall_is_held_on_gpu():
    # back before a round trip would complete: kept on GPU, as the paper's agents are
    d = decide_offload(good(stall_s=0.9), P)
    assert d.reason == "stall_short"
    assert stall_action(d, 0.9, 0.0, P) == "hold"
    # until the predicted return plus a margin (half the stall, at least 50 ms)
    assert hold_until_s(100.0, 0.9, P) == pytest.approx(100.0 + 0.9 + 0.45)
    assert hold_until_s(100.0, 0.02, P) == pytest.approx(100.0 + 0.02 + 0.05)
    assert hold_until_s(0.0, 1.0, GateParams(hold_margin=0.0, min_hold_s=0.0)) == 1.0


@pytest.mark.parametrize("reason", ["low_pressure", "no_fit", "churn", "low_score"])
def test_a_rejected_stall_longer_than_the_cache_keeps_it_is_backed_up(reason):
    # under vLLM's prefix cache a session that is not offloaded is not kept either: when
    # its idle time exceeds how long a freed block survives, it gets a host copy
    ratio1 = GateParams(backup_ratio=1.0)
    assert stall_action(rejected(reason), 30.0, 10.0, ratio1) == "backup"
    assert stall_action(rejected(reason), 5.0, 10.0, ratio1) == "keep"
    assert stall_action(rejected(reason), 5.0, 10.0, GateParams(backup_ratio=0.4)) == "backup"
    # the default (ratio 0): every rejected stall once the cache evicts at all
    assert stall_action(rejected(reason), 0.1, 1e9, P) == "backup"
    assert stall_action(rejected(reason), 1e9, math.inf, P) == "keep"  # nothing evicted


def test_no_backup_without_host_room():
    assert stall_action(rejected("host_full"), 1e6, 0.0, P) == "keep"


def test_rejects_a_reload_worth_less_than_its_link_time():
    # benefit per byte: the recomputation the reload saves against the reload's link time
    assert decide_offload(good(recompute_s=0.49), P).reason == "low_saving"
    assert decide_offload(good(recompute_s=0.5), P).offload  # break-even (ratio 1)
    strict = GateParams(min_saving_ratio=6.0)
    assert decide_offload(good(recompute_s=2.9), strict).reason == "low_saving"
    assert decide_offload(good(recompute_s=3.0), strict).offload
    # checked after the round trip, before the pressure
    assert decide_offload(good(recompute_s=0.0, stall_s=0.5), P).reason == "stall_short"
    assert decide_offload(good(recompute_s=0.0, gpu_usage=0.0), P).reason == "low_saving"
    # unknown recomputation cost (the default): never rejects
    assert decide_offload(good(), strict).offload
    # a rejected low-saving stall is neither held nor backed up
    d = decide_offload(good(recompute_s=0.0), P)
    assert stall_action(d, idle_s=100.0, survival_s=1.0, p=P) == "keep"


def test_worth_moving_and_its_parameter():
    assert worth_moving(1.0, 1.0) and not worth_moving(0.99, 1.0)
    assert worth_moving(6.0, 1.0, GateParams(min_saving_ratio=6.0))
    assert not worth_moving(5.9, 1.0, GateParams(min_saving_ratio=6.0))
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="min_saving_ratio"):
            GateParams(min_saving_ratio=bad)
