"""The multi-agent workload generator: determinism, valid chained ids, anchors, history,
topology transitions, tool durations, timing and concurrency."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

import pytest

from anchorage.cli import main
from anchorage.trace.blocks import PrefixIds, n_blocks, token_blocks
from anchorage.trace.format import TraceReader, dumps_trace, read_trace
from anchorage.trace.generate import (TOPOLOGIES, agent_names, generate, service_ms,
                                      session_transitions, transition_matrix)


@pytest.fixture(scope="module")
def traces():
    return {t: generate(t, 7, 40, seed=3, mean_requests=12) for t in TOPOLOGIES}


def _by_session(records):
    out = defaultdict(list)
    for r in records:
        out[r.session_id].append(r)
    return out


def test_prefix_ids_are_chained():
    ids = PrefixIds()
    a = ids.chain(token_blocks(list(range(40)), 16))
    b = ids.chain(token_blocks(list(range(32)) + [99] * 8, 16))
    c = ids.chain(token_blocks([7] * 16 + list(range(16, 32)), 16))
    assert len(a) == 3 == n_blocks(40, 16)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert c[0] != a[0] and c[1] != a[1]  # same block content, different prefix
    assert ids.fresh() not in set(a + b + c)


def test_deterministic_for_a_seed():
    h1, r1 = generate("handoff", 6, 20, seed=11)
    h2, r2 = generate("handoff", 6, 20, seed=11)
    _, r3 = generate("handoff", 6, 20, seed=12)
    assert dumps_trace(r1, h1) == dumps_trace(r2, h2)
    assert dumps_trace(r1, h1) != dumps_trace(r3, h1)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_records_are_valid_v1_and_time_ordered(tmp_path, traces, topology):
    header, recs = traces[topology]
    assert header.block_size == 16 and header.extra["generator"]["topology"] == topology
    path = tmp_path / "g.jsonl.xz"
    path.write_bytes(b"")
    from anchorage.trace.format import write_trace
    write_trace(path, recs, header)
    got = list(TraceReader(path, check_order=True))
    assert len(got) == len(recs) > 40 * 2
    assert {r.agent for r in got} <= set(agent_names(topology, 7))
    for r in got:
        assert r.session_id and r.agent and r.tenant is None
        assert len(r.hash_ids) == n_blocks(r.input_length, 16)
        assert (r.tool_name is None) == (r.tool_duration_ms is None) == (r.tool_args is None)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_ids_mean_the_same_prefix(traces, topology):
    """An id determines its position and its predecessor (hence the whole prefix)."""
    _, recs = traces[topology]
    where: dict[int, tuple[int, int]] = {}
    for r in recs:
        parent = -1
        for pos, h in enumerate(r.hash_ids):
            assert where.setdefault(h, (pos, parent)) == (pos, parent)
            parent = h


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_anchors_shared_across_sessions_per_agent(traces, topology):
    _, recs = traces[topology]
    first: dict[str, set] = defaultdict(set)
    prefix: dict[str, list] = {}
    for r in recs:
        first[r.agent].add(r.hash_ids[0])
        p = prefix.setdefault(r.agent, r.hash_ids)
        k = 0
        while k < min(len(p), len(r.hash_ids)) and p[k] == r.hash_ids[k]:
            k += 1
        prefix[r.agent] = p[:k]
    assert all(len(s) == 1 for s in first.values())  # one anchor per agent
    assert len({next(iter(s)) for s in first.values()}) == len(first)  # distinct anchors
    # the anchor is hundreds to thousands of tokens: many blocks shared by every call
    assert min(len(p) for p in prefix.values()) >= 300 // 16 - 1
    assert len({r.session_id for r in recs if r.agent == recs[0].agent}) > 5


def test_history_grows_within_a_session(traces):
    _, recs = traces["debate"]
    extended = total = 0
    for sess in _by_session(recs).values():
        last: dict[str, list[int]] = {}
        for r in sess:
            prev = last.get(r.agent)
            if prev is not None:
                total += 1
                full = len(prev) - 1  # the partial last block cannot be reused
                extended += r.hash_ids[:full] == prev[:full] and len(r.hash_ids) > full
            last[r.agent] = r.hash_ids
    assert total > 100 and extended / total > 0.9  # the rest are history compactions


def test_transition_matrices_are_stochastic_and_shaped():
    for t in TOPOLOGIES:
        P = transition_matrix(t, 9, seed=1)
        assert len(P) == len(agent_names(t, 9))
        assert all(abs(sum(row) - 1) < 1e-9 and min(row) >= 0 for row in P)
    P = transition_matrix("pipeline", 5)
    assert P[0][1] == pytest.approx(0.85) and P[4][0] == pytest.approx(0.7)
    R = transition_matrix("random", 9, seed=1)
    assert max(max(r) for r in R) < 2.5 / 9  # near-uniform: nothing to learn
    S = transition_matrix("selector", 5)
    assert S[0][0] == 0 and S[0][1] > S[0][2] > S[0][4] and S[3][0] == pytest.approx(0.9)


def _empirical(recs):
    """Next agent after each request that called no tool, per session."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for sess in _by_session(recs).values():
        for a, b in zip(sess, sess[1:]):
            if a.tool_name is None:
                counts[a.agent][b.agent] += 1
            else:
                assert b.agent == a.agent  # the caller gets the tool's result
    return counts


def test_pipeline_and_random_transitions(traces):
    pipe = _empirical(traces["pipeline"][1])
    c = pipe["stage0"]
    assert c["stage1"] / sum(c.values()) > 0.7
    rnd = _empirical(generate("random", 5, 80, seed=3, mean_requests=10)[1])
    top_share = [max(c.values()) / sum(c.values()) for c in rnd.values()]
    assert max(top_share) < 0.45  # no strongly preferred successor


def test_tool_durations_depend_on_arguments():
    _, recs = generate("random", 12, 150, seed=5, mean_requests=6)
    by: dict[tuple, list[float]] = defaultdict(list)
    for r in recs:
        if r.tool_name:
            key = r.tool_args.get("path") if r.tool_name in ("run_tests", "read_file") else ""
            cls = ("suite" if key == "tests/" else "data" if str(key).startswith("data/")
                   else "one")
            by[(r.tool_name, cls)].append(r.tool_duration_ms)
    med = {k: statistics.median(v) for k, v in by.items() if len(v) >= 5}
    assert med[("run_tests", "suite")] > 5 * med[("run_tests", "one")]
    assert med[("run_tests", "one")] > 50 * med[("read_file", "one")]
    assert med[("read_file", "data")] > 3 * med[("read_file", "one")]


def test_next_request_after_service_plus_tool_or_think(traces):
    _, recs = traces["selector"]
    for sess in _by_session(recs).values():
        for a, b in zip(sess, sess[1:]):
            gap = b.timestamp - a.timestamp
            busy = service_ms(a.input_length, a.output_length)
            if a.tool_name:
                assert gap == pytest.approx(busy + a.tool_duration_ms, abs=0.01)
            else:
                assert gap > busy


def test_sessions_interleave_with_target_concurrency():
    _, recs = generate("hierarchical", 8, 200, seed=2, concurrency=50, mean_requests=6)
    span = {}
    for r in recs:
        span.setdefault(r.session_id, [r.timestamp, r.timestamp])[1] = r.timestamp
    active = []
    for q in (0.3, 0.5, 0.7):
        t = recs[int(len(recs) * q)].timestamp
        active.append(sum(1 for lo, hi in span.values() if lo <= t <= hi))
    assert 15 <= statistics.median(active) <= 100
    # consecutive requests mostly come from different sessions
    switches = sum(a.session_id != b.session_id for a, b in zip(recs, recs[1:]))
    assert switches / len(recs) > 0.8


def test_tenants_and_block_size():
    _, recs = generate("pipeline", 3, 20, seed=1, tenants=3, block_size=64)
    assert {r.tenant for r in recs} <= {"tenant0", "tenant1", "tenant2"}
    assert len({r.tenant for r in recs}) > 1
    assert all(len(r.hash_ids) == n_blocks(r.input_length, 64) for r in recs)


@pytest.mark.parametrize("kwargs,problem", [
    (dict(topology="star"), "unknown topology"),
    (dict(agents=1), "at least 2 agents"),
    (dict(topology="hierarchical", agents=2), "at least 3 agents"),
    (dict(sessions=0), "sessions must be a positive int"),
    (dict(block_size=0), "block_size must be a positive int"),
    (dict(mean_requests=1), "mean_requests must be >= 2"),
    (dict(concurrency=0), "concurrency must be > 0"),
])
def test_bad_options(kwargs, problem):
    args = dict(topology="pipeline", agents=4, sessions=5, seed=0) | kwargs
    with pytest.raises(ValueError, match=problem):
        generate(args.pop("topology"), args.pop("agents"), args.pop("sessions"),
                 args.pop("seed"), **args)


# ---------------------------------------------------------------------------------------
# CLI

def test_cli_generate_to_file_and_stdout(tmp_path, capsys):
    out = tmp_path / "w.jsonl.gz"
    assert main(["trace", "generate", "--topology", "selector", "--agents", "4",
                 "--sessions", "5", "--seed", "7", "-o", str(out)]) == 0
    header, recs = read_trace(out)
    assert header.block_size == 16 and len({r.session_id for r in recs}) == 5
    capsys.readouterr()
    assert main(["trace", "generate", "--topology", "selector", "--agents", "4",
                 "--sessions", "5", "--seed", "7", "--block-size", "32"]) == 0
    text = capsys.readouterr().out
    assert text.startswith('{"format":"anchorage-trace/v1","block_size":32')
    assert len(text.splitlines()) == len(recs) + 1


@pytest.mark.parametrize("argv,problem", [
    (["--topology", "debate", "--agents", "1", "--sessions", "3"], "at least 2 agents"),
    (["--topology", "debate", "--agents", "3", "--sessions", "-1"], "sessions must be"),
    (["--topology", "debate", "--agents", "3", "--sessions", "2", "-o", "/nonexistent/x.jsonl"],
     "cannot write /nonexistent/x.jsonl"),
])
def test_cli_generate_errors(capsys, argv, problem):
    assert main(["trace", "generate", *argv]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_session_transitions_favour_two_agents():
    import random as _random

    P = transition_matrix("selector", 6)
    Ps = session_transitions(P, "selector", _random.Random(1), 4.0)
    assert Ps[1:] == P[1:] and abs(sum(Ps[0]) - 1) < 1e-9
    boosted = [j for j in range(6) if Ps[0][j] > P[0][j]]
    assert len(boosted) == 2 and 0 not in boosted
    assert session_transitions(P, "pipeline", _random.Random(1), 4.0) is P
    assert session_transitions(P, "selector", _random.Random(1), 1.0) is P


def test_a_session_predicts_its_own_next_agent():
    """Per-session choices concentrate on the session's favourites more than on the
    globally most popular workers: per-session learning has something to learn."""
    _, recs = generate("selector", 8, 80, seed=4, mean_requests=20)
    picks = {sid: [b.agent for a, b in zip(s, s[1:])
                   if a.agent == "selector" and a.tool_name is None]
             for sid, s in _by_session(recs).items()}
    overall = Counter(x for p in picks.values() for x in p)
    top2 = {a for a, _ in overall.most_common(2)}
    own = glob = n = 0
    for p in picks.values():
        if len(p) >= 6:
            fav = {a for a, _ in Counter(p).most_common(2)}
            own += sum(x in fav for x in p)
            glob += sum(x in top2 for x in p)
            n += len(p)
    assert n > 200 and own / n > glob / n + 0.05
