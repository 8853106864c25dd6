"""The plugin -> sidecar contract (``anchorage-node-state/v1``) is byte-stable: the exporter
writes, for a fixed workload and clock, exactly the bytes of the committed golden files
(written by the exporter before the snapshot schema was typed), and the sidecar's reader
gives them back unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.node_agent.exporter import PolicyStateExporter, policy_view
from anchorage.node_agent.recorder import NodeState
from anchorage.node_agent.snapshot import FORMAT, Anchor, Snapshot, StateError, write_settings

DATA = Path(__file__).parent / "data"
BS = 4
GROUP0 = (0).to_bytes(4, "big")
NOW, PID = 1_700_000_000.5, 4242


def toks(agent: int, session: int) -> list[int]:
    return [100 * agent + i for i in range(3 * BS)] + [
        10_000 + 97 * session + i for i in range(2 * BS)]


def keys_of(tokens: list[int], salt: str | None) -> list[bytes]:
    out, prev = [], (salt or "").encode()
    for i in range(len(tokens) // BS):
        prev = hashlib.sha256(prev + repr(tokens[i * BS:(i + 1) * BS]).encode()).digest()
        out.append(prev + GROUP0)
    return out


def workload() -> tuple[object, NodeState]:
    """Sessions go agent 1 -> 2 -> 3 (two tenants, one with a cache salt); agent 2 calls a
    tool; one session is left active at agent 1 (so agent 2 is predicted next)."""
    policy = make_policy("cachescout", block_size=BS)
    state = NodeState(block_size=BS)
    exp = PolicyStateExporter(policy, "/nonexistent/state.json", node_state=state)
    t, rid = 0.0, 0
    for s in range(13):
        tenant, salt = ("t-a", "salt-a") if s % 2 else (None, None)
        for a in ((1, 2, 3) if s < 12 else (1,)):
            t += 1.0
            rid += 1
            tk = toks(a, s)
            c = RequestContext(request_id=rid, keys=keys_of(tk, salt), input_length=len(tk),
                               output_length=8, now_s=t, session_id=f"s{s}",
                               agent_hint=f"agent{a}", tenant=tenant,
                               tool_name="read_file" if a == 2 else None,
                               tool_args={"path": f"/src/{s}.py"} if a == 2 else None)
            policy.on_request(c)
            state.observe(policy, c, tk, now_s=t, cache_salt=salt)
            if s < 12:
                policy.on_request_done(c)
        exp.snapshot()
    for sec in (3e-6, 2e-5, 0.2):
        state.record_decision(sec)
    return policy, state


@pytest.fixture
def fixed_clock(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setattr(os, "getpid", lambda: PID)


def snapshots(tmp_path: Path) -> dict[str, bytes]:
    """The two golden cases: a real policy read through its introspection interface, and a
    view callable carrying a temporal-tiering section with pending reloads."""
    policy, state = workload()
    write_settings(tmp_path, access_log_sample_rate=1.0)
    stats = lambda: {"evictions": {"policy": 5, "lru": 2}, "policy_errors": 1}  # noqa: E731
    out = {}
    exp = PolicyStateExporter(policy, tmp_path / "state.json", node_state=state, stats=stats,
                              policy_name="cachescout", config_generation=lambda: 7)
    exp.write_once()
    out["policy"] = (tmp_path / "state.json").read_bytes()

    def view():
        v = policy_view(policy)
        v["tiering"] = {"mode": "spatial,temporal", "reserved_blocks": {"agent2": 3},
                        "offloads": {"ok": 2, "low_pressure": 1},
                        "reloads": {"in_time": 1, "late": 0, "wasted": 0},
                        "bytes": {"d2h": 4096, "h2d": 2048},
                        "pending_reloads": [
                            {"id": "s3#1", "session": "s3", "at_s": NOW + 2.0, "blocks": 5,
                             "agent": "agent2", "tenant": "t-a"},
                            {"id": "s99#1", "session": "s99", "at_s": NOW + 1.0, "blocks": 2,
                             "agent": None, "tenant": None}]}
        return v

    exp = PolicyStateExporter(view, tmp_path / "state.json", node_state=state, stats=stats,
                              mode="active", config_generation=3)
    exp.write_once()
    out["view"] = (tmp_path / "state.json").read_bytes()
    return out


# Fields added to v1 since the golden files were written (optional, absent when None)
ADDED = {"anchors": ("cache_salt", "tenant")}


def without_added(doc: dict) -> dict:
    for section, keys in ADDED.items():
        for obj in doc[section]:
            for k in keys:
                obj.pop(k, None)
    return doc


def test_exporter_writes_the_golden_bytes(tmp_path, fixed_clock):
    """Every field of the first release, byte for byte; the added ones only where set."""
    got = snapshots(tmp_path)
    for k, b in got.items():
        doc = json.loads(b)
        salted = [a for a in doc["anchors"] if "cache_salt" in a]
        assert salted and all(a["cache_salt"] == "salt-a" and a["tenant"] == "t-a"
                              for a in salted)   # the odd sessions' agents
        assert all("tenant" not in a for a in doc["anchors"] if "cache_salt" not in a)
        old = json.dumps(without_added(doc), separators=(",", ":")).encode()
        assert old == (DATA / f"state-v1-{k}.json").read_bytes(), k


@pytest.mark.parametrize("case", ["policy", "view"])
def test_a_snapshot_an_older_plugin_wrote_reads_and_writes_back_byte_for_byte(case):
    raw = (DATA / f"state-v1-{case}.json").read_bytes()
    snap = Snapshot.from_json(json.loads(raw), case)
    assert json.dumps(snap.to_json(), separators=(",", ":")).encode() == raw
    assert snap.counters.config_rejected is None   # not reported by that plugin
    assert snap.anchors and all(isinstance(a, Anchor) for a in snap.anchors)


def test_a_newer_plugins_sections_pass_through_and_bad_fields_are_named():
    doc = json.loads((DATA / "state-v1-view.json").read_bytes())
    doc["host_tier"] = {"hits": {"tokens": 3}}
    snap = Snapshot.from_json(doc)
    assert snap.extensions == {"host_tier": {"hits": {"tokens": 3}}}
    assert snap.to_json() == doc
    for path, value, problem in (
            (("anchors", 2, "token_ids"), [1, "x"], "anchors[2].token_ids: must be a list of ints"),
            (("counters", "policy_errors"), "1", "counters.policy_errors: must be an integer"),
            (("requests", 0, "hash_ids"), None, None),   # absent hash ids read as none
            (("tiering", "pending_reloads", 0, "at_s"), "soon",
             "tiering.pending_reloads[0].at_s: must be a number"),
            (("predictions", 1), [], "predictions[1]: must be an object, not list"),
            (("decision_seconds", "counts"), [1], "decision_seconds: le and counts differ")):
        bad = json.loads(json.dumps(doc))
        d = bad
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        if problem is None:
            assert list(Snapshot.from_json(bad, "state.json").requests[0].hash_ids) == []
            continue
        with pytest.raises(StateError) as exc:
            Snapshot.from_json(bad, "state.json")
        assert str(exc.value).startswith("state.json: ") and problem in str(exc.value), exc.value
    with pytest.raises(StateError, match="written_s: required"):
        Snapshot.from_json({"format": FORMAT})
