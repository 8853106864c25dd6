import pytest

from anchorage.warmup import WarmupConfig, WarmupScheduler


def decide(s, now=0.0, **kw):
    args = dict(running=0, waiting=0, r=0.9, predictions=[("a", 0.8), ("b", 0.5)],
                known={"a", "b"}, cached=set())
    args.update(kw)
    return s.decide(now, **args)


def test_issues_most_likely_first_and_respects_tick_limit():
    s = WarmupScheduler(WarmupConfig(max_per_tick=1))
    d = decide(s)
    assert d.warm == ("a",)
    assert d.skipped["b"] == "tick_limit"


@pytest.mark.parametrize("kw,reason", [
    (dict(running=5), "engine_busy"),
    (dict(waiting=1), "engine_busy"),
    (dict(r=0.1), "unpredictable"),
])
def test_hard_gates(kw, reason):
    d = decide(WarmupScheduler(), **kw)
    assert d.warm == ()
    assert set(d.skipped.values()) == {reason}


def test_per_agent_reasons():
    s = WarmupScheduler(WarmupConfig(min_probability=0.6))
    d = decide(s, predictions=[("a", 0.9), ("b", 0.5), ("c", 0.95), ("d", 0.7)],
               known={"a", "b", "d"}, cached={"d"})
    assert d.warm == ("a",)
    assert d.skipped == {"b": "low_probability", "c": "anchor_unknown", "d": "already_cached"}


def test_cooldown_and_token_bucket():
    s = WarmupScheduler(WarmupConfig(rate_per_s=1.0, burst=1, cooldown_s=10.0, max_per_tick=5))
    assert decide(s, now=0.0).warm == ("a",)
    d = decide(s, now=0.5)
    assert d.skipped["a"] == "cooldown" and d.skipped["b"] == "rate_limited"
    assert decide(s, now=1.5).warm == ("b",)   # bucket refilled after 1 s
    assert decide(s, now=11.0).warm == ("a",)  # cooldown over


def test_disabled_and_validation():
    assert decide(WarmupScheduler(WarmupConfig(enabled=False))).warm == ()
    with pytest.raises(ValueError):
        WarmupConfig(r_min=2.0)
