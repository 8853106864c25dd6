"""Step 4 of a request: the routing state of one router process, consulted in-process
(no actor call per request). Router replicas share it asynchronously (``sync``): each
one's decisions and in-flight counts reach the others within a bounded, measured delay,
and every replica reads the engines' own truth (scraped gauges, KV events) itself, so
replicas do not herd onto their own "best" backend.

It owns: the upstream table (stable id, URL, served models, health, in-flight here and
at peers, scraped queue and KV usage, estimated queued prefill tokens), one routing
policy per model (``anchorage.routing``; the operator's document may set a model's),
admission (429 when every healthy replica of the model is at
``max_inflight_per_replica``), passive health (ejection after ``eject_after_failures``
transport failures or timeouts of distinct requests, none in between answered; an answer,
even a 5xx, is the replica working; a dropped connection counts only once the same request
succeeded on another replica, so a request that crashes engines ejects none) with
readmission on a good probe (``health``), which
forgets the policy's model of that replica (its cache was lost), and the metrics. Plain
Python: unit-testable without Ray.

Load signal handed to the policy (``ReplicaView``), per replica:

- ``waiting`` = ``vllm:num_requests_waiting`` and ``running`` = ``max(in-flight from this
  router, vllm:num_requests_running + waiting) - waiting`` (the scrape, every
  ``health_interval_s``, sees every client's requests; the in-flight count is fresh);
- ``kv_usage`` = ``vllm:kv_cache_usage_perc``;
- ``host_tier``: the last scrape has ``vllm:kv_offload_*`` samples (vLLM's offloading
  connector exports them from its start, Anchorage's host tier included) or ``lmcache:``
  ones (LMCache's connector): the replica keeps evicted KV in host memory;
- ``prefill_tokens_per_s``: the replica's prefill rate, measured from its counters
  (``anchorage.routing.load.PrefillRate`` over ``vllm:prompt_tokens_total`` less
  ``vllm:prompt_tokens_cached_total`` and ``vllm:request_prefill_time_seconds_sum``);
  the ``agent`` policy prices queues and prefills in seconds of it;
- ``queued_tokens``: vLLM exports no token-denominated queue gauge (0.32), so the router
  estimates it from what it sent: each request adds ``input_length - predicted cached
  tokens`` (the policy's ``predicted_hit_blocks`` x tokens per key) when it is sent, and
  removes it at its first response byte (``first_byte``: a streamed response's first
  chunk comes with the first token, i.e. when the prefill is done) or when it ends.
  Requests other clients send a replica are in ``waiting``, not in this estimate.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit
from typing import Any, Iterable

from anchorage.policies.base import RequestContext
from anchorage.prometheus_text import has_samples, sums
from anchorage.routing import NoReplicaError, ReplicaView, make_router
from anchorage.routing.load import PrefillRate
from anchorage.routing.vllm_events import VLLMEventTranslator
from anchorage.router.config import RouterConfig
from anchorage.router.metrics import RouterMetrics

log = logging.getLogger("anchorage.router")

_GAUGES = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
           "vllm:kv_cache_usage_perc": "kv_usage"}


@dataclass
class Upstream:
    id: int
    url: str
    name: str = ""             # the ``replica`` label: its pod's name when discovered, else the URL
    healthy: bool = True
    inflight: int = 0
    waiting: int = 0           # scraped
    running: int = 0           # scraped
    kv_usage: float = 0.0      # scraped
    host_tier: bool = False    # scraped: it exports host-tier (KV offload) series
    queued_tokens: int = 0     # estimated: prompts sent, no first byte yet
    failures: int = 0          # transport failures of distinct requests since an answer
    peer_inflight: int = 0     # in flight from the other router replicas (sync)
    models: tuple = ()         # served model ids (from the replica's /v1/models)
    model_entries: tuple = ()  # the replica's /v1/models data entries
    ejected_once: bool = False # ejected since added: readmission forgets its model
    prefill: PrefillRate = field(default_factory=PrefillRate)   # scraped counters' rate


HOST_TIER_SERIES = ("vllm:kv_offload_", "lmcache:")


def has_host_tier(text: str) -> bool:
    """The scraped /metrics text is of an engine with a host-memory KV tier (a sample
    line of vLLM's offloading connector or of LMCache; comments do not count)."""
    return has_samples(text, HOST_TIER_SERIES)


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """Sum of each known vLLM gauge over its label sets (one engine per replica)."""
    return {_GAUGES[name]: v for name, v in sums(text, _GAUGES).items()}


_PREFILL = ("vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total",
            "vllm:request_prefill_time_seconds_sum")


def prefill_counters(text: str) -> tuple[float, float] | None:
    """(prompt tokens computed, seconds in prefill) so far, from a scrape; None when the
    engine does not export them."""
    got = sums(text, _PREFILL)
    if _PREFILL[0] not in got or _PREFILL[2] not in got:
        return None
    return got[_PREFILL[0]] - got.get(_PREFILL[1], 0.0), got[_PREFILL[2]]


class RoutingState:
    def __init__(self, config: dict[str, Any] | RouterConfig) -> None:
        self.cfg = config if isinstance(config, RouterConfig) else RouterConfig(**config)
        self.router = make_router(self.cfg.policy, **self.cfg.policy_params)
        self.model_routers: dict[str, Any] = {}          # model -> router (operator's doc)
        self.model_policies: dict[str, tuple[str, dict]] = {}
        self.metrics = RouterMetrics()
        self.upstreams: dict[int, Upstream] = {}
        self._by_url: dict[str, Upstream] = {}
        self._next_id = 0
        self.translator = VLLMEventTranslator()
        self._kv_inbox: collections.deque = collections.deque()   # (url, events), any thread
        self.kv_events_applied = 0
        self._prefill: dict[tuple[int, Any], int] = {}   # (replica, request id) -> tokens
        self.outbox: list | None = None      # decisions for the peers (set by sync)
        self._models: set[str] = set()       # every model some replica reported
        self.ejections: dict[str, int] = {}  # replica URL -> times ejected
        self.set_replicas(self.cfg.replicas)

    # -- membership -----------------------------------------------------------------
    def set_replicas(self, urls: Iterable[str], names: dict[str, str] | None = None) -> None:
        """The replicas are now ``urls``; ``names`` (URL -> pod name, from discovery) label
        their series. A removed replica's series are deleted."""
        names = names or {}
        want = list(dict.fromkeys(u.rstrip("/") for u in urls))
        have = dict(self._by_url)
        for url in want:
            if url not in have:
                up = Upstream(self._next_id, url, names.get(url) or url)
                self.upstreams[up.id] = up
                self._by_url[url] = up
                self._next_id += 1
                self.metrics.healthy.labels(up.name).set(1)
                log.info("replica added: %s (%s)", up.name, url)
        for url, up in have.items():
            if url not in want:
                del self.upstreams[up.id]
                del self._by_url[url]
                self._forget_replica(up.id)
                self._models = {m for u in self.upstreams.values() for m in u.models}
                self.metrics.forget_replica(up.name or url)
                log.info("replica removed: %s (%s)", up.name, url)

    def _forget_replica(self, rid: int) -> None:
        for r in {id(x): x for x in [self.router, *self.model_routers.values()]}.values():
            r.on_replica_removed(rid)
        self.translator.forget(rid)

    def kv_endpoints(self) -> dict[str, str]:
        """Replica URL -> ZMQ endpoint of its KV event publisher (config)."""
        out = {}
        for u in self.upstreams.values():
            ep = self.cfg.kv_events.get(u.url)
            if ep is None and self.cfg.kv_events_port:
                ep = f"tcp://{urlsplit(u.url).hostname}:{self.cfg.kv_events_port}"
            if ep:
                out[u.url] = ep
        return out

    def queue_kv_events(self, url: str, events: list[dict]) -> None:
        """Thread-safe: called by the subscriber thread."""
        self._kv_inbox.append((url, events))

    def apply_kv_events(self) -> None:
        """Feed queued vLLM events to the policies (on the state's own thread)."""
        while self._kv_inbox:
            url, events = self._kv_inbox.popleft()
            up = self._by_url.get(url)
            if up is None:
                continue
            router = self.router_for(up.models[0] if up.models else None)
            for raw in events:
                for ev in self.translator.translate(up.id, raw):
                    router.on_kv_event(up.id, ev)
                    self.kv_events_applied += 1

    # -- policies per model -----------------------------------------------------------
    def router_for(self, model: str | None):
        return self.model_routers.get(model, self.router) if model else self.router

    def policy_for(self, model: str | None) -> str:
        """The name of the policy ``router_for(model)`` runs (the metrics' ``policy``)."""
        own = self.model_policies.get(model) if model else None
        return own[0] if own else self.cfg.policy

    def set_policy(self, model: str | None, name: str, params: dict[str, Any]) -> bool:
        """Route ``model`` (None: every model without its own) with a new policy; False
        when unchanged. Raises ValueError for an unknown policy or bad parameters (the
        current policy then stays)."""
        current = ((self.cfg.policy, self.cfg.policy_params) if model is None
                   else self.model_policies.get(model))
        if current == (name, params):
            return False
        router = make_router(name, **params)
        if model is None:
            self.router = router
            self.cfg.policy, self.cfg.policy_params = name, dict(params)
        else:
            self.model_routers[model] = router
            self.model_policies[model] = (name, dict(params))
        log.info("routing policy for %s: %s %s", model or "every model", name, params)
        return True

    def set_models(self, up: Upstream, entries: list[dict[str, Any]]) -> None:
        """What ``up`` serves (its ``/v1/models`` data entries)."""
        entries = [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
        up.model_entries = tuple(entries)
        up.models = tuple(e["id"] for e in entries)
        self._models = {m for u in self.upstreams.values() for m in u.models}

    def model_list(self) -> list[dict[str, Any]]:
        """Every model some replica serves (first replica's entry per id)."""
        seen: dict[str, dict] = {}
        for u in self.upstreams.values():
            for e in u.model_entries:
                seen.setdefault(e["id"], e)
        return list(seen.values())

    def _views(self, ups: list[Upstream]) -> list[ReplicaView]:
        cap = self.cfg.max_inflight_per_replica
        out = []
        for u in ups:
            mine = u.inflight + u.peer_inflight
            out.append(ReplicaView(index=u.id, name=u.url, healthy=mine < cap,
                                   running=max(mine, u.running + u.waiting) - u.waiting,
                                   waiting=u.waiting, kv_usage=u.kv_usage,
                                   queued_tokens=u.queued_tokens, host_tier=u.host_tier,
                                   prefill_tokens_per_s=u.prefill.rate))
        return out

    # -- decisions ------------------------------------------------------------------
    def pick(self, ctx: RequestContext, exclude: Iterable[int] = (),
             tokens_per_key: float = 1.0, model: str | None = None,
             prefer: str | None = None) -> dict[str, Any]:
        self.apply_kv_events()
        ex = set(exclude)
        known = self._models
        if model and known and model not in known:
            return {"status": "no_model"}
        ups = [u for u in self.upstreams.values() if u.healthy and u.id not in ex
               and (not model or not known or model in u.models)]
        if not ups:
            return {"status": "unavailable"}
        cap = self.cfg.max_inflight_per_replica
        if all(u.inflight + u.peer_inflight >= cap for u in ups):
            return {"status": "saturated", "retry_after_s": self.cfg.retry_after_s}
        router = self.router_for(model)
        pinned = [i for i, u in enumerate(ups) if u.url == prefer and u.inflight < cap]
        if pinned:                 # e.g. the replica holding a previous response
            up = ups[pinned[0]]
        else:
            views = self._views(ups)
            t0 = time.perf_counter()
            try:
                p = router.pick(ctx, views)
            except NoReplicaError:
                return {"status": "unavailable"}
            self.metrics.decision.observe(time.perf_counter() - t0)
            up = ups[p]
        blocks = router.predicted_hit_blocks(ctx, up.id)
        if tokens_per_key >= 1 and ctx.input_length:
            # vLLM computes at least a prompt's last token: a fully cached prompt hits
            # all but its last block when its length is a multiple of the block size
            blocks = min(blocks, int((ctx.input_length - 1) // tokens_per_key))
        predicted = int(blocks * tokens_per_key)
        router.on_start(ctx, up.id)
        if self.outbox is not None:
            self.outbox.append((up.url, model, ctx))
        prefill = max(0, int(ctx.input_length) - predicted)
        self._prefill[(up.id, ctx.request_id)] = prefill
        up.queued_tokens += prefill
        up.inflight += 1
        return {"status": "ok", "replica": up.id, "url": up.url, "predicted_tokens": predicted}

    def on_peer_start(self, url: str, model: str | None, ctx: RequestContext) -> bool:
        """Another router replica sent ``ctx`` to ``url``: the policy follows it."""
        up = self._by_url.get(url)
        if up is None:
            return False
        self.router_for(model).on_peer_start(ctx, up.id)
        return True

    def first_byte(self, ctx: RequestContext, replica: int) -> None:
        """The replica started answering ``ctx`` (its prefill is done): its prompt leaves
        the replica's queued tokens."""
        tokens = self._prefill.pop((replica, ctx.request_id), None)
        up = self.upstreams.get(replica)
        if tokens is not None and up is not None:
            up.queued_tokens = max(0, up.queued_tokens - tokens)

    def finish(self, ctx: RequestContext, replica: int, outcome: str,
               usage: dict[str, Any] | None = None, predicted_tokens: int = 0,
               model: str | None = None, charge: bool | None = None,
               count: bool = True) -> None:
        """A request attempt ended. ``outcome``: ok, client_error (4xx answer),
        server_error (5xx answer: the request's failure, not the replica's), connect_error
        (never reached it), upstream_error (connection lost after sending), timeout,
        cancelled (the client left). ``charge``: whether a transport failure counts
        against the replica now (default: every one does); the request path passes False
        for a dropped connection, which is charged later (``charge``) only once the same
        request succeeded on another replica (``retries``). ``count``: the attempt is its
        request's end, counted in ``requests_total`` (the request path counts each request
        once itself, ``count_request``)."""
        self.first_byte(ctx, replica)
        up = self.upstreams.get(replica)
        url = (up.name or up.url) if up else "removed"   # (its series were deleted with it)
        if up is not None:
            up.inflight = max(0, up.inflight - 1)
            self.router_for(model).on_finish(ctx, replica)
            if outcome in ("ok", "client_error", "server_error"):
                up.failures = 0
            elif outcome in TRANSPORT_FAILURES and (charge is None or charge):
                self._failure(up)
        mt = self.metrics
        if count:
            mt.child(mt.requests, url, self.policy_for(model), outcome).inc()
        if outcome == "ok":
            mt.child(mt.predicted, url).inc(predicted_tokens)
            if usage:
                details = usage.get("prompt_tokens_details") or {}
                cached = details.get("cached_tokens") if isinstance(details, dict) else 0
                mt.child(mt.observed, url).inc(int(cached or 0))
                mt.child(mt.prompt, url).inc(int(usage.get("prompt_tokens") or 0))

    def count_request(self, replica: int | None, model: str | None, outcome: str) -> None:
        """A request ended: one ``requests_total`` sample, labelled with the replica of its
        last attempt (``none``: it reached no replica, e.g. ``rejected`` by the router or
        ``cancelled`` while its body was read)."""
        if replica is None:
            label = "none"
        else:
            up = self.upstreams.get(replica)
            label = (up.name or up.url) if up else "removed"
        mt = self.metrics
        mt.child(mt.requests, label, self.policy_for(model), outcome).inc()

    def charge(self, replica: int) -> None:
        """A transport failure of ``replica`` confirmed after the fact: the request whose
        connection it dropped was then served by another replica."""
        up = self.upstreams.get(replica)
        if up is not None:
            self._failure(up)

    def retried(self, url: str, reason: str) -> None:
        up = self._by_url.get(url.rstrip("/"))
        self.metrics.retries.labels(up.name if up is not None and up.name else url, reason).inc()

    def rejected(self, reason: str) -> None:
        self.metrics.rejected.labels(reason).inc()

    def _failure(self, up: Upstream) -> None:
        up.failures += 1
        if up.healthy and up.failures >= self.cfg.eject_after_failures:
            up.healthy = False
            up.ejected_once = True
            self.ejections[up.url] = self.ejections.get(up.url, 0) + 1
            self.metrics.ejections.labels(up.name or up.url).inc()
            self.metrics.healthy.labels(up.name or up.url).set(0)
            log.warning("replica ejected after %d transport failures: %s", up.failures, up.url)

    def _success(self, up: Upstream) -> None:
        up.failures = 0
        if not up.healthy:
            up.healthy = True
            self.metrics.healthy.labels(up.name or up.url).set(1)
            self._forget_replica(up.id)          # its cache did not survive the failure
            log.info("replica readmitted (its prefix model reset): %s", up.url)

    # -- introspection --------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        return [{"id": u.id, "url": u.url, "healthy": u.healthy, "inflight": u.inflight,
                 "peer_inflight": u.peer_inflight, "failures": u.failures,
                 "waiting": u.waiting, "running": u.running, "kv_usage": u.kv_usage,
                 "queued_tokens": u.queued_tokens, "host_tier": u.host_tier,
                 "models": list(u.models),
                 "kv_events_applied": self.kv_events_applied}
                for u in self.upstreams.values()]

    def metrics_text(self) -> bytes:
        for u in self.upstreams.values():
            self.metrics.inflight.labels(u.name or u.url).set(u.inflight)
            self.metrics.queued_tokens.labels(u.name or u.url).set(u.queued_tokens)
        return self.metrics.text()


TRANSPORT_FAILURES = ("connect_error", "upstream_error", "timeout")
