"""The held-out generator (``anchorage.trace.scenarios``): deterministic, valid v1 records,
and the prompt shapes its specification names."""

import pytest

from anchorage.trace.format import dumps_trace
from anchorage.trace.scenarios import RANGES, TOPOLOGIES, draw_params, scenario


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_each_topology_is_deterministic_and_valid(topology):
    h1, a = scenario(topology, 12, 5, concurrency=4)
    _, b = scenario(topology, 12, 5, concurrency=4)
    assert [r.to_json() for r in a] == [r.to_json() for r in b]
    assert a and all(r.timestamp >= 0 and r.hash_ids for r in a)
    assert [r.timestamp for r in a] == sorted(r.timestamp for r in a)
    assert dumps_trace(a, h1).count("\n") == len(a) + 1
    p = draw_params(topology, 5)
    assert RANGES["agents"][0] <= p.agents <= RANGES["agents"][1]
    assert p.preamble_tokens == 0 or RANGES["preamble_tokens"][0] <= p.preamble_tokens


def test_sub_agents_run_in_sessions_of_their_own():
    _, recs = scenario("hierarchical", 10, 1, concurrency=4)
    sids = {r.session_id for r in recs}
    assert any("/w" in s for s in sids) and any("/" not in s for s in sids)


def test_a_shared_preamble_makes_every_agents_first_blocks_equal():
    seed = next(s for s in range(50) if draw_params("blackboard", s).preamble_tokens >= 400)
    _, recs = scenario("blackboard", 20, seed, concurrency=4)
    first = {r.hash_ids[0] for r in recs}
    agents = {r.agent for r in recs}
    assert len(agents) > 1 and len(first) == 1


def test_a_hand_off_passes_the_conversation_a_turn_extends_its_agents_last_prompt():
    _, recs = scenario("handoff", 10, 3, concurrency=4)
    by = {}
    for r in recs:
        prev = by.get((r.session_id, r.agent))
        if prev is not None:                    # the same agent again: it extends its view
            assert r.hash_ids[:len(prev) - 1] == prev[:-1]
            assert r.input_length > len(prev) * 16 - 16
        by[(r.session_id, r.agent)] = r.hash_ids


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="unknown scenario topology"):
        scenario("nope", 5, 1)
    with pytest.raises(ValueError):
        scenario("debate", 0, 1)
