"""The plugin -> sidecar snapshot: what the plugin records, what the exporter writes, what
the sidecar reads (a real agent-aware policy, no engine)."""

from __future__ import annotations

import hashlib
import itertools
import json
import threading

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.node_agent.exporter import PolicyStateExporter
from anchorage.node_agent.recorder import NodeState, agent_label
from anchorage.node_agent.snapshot import (
    FORMAT,
    Prediction,
    StateError,
    parse_snapshot,
    read_snapshot,
    write_settings,
)

BS = 4
GROUP0 = (0).to_bytes(4, "big")  # vLLM's key = block hash + KV-cache group id


def toks(agent: int, session: int, n_private: int = 2) -> list[int]:
    anchor = [100 * agent + i for i in range(3 * BS)]           # 3 shared blocks
    return anchor + [10_000 + 97 * session + i for i in range(n_private * BS)]


def keys_of(tokens: list[int]) -> list[bytes]:
    out, prev = [], b"root"
    for i in range(len(tokens) // BS):
        prev = hashlib.sha256(prev + repr(tokens[i * BS:(i + 1) * BS]).encode()).digest()
        out.append(prev + GROUP0)
    return out


def ctx(rid, tokens, session, now, warmup=False, hint=None):
    return RequestContext(request_id=rid, keys=keys_of(tokens), input_length=len(tokens),
                          output_length=8, now_s=now, session_id=session, agent_hint=hint,
                          warmup=warmup)


_RID = itertools.count()


def drive(policy, state, reqs):
    for agent, session, t, warm in reqs:
        rid = next(_RID)
        tk = toks(agent, session)
        c = ctx(rid, tk, f"s{session}", t, warmup=warm, hint=f"agent{agent}")
        policy.on_request(c)
        state.observe(policy, c, tk, now_s=t)
        state.observe(policy, c, tk, now_s=t)  # a second scheduling attempt: ignored
        policy.on_request_done(c)


@pytest.fixture
def learned():
    """Sessions always go agent 1 -> agent 2 -> agent 3."""
    policy = make_policy("cachescout", block_size=BS)
    state = NodeState(block_size=BS)
    exporter = PolicyStateExporter(policy, "/nonexistent/state.json", node_state=state)
    t = 0.0
    for s in range(12):
        for a in (1, 2, 3):
            t += 1.0
            drive(policy, state, [(a, s, t, False)])
        exporter.snapshot()  # what the exporter thread does every interval: R for the gate
    return policy, state


def test_anchor_registry_holds_the_shared_prefix_of_real_requests(learned):
    policy, state = learned
    anchors = state.anchors.entries
    # the shared anchor (3 blocks) of each agent, named by the policy's fingerprint
    for a in (1, 2, 3):
        fp = policy.fingerprint_of(keys_of(toks(a, 99)))
        e = anchors[agent_label(fp)]
        assert e.token_ids == toks(a, 0)[: 3 * BS]
        assert e.hint == f"agent{a}"
    assert state.requests_seen == 36


def test_warmups_are_not_requests_and_do_not_touch_the_registry(learned):
    policy, state = learned
    before = {k: (e.requests, e.last_seen_s) for k, e in state.anchors.entries.items()}
    n = state.requests_seen
    drive(policy, state, [(1, 50, 1000.0, True)])
    assert state.requests_seen == n
    assert {k: (e.requests, e.last_seen_s) for k, e in state.anchors.entries.items()} == before


def test_predictions_are_checked_against_the_next_agent(learned):
    _, state = learned
    p = state.predictions
    # 12 sessions x 2 transitions; the deterministic chain is learned after a few sessions
    assert sum(p.values()) == 24
    assert p["correct"] > p["wrong"]
    assert p["correct"] >= 12


def test_exporter_writes_a_snapshot_the_sidecar_reads(learned, tmp_path):
    policy, state = learned
    state.record_decision(3e-6)
    state.record_decision(0.2)
    path = tmp_path / "state.json"
    write_settings(tmp_path, access_log_sample_rate=1.0)
    exp = PolicyStateExporter(policy, path, interval_s=0.05, node_state=state,
                              stats=lambda: {"evictions": {"fallback": 2}, "policy_errors": 1},
                              config_generation=lambda: 7)
    exp.write_once()
    snap = read_snapshot(path)
    assert snap.policy == "cachescout" and snap.mode == "active"
    assert snap.config_generation == 7 and snap.block_size == BS
    assert 0.0 < snap.predictability <= 1.0
    assert snap.counters.policy_errors == 1
    assert snap.counters.evictions == {"fallback": 2}
    assert snap.decision_seconds.counts[-1] == 2 and snap.decision_seconds.counts[1] == 1
    assert set(snap.anchor_by_agent) == {e.agent for e in state.anchors.entries.values()}
    # every recent real request is in the access-log feed at sample rate 1
    assert len(snap.requests) == 36 and snap.requests[-1].seq == 36
    assert all(len(r.hash_ids) == 5 for r in snap.requests)
    # predictions: agents with active sessions next (none here: every session ended at
    # agent 3, whose next is END) are probabilities in [0, 1]
    assert all(0.0 <= p.probability <= 1.0 for p in snap.predictions)


def test_predictions_name_the_next_agent_of_active_sessions(learned, tmp_path):
    policy, state = learned
    drive(policy, state, [(1, 77, 37.0, False)])   # a new session at agent 1
    exp = PolicyStateExporter(policy, tmp_path / "s.json", node_state=state)
    snap = parse_snapshot(exp.snapshot())
    best, p = snap.predictions[0].agent, snap.predictions[0].probability
    fp2 = policy.fingerprint_of(keys_of(toks(2, 99)))
    assert best == agent_label(fp2) and p > 0.5


def test_sample_rate_zero_sends_no_requests(learned, tmp_path):
    policy, state = learned
    exp = PolicyStateExporter(policy, tmp_path / "state.json", node_state=state)
    assert exp.snapshot()["requests"] == []     # no sidecar settings yet: nothing sampled


def test_sampled_requests_are_built_once_and_follow_the_rate_and_the_window():
    policy = make_policy("cachescout", block_size=BS)
    state = NodeState(block_size=BS, max_requests=8)
    drive(policy, state, [(1 + s % 3, s, float(s), False) for s in range(6)])
    first = state.sampled_requests(1.0)
    assert [r.seq for r in first] == [1, 2, 3, 4, 5, 6]
    again = state.sampled_requests(1.0)
    assert all(a is b for a, b in zip(first, again))      # the same records, not rebuilt
    drive(policy, state, [(1, 40 + s, 10.0 + s, False) for s in range(4)])
    window = state.sampled_requests(1.0)
    assert [r.seq for r in window] == list(range(3, 11))  # the last 8 requests only
    assert window[0] is first[2]
    assert [r.seq for r in state.sampled_requests(1.0)] == list(range(3, 11))
    # a lower rate samples a subset of the sessions, decided again for every request
    part = state.sampled_requests(0.5)
    assert 0 < len(part) < 8 and {r.seq for r in part} < set(range(3, 11))
    assert state.sampled_requests(0.0) == ()
    assert len(state.sampled_requests(1.0)) == 8


def test_the_background_writer_writes_the_latest_document_and_counts_failures(tmp_path):
    from anchorage.node_agent.snapshot import BackgroundWriter

    w = BackgroundWriter()
    path = tmp_path / "new" / "dir" / "doc.json"       # the directory is made on demand
    for i in range(50):
        w.submit(path, {"n": i})
    assert w.flush() and json.loads(path.read_text()) == {"n": 49}
    assert 1 <= w.writes <= 50 and w.errors == 0
    (tmp_path / "file").write_text("")
    w.submit(tmp_path / "file" / "x.json", {"n": 1})   # a file where the directory should be
    assert w.flush() and w.errors == 1
    w.submit(path, {"n": 50})                           # and it keeps writing after a failure
    assert w.flush() and json.loads(path.read_text()) == {"n": 50}


def test_thread_writes_atomically_while_read(learned, tmp_path):
    policy, state = learned
    path = tmp_path / "state.json"
    exp = PolicyStateExporter(policy, path, interval_s=0.001, node_state=state).start()
    stop = threading.Event()
    errors = []

    def engine():  # the engine thread keeps mutating the policy meanwhile
        t = 2000.0
        while not stop.is_set():
            t += 1
            drive(policy, state, [(1 + int(t) % 3, int(t) % 40, t, False)])

    th = threading.Thread(target=engine)
    th.start()
    try:
        reads = 0
        while reads < 200:
            try:
                if read_snapshot(path) is not None:
                    reads += 1
            except StateError as e:
                errors.append(e)
                break
    finally:
        stop.set()
        th.join()
        exp.stop()
    assert not errors and exp.writes > 0 and exp.errors == 0


def test_stub_callable_and_bad_snapshots(tmp_path):
    path = tmp_path / "state.json"
    exp = PolicyStateExporter(lambda: {"policy": "stub", "predictability": 0.9,
                                       "predictions": [{"agent": "fp:1", "probability": 0.8}],
                                       "anchors": [{"agent": "fp:1", "hint": None,
                                                    "token_ids": [1, 2], "first_s": 0,
                                                    "last_seen_s": 0, "requests": 1}]}, path)
    exp.write_once()
    snap = read_snapshot(path)
    assert snap.policy == "stub" and snap.predictions == (Prediction(agent="fp:1", probability=0.8),)
    assert snap.anchor_by_agent["fp:1"].token_ids == [1, 2]
    assert read_snapshot(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(StateError, match="bad.json: not JSON"):
        read_snapshot(tmp_path / "bad.json")
    doc = json.loads(path.read_text())
    doc["format"] = "other"
    with pytest.raises(StateError, match="format"):
        parse_snapshot(doc)
    doc["format"] = FORMAT
    doc["anchors"][0]["token_ids"] = ["x"]
    with pytest.raises(StateError, match="token_ids"):
        parse_snapshot(doc)
    with pytest.raises(ValueError):
        PolicyStateExporter(lambda: {}, path, interval_s=0)


def test_block_pool_stats_reads_the_driver_counters():
    from anchorage.node_agent import vllm_block_pool
    from anchorage.node_agent.exporter import block_pool_stats

    saved = vllm_block_pool.STATS
    vllm_block_pool.STATS = vllm_block_pool.DriverStats(victims=5, stock_victims=2, errors=1)
    try:
        assert block_pool_stats("hybrid")() == {"evictions": {"policy": 5, "lru": 2},
                                                "policy_errors": 1}
        assert block_pool_stats("lru")() == {"evictions": {"lru": 7}, "policy_errors": 1}
    finally:
        vllm_block_pool.STATS = saved
