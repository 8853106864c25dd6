from anchorage.access_log import AccessLogConfig, AccessLogSampler, stable_hash
from anchorage.trace.format import read_trace, write_trace


def test_whole_sessions_are_sampled_and_warmups_never():
    s = AccessLogSampler(AccessLogConfig(sample_rate=0.5, max_per_s=1e9))
    kept = {}
    for i in range(2000):
        sid = f"s{i % 100}"
        kept.setdefault(sid, set()).add(s.offer(i * 0.01, [1, 2, i], input_length=48, session_id=sid))
    assert all(len(v) == 1 for v in kept.values())  # a session is all in or all out
    frac = sum(1 for v in kept.values() if True in v) / len(kept)
    assert 0.3 < frac < 0.7
    assert not s.offer(100.0, [1], input_length=16, session_id="s0", warmup=True)


def test_rate_limit_and_bound():
    s = AccessLogSampler(AccessLogConfig(sample_rate=1.0, max_per_s=10, max_records=5))
    n = sum(s.offer(0.0, [i], input_length=16) for i in range(100))
    assert n == 10 and s.dropped_rate == 90
    assert len(s) == 5 and s.dropped_full == 5


def test_records_are_valid_v1_without_text(tmp_path):
    s = AccessLogSampler(AccessLogConfig(sample_rate=1.0, block_size=32))
    s.offer(10.0, [b"\x01" * 32, b"\x02" * 32], input_length=70, output_length=3,
            session_id="x", tool_name="grep", tool_args={"q": "a"})
    s.offer(10.5, [b"\x01" * 32], input_length=40, session_id="x")
    path = tmp_path / "log.jsonl"
    write_trace(path, s.drain(), s.header())
    header, recs = read_trace(path)
    assert header.block_size == 32
    assert [r.timestamp for r in recs] == [0, 500]
    assert recs[0].hash_ids[0] == recs[1].hash_ids[0] == stable_hash(b"\x01" * 32)
    assert recs[0].tool_name == "grep" and recs[0].input_length == 70
    assert stable_hash(5) == 5 and stable_hash("a") == stable_hash("a")
