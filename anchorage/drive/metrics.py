"""Scrape vLLM's own prefix-cache counters (``vllm:prefix_cache_{queries,hits}_total``; the
host tier's hits, through the KV connector, in ``vllm:external_prefix_cache_hits_total``) and
prefill counters from each engine's ``/metrics``, before and after a run."""

from __future__ import annotations

import math
import urllib.request

from anchorage.prometheus_text import samples, sums

COUNTERS = {"vllm:prefix_cache_queries_total": "queries", "vllm:prefix_cache_hits_total": "hits",
            "vllm:external_prefix_cache_hits_total": "external_hits",
            "vllm:prompt_tokens_total": "prompt_tokens"}


def parse(text: str) -> dict[str, float]:
    out = {v: 0.0 for v in COUNTERS.values()}
    for name, v in sums(text, COUNTERS).items():
        out[COUNTERS[name]] += v
    return out


def _scrape_sum(urls: list[str], parse_fn, timeout: float,
                total: dict[str, float]) -> dict[str, float] | None:
    """``parse_fn`` of each url's /metrics, summed into ``total``; None when any cannot be
    read."""
    for u in urls:
        try:
            with urllib.request.urlopen(u.rstrip("/") + "/metrics", timeout=timeout) as r:  # noqa: S310
                got = parse_fn(r.read().decode(errors="replace"))
        except (OSError, ValueError):  # unreachable, or not Prometheus text
            return None
        for k, v in got.items():
            total[k] = total.get(k, 0.0) + v
    return total


def scrape(urls: list[str], timeout: float = 10.0) -> dict[str, float] | None:
    """Summed counters over ``urls``; None when any engine cannot be read."""
    return _scrape_sum(urls, parse, timeout, {v: 0.0 for v in COUNTERS.values()})


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: after[k] - before.get(k, 0.0) for k in after}


NODE_AGENT = {"anchorage_policy_errors_total": "policy_errors",
              "anchorage_warmups_total": "warmups", "anchorage_evictions_total": "evictions"}


def parse_node_agent(text: str) -> dict[str, float]:
    """Node-agent counters summed over labels; warm-ups split by ``outcome``."""
    out: dict[str, float] = {"policy_errors": 0.0, "evictions": 0.0}
    for name, labels, value in samples(text, NODE_AGENT):
        key = NODE_AGENT[name]
        if not math.isfinite(value):
            continue
        if key == "warmups":
            key = f"warmups_{labels.get('outcome', '?')}"
        out[key] = out.get(key, 0.0) + value
    return out


def scrape_node_agents(urls: list[str], timeout: float = 10.0) -> dict[str, float] | None:
    return _scrape_sum(urls, parse_node_agent, timeout, {})
