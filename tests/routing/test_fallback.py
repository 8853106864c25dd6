"""``anchorage.routing.fallback.rank_fallbacks``: the EPP's ranked fallbacks (pure)."""

from anchorage.routing.base import ReplicaView
from anchorage.routing.fallback import rank_fallbacks


def v(i, running=0, healthy=True, queued=0):
    return ReplicaView(index=i, running=running, healthy=healthy, queued_tokens=queued)


def test_cached_prefix_weighs_against_load_at_the_agent_routers_rate():
    views = [v(0, running=1), v(1, running=2), v(2, running=3), v(3, running=0, healthy=False)]
    # replica 2 holds 512 blocks of 16 tokens: 4 request equivalents at 2048 tokens each
    assert rank_fallbacks(views, {2: 512}, 16.0, k=3) == [2, 0, 1]
    # without a match: least loaded first; unhealthy never; the excluded never
    assert rank_fallbacks(views, {}, 16.0, exclude=[0], k=3) == [1, 2]
    assert rank_fallbacks(views, {}, 16.0, k=1) == [0]
    assert rank_fallbacks(views, {2: 512}, 16.0, k=0) == []
    # queued prefill counts as load (request equivalents)
    assert rank_fallbacks([v(0, queued=8192), v(1, running=2)], {}, 16.0, k=2) == [1, 0]


def test_no_exchange_rate_ranks_matches_first_then_load_then_index():
    views = [v(0, running=5), v(1, running=1), v(2, running=1)]
    assert rank_fallbacks(views, {0: 3}, 16.0, k=3, tokens_per_request=0) == [0, 1, 2]
    assert rank_fallbacks(views, {}, 16.0, k=3, tokens_per_request=0) == [1, 2, 0]
