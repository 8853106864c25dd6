"""EPP mode: the router's decision behind any Envoy-based gateway, as the Gateway API
Inference Extension's endpoint picker (``anchorage router --mode epp``).

The gateway (Envoy, Istio, kgateway, Envoy AI Gateway, GKE) calls
``envoy.service.ext_proc.v3.ExternalProcessor/Process`` once per HTTP request, a
bidirectional stream. The protocol followed is the Inference Extension's endpoint-picker
protocol v1.0.0 (gateway-api-inference-extension ``docs/proposals/004-endpoint-picker-
protocol/README.md``; the stream handling as llm-d-router's ``pkg/epp/handlers/server.go``
and the reference ``pkg/lwepp/handlers``), with the processing mode those gateways
configure (``request_header_mode: SEND``, ``response_header_mode: SEND``,
``request_body_mode`` and ``response_body_mode: FULL_DUPLEX_STREAMED``, trailers SEND):

1. request headers: kept; answered after the body (the decision needs it);
2. request body chunks until ``end_of_stream`` (or the request trailers), at most
   ``max_body_bytes`` (413). Then the router's own pipeline, unchanged: ``limits``
   (header bytes), ``parsing.parse``, ``keys.request_keys``, ``RoutingState.pick`` (the
   same ``anchorage.routing`` object, admission and accounting as the Ray Serve router);
3. the answer to the request headers: ``x-gateway-destination-endpoint: ip:port[,ip:port]``
   (the pick, then ``fallback.rank_fallbacks``' ranked fallbacks) in a header mutation
   and, the same value, in dynamic metadata ``envoy.lb``; ``clear_route_cache``; the new
   ``content-length``; then the body the router would have sent (``core.forward_body``:
   the canonical ``session_id``, ``cache_salt``, ``vllm_xargs``) as ``streamed_response``
   chunks of at most 62,000 bytes (llm-d's ``BodyByteLimit``);
4. the subset hint ``metadata_context.filter_metadata["envoy.lb.subset_hint"]
   ["x-gateway-destination-endpoint-subset"]`` (a list or a comma string of ``ip:port``
   or ``ip``): only those replicas are eligible; none of them eligible is a 503;
5. errors are ``ImmediateResponse``s with the router's OpenAI error bodies: 400
   (malformed), 404 (unknown model, unknown path), 413, 429 (every replica of the model
   at ``max_inflight_per_replica``; ``retry-after``), 431, 503 (no eligible endpoint);
6. response headers: ``filter_metadata["envoy.lb"]["x-gateway-destination-endpoint-served"]``
   (or a response header of that name, or the ``upstream.address`` attribute a plain Envoy
   sends with ``response_attributes``) says which endpoint served it; when the gateway
   fell back, the attempt is moved there (the picked replica's is a ``connect_error``,
   as the proxy counts a connect failure). Response body chunks are echoed unchanged;
   the first one is the replica's first byte, the last one (or the trailers) ends the
   attempt (``finish``: outcome from ``:status``, ``usage`` from the JSON body or the
   SSE stream's usage chunk). A stream that ends before that is ``cancelled``.

Health: ``grpc.health.v1.Health`` on the same server (and ``health_port``): ``liveness``
is SERVING while the process runs; ``readiness``, ``""`` and
``envoy.service.ext_proc.v3.ExternalProcessor`` are SERVING once the endpoints are known
(static list, or the InferencePool read) and, with leader election, only on the leader.
Several pickers: the Lease elects the leader (``lease``); with ``peers``/``peer_selector``
the leader's decisions reach the followers (``epp_peers``), so a take-over routes warm.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable
from urllib.parse import urlsplit

from anchorage.policies.base import RequestContext
from anchorage.routing.fallback import rank_fallbacks
from anchorage.router import errors, fastjson, limits, parsing
from anchorage.router.config import RouterConfig
from anchorage.router.core import RouterCore, forward_body
from anchorage.router.errors import RouterError
from anchorage.router.keys import request_keys
from anchorage.router.relay import usage_from_sse

log = logging.getLogger("anchorage.router.epp")

ENDPOINT_KEY = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
BODY_CHUNK = 62000          # llm-d's BodyByteLimit: one streamed_response chunk at most
USAGE_BODY_CAP = 1 << 20    # non-streamed answers: bytes kept to read usage from
UNROUTED = errors.error_body("no such endpoint", "invalid_request_error", "not_found")


@dataclass
class EppConfig:
    """The endpoint picker's own settings (the routing ones are a ``RouterConfig``)."""
    host: str = "127.0.0.1"
    port: int = 9002                    # ext_proc (and health)
    health_port: int = 0                # also serve grpc.health.v1 here (0: no)
    metrics_port: int = 0               # HTTP /metrics (0: none)
    fallbacks: int = 2                  # ranked fallbacks after the pick
    # discovery: "static" (RouterConfig.replicas) or "inferencepool"
    pool_name: str = ""
    pool_namespace: str = "default"
    leader_election: bool = False
    lease_name: str = ""                # default: <pool_name>-epp
    lease_duration_s: float = 15.0
    lease_renew_s: float = 2.0
    identity: str = ""                  # default: $POD_NAME, else the host name
    # TLS on the ext_proc port (the Inference Extension's pickers serve TLS by default and
    # gateways connect without verifying): a certificate from files, else self-signed at
    # start. The health port stays plaintext (the kubelet's gRPC probes have no TLS).
    tls: bool = False
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # decision sharing (epp_peers): the leader sends its decisions to the followers'
    # HTTP port (metrics_port): static URLs and/or the label selector of the pickers' pods
    peers: list[str] = field(default_factory=list)
    peer_selector: str = ""
    peer_port: int = 0                  # default: metrics_port
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> "EppConfig":
        for name in ("port",):
            if not 0 < getattr(self, name) < 65536:
                raise ValueError(f"{name} must be a port number")
        for name in ("health_port", "metrics_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be a port number or 0")
        if self.fallbacks < 0:
            raise ValueError("fallbacks must be >= 0")
        if self.leader_election and not self.pool_name:
            raise ValueError("leader election needs the InferencePool (pool_name): "
                             "the Lease lives beside it")
        if self.lease_duration_s <= self.lease_renew_s or self.lease_renew_s <= 0:
            raise ValueError("lease_duration_s must exceed lease_renew_s > 0")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_cert_file and not self.tls:
            raise ValueError("a TLS certificate needs tls on")
        if self.tls and self.health_port == self.port:
            raise ValueError("the health port must differ from the TLS ext_proc port")
        if self.peers or self.peer_selector:
            if not self.leader_election:
                raise ValueError("sharing decisions (peers / peer_selector) is between a "
                                 "leader and its followers: it needs leader election")
            if not self.metrics_port:
                raise ValueError("sharing decisions needs metrics_port (the followers "
                                 "receive them on that HTTP port)")
        for u in self.peers:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"peer URL must start with http:// or https://: {u!r}")
        if self.extra:
            raise ValueError(f"unknown EPP setting(s): {', '.join(sorted(self.extra))}")
        return self


def hostport(url: str) -> str:
    """``http://10.0.0.5:8000`` -> ``10.0.0.5:8000`` (the protocol's endpoint form)."""
    return urlsplit(url).netloc


def parse_subset(value: Any) -> list[str] | None:
    """The subset hint's value (a list of strings, or one comma string) as a list."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out = []
    for it in items:
        if isinstance(it, str):
            out.extend(s.strip() for s in it.split(",") if s.strip())
    return out


def _struct_value(v) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "list_value":
        return [_struct_value(x) for x in v.list_value.values]
    if kind == "struct_value":
        return {k: _struct_value(x) for k, x in v.struct_value.fields.items()}
    if kind == "number_value":
        return v.number_value
    if kind == "bool_value":
        return v.bool_value
    return None


def metadata_value(req, namespace: str, key: str) -> Any:
    """``req.metadata_context.filter_metadata[namespace][key]`` as plain Python, or None."""
    md = req.metadata_context.filter_metadata if req.HasField("metadata_context") else None
    if not md or namespace not in md:
        return None
    f = md[namespace].fields
    return _struct_value(f[key]) if key in f else None


def attribute(req, name: str) -> Any:
    """An attribute Envoy sends with ``response_attributes`` (e.g. ``upstream.address``),
    from any filter's attribute struct."""
    for st in req.attributes.values():
        if name in st.fields:
            return _struct_value(st.fields[name])
    return None


def header_dict(header_map) -> dict[str, str]:
    out = {}
    for h in header_map.headers:
        v = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out[h.key.lower()] = v
    return out


class _Proto:
    """The generated messages, imported once (grpcio + xds-protos: the [router] extra)."""

    def __init__(self) -> None:
        from google.protobuf import struct_pb2
        from envoy.config.core.v3 import base_pb2
        from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
        from envoy.type.v3 import http_status_pb2

        self.ep, self.base, self.struct, self.status = ep, base_pb2, struct_pb2, http_status_pb2
        self.OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

    def header(self, key: str, value: str):
        b = self.base
        return b.HeaderValueOption(header=b.HeaderValue(key=key, raw_value=value.encode()),
                                   append_action=self.OVERWRITE)

    def route(self, endpoint: str, content_length: int | None, extra: dict[str, str],
              remove: Iterable[str]):
        ep = self.ep
        sets = [self.header(ENDPOINT_KEY, endpoint)]
        if content_length is not None:
            sets.append(self.header("content-length", str(content_length)))
        sets.extend(self.header(k, v) for k, v in extra.items())
        md = self.struct.Struct()
        md.fields[LB_NAMESPACE].struct_value.fields[ENDPOINT_KEY].string_value = endpoint
        return ep.ProcessingResponse(
            request_headers=ep.HeadersResponse(response=ep.CommonResponse(
                clear_route_cache=True,
                header_mutation=ep.HeaderMutation(set_headers=sets,
                                                  remove_headers=list(remove)))),
            dynamic_metadata=md)

    def body_chunks(self, body: bytes, end: bool, response: bool) -> list:
        ep = self.ep
        parts = [body[i:i + BODY_CHUNK] for i in range(0, len(body), BODY_CHUNK)] or [b""]
        out = []
        for n, part in enumerate(parts):
            common = ep.CommonResponse(body_mutation=ep.BodyMutation(
                streamed_response=ep.StreamedBodyResponse(
                    body=part, end_of_stream=end and n == len(parts) - 1)))
            br = ep.BodyResponse(response=common)
            out.append(ep.ProcessingResponse(response_body=br) if response
                       else ep.ProcessingResponse(request_body=br))
        return out

    def immediate(self, exc: RouterError):
        ep = self.ep
        sets = [self.header("content-type", "application/json")]
        sets.extend(self.header(k, v) for k, v in exc.headers.items())
        return ep.ProcessingResponse(immediate_response=ep.ImmediateResponse(
            status=self.status.HttpStatus(code=exc.status),
            headers=ep.HeaderMutation(set_headers=sets), body=exc.body(),
            details=f"anchorage_{exc.code}"))


class EndpointPicker:
    """The decisions and accounting behind the stream (one per process): a
    ``RouterCore`` (the Ray Serve router's state, tokenizer, background work) and the
    protocol's framing."""

    def __init__(self, cfg: RouterConfig, epp: EppConfig | None = None) -> None:
        self.cfg = cfg
        self.epp = epp or EppConfig()
        self.core = RouterCore(cfg)
        self.state = self.core.state
        self.pb = _Proto()
        self._ids = itertools.count()
        self._auth = ({"authorization": f"Bearer {cfg.upstream_api_key}"}
                      if cfg.upstream_api_key else {})
        self.streams = 0

    # -- decisions ----------------------------------------------------------------------
    def eligible(self, subset: list[str] | None):
        """Healthy upstreams, within the subset hint when there is one."""
        ups = [u for u in self.state.upstreams.values() if u.healthy]
        if subset is None:
            return ups
        want = set(subset)
        return [u for u in ups if hostport(u.url) in want or urlsplit(u.url).hostname in want]

    def decide(self, headers: dict[str, str], raw: bytes, subset: list[str] | None) -> "Attempt":
        """The pipeline on a whole request; raises RouterError (an immediate response)."""
        cfg = self.cfg
        limits.check_headers(((k.encode(), v.encode()) for k, v in headers.items()
                              if not k.startswith(":")), cfg)
        path = headers.get(":path", "/").split("?", 1)[0]
        method = headers.get(":method", "POST")
        if method != "POST" or path not in parsing.ROUTED:
            return self.passthrough(path, method, raw, subset)
        p = parsing.parse(path, raw, headers, cfg)
        keys, in_len, tpk = request_keys(p, cfg, self.core.tokenizer)
        m = p.meta
        ctx = RequestContext(request_id=next(self._ids), keys=keys, input_length=in_len,
                             now_s=time.monotonic(), session_id=m.session_id,
                             tenant=m.tenant, tool_name=m.tool_name, tool_args=m.tool_args,
                             agent_hint=m.agent, warmup=m.warmup)
        allowed = self.eligible(subset)
        if subset is not None and not allowed:
            raise errors.unavailable("no endpoint of the gateway's subset hint is eligible")
        allowed_ids = {u.id for u in allowed}
        exclude = [i for i in self.state.upstreams if i not in allowed_ids]
        d = self.state.pick(ctx, exclude, tpk, p.model, self.core.pinned(p))
        if d["status"] == "saturated":
            raise errors.saturated(d["retry_after_s"])
        if d["status"] == "no_model":
            raise errors.model_not_found(p.model or "")
        if d["status"] != "ok":
            raise errors.unavailable("no healthy replica could serve the request")
        rid = d["replica"]
        order = [rid] + self.fallbacks(ctx, tpk, p.model, allowed, rid)
        return Attempt(self, ctx, p, rid, order, forward_body(p), d["predicted_tokens"], tpk)

    def fallbacks(self, ctx: RequestContext, tpk: float, model: str | None, allowed,
                  chosen: int) -> list[int]:
        k = self.epp.fallbacks
        if k <= 0:
            return []
        known = self.state._models
        ups = [u for u in allowed if u.id != chosen
               and (not model or not known or model in u.models)]
        if not ups:
            return []
        router = self.state.router_for(model)
        views = self.state._views(ups)     # the same load view the pick saw
        matched = {u.id: router.predicted_hit_blocks(ctx, u.id) for u in ups}
        return rank_fallbacks(views, matched, tpk, (), k)

    def passthrough(self, path: str, method: str, raw: bytes, subset) -> "Attempt":
        """A request the router does not route (e.g. ``GET /v1/models``, embeddings): the
        least-loaded eligible replica, no policy, no accounting."""
        ups = self.eligible(subset)
        if not ups:
            raise errors.unavailable("no healthy replica")
        views = self.state._views(ups)
        # every replica at max_inflight_per_replica: still one (no accounting here)
        order = rank_fallbacks(views, {}, 1.0, (), len(ups)) or [u.id for u in ups]
        return Attempt(self, None, None, order[0], order[:1 + self.epp.fallbacks], raw, 0)

    def url_of(self, rid: int) -> str | None:
        up = self.state.upstreams.get(rid)
        return up.url if up is not None else None

    def id_of(self, endpoint: str) -> int | None:
        for u in self.state.upstreams.values():
            if hostport(u.url) == endpoint:
                return u.id
        return None


class Attempt:
    """One routed request, from the pick to its end (exactly one ``finish``)."""

    def __init__(self, epp: EndpointPicker, ctx, parsed, rid: int, order: list[int],
                 body: bytes | None, predicted: int, tokens_per_key: float = 1.0) -> None:
        self.epp, self.ctx, self.p, self.rid = epp, ctx, parsed, rid
        self.tpk = tokens_per_key
        self.endpoint = ",".join(hostport(epp.url_of(i)) for i in order)
        self.body, self.predicted = body, predicted
        self.accounted = ctx is not None     # pick() counted it in flight at rid
        self.status = 0
        self.first = True
        self.tail = b""
        self.kept: list[bytes] = []
        self.kept_bytes = 0
        self.sse = False

    @property
    def model(self):
        return self.p.model if self.p is not None else None

    def served(self, endpoint: str | None) -> None:
        """The gateway reports the endpoint that answered: move the attempt there if it
        fell back, as the proxy's retry after a connect error does (the picked replica's
        attempt ends as a ``connect_error``; the policy picks again among the one replica
        that served, so a session follows it)."""
        if not self.accounted or not endpoint:
            return
        endpoint = endpoint.split(",")[0].strip()
        url = self.epp.url_of(self.rid)
        if url is not None and hostport(url) == endpoint:
            return
        st = self.epp.state
        other = self.epp.id_of(endpoint)
        st.finish(self.ctx, self.rid, "connect_error", None, 0, self.model)
        st.retried(url or "removed", "connect")
        if other is None:
            self.accounted = False
            return
        d = st.pick(self.ctx, [i for i in st.upstreams if i != other], self.tpk, self.model)
        if d.get("status") == "ok":
            self.rid, self.predicted = d["replica"], d["predicted_tokens"]
        else:
            self.accounted = False

    def response_chunk(self, chunk: bytes) -> None:
        if chunk and self.first:
            self.first = False
            if self.accounted:
                self.epp.state.first_byte(self.ctx, self.rid)
        if self.sse:
            self.tail = (self.tail + chunk)[-8192:]
        elif self.kept_bytes < USAGE_BODY_CAP:
            self.kept.append(chunk)
            self.kept_bytes += len(chunk)

    def finish(self, outcome: str | None = None) -> None:
        if not self.accounted:
            return
        self.accounted = False
        st = self.epp.state
        usage = None
        if outcome is None:
            s = self.status or 200
            outcome = "ok" if s < 400 else "client_error" if s < 500 else "server_error"
            if outcome == "ok":
                usage, rid_ = self.usage()
                if rid_ is not None and self.p is not None and self.p.path == "/v1/responses":
                    self.epp.core.remember_response(rid_, self.epp.url_of(self.rid) or "")
        st.finish(self.ctx, self.rid, outcome, usage, self.predicted, self.model)

    def usage(self):
        if self.sse:
            return usage_from_sse(self.tail), None
        body = b"".join(self.kept)
        if b'"usage"' not in body and b'"id"' not in body:
            return None, None
        try:
            u, rid = fastjson.usage_and_id(body)
        except (ValueError, RecursionError):
            return None, None
        return (u if isinstance(u, dict) else None), rid


class Stream:
    """One ext_proc stream (one HTTP request through the gateway)."""

    def __init__(self, epp: EndpointPicker) -> None:
        self.epp, self.pb = epp, epp.pb
        self.headers: dict[str, str] = {}
        self.subset: list[str] | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.attempt: Attempt | None = None
        self.decided = False
        self.done = False

    def on_message(self, req) -> list:
        kind = req.WhichOneof("request")
        if req.HasField("protocol_config"):
            _check_mode(req.protocol_config)
        if kind == "request_headers":
            self.headers = header_dict(req.request_headers.headers)
            self.subset = parse_subset(metadata_value(req, SUBSET_NAMESPACE, SUBSET_KEY))
            if req.request_headers.end_of_stream:        # no body (a GET)
                return self._decide(with_body=False)
            return []
        if kind == "request_body":
            if self.decided:
                return []
            b = req.request_body.body
            self.size += len(b)
            if self.size > self.epp.cfg.max_body_bytes:
                return self._reject(RouterError(
                    413, f"request body exceeds {self.epp.cfg.max_body_bytes} bytes",
                    code="request_too_large", reason="request_too_large"))
            self.parts.append(b)
            if req.request_body.end_of_stream:
                return self._decide(with_body=True)
            return []
        if kind == "request_trailers":
            out = [] if self.decided else self._decide(with_body=True, trailers=True)
            return out + [self.pb.ep.ProcessingResponse(
                request_trailers=self.pb.ep.TrailersResponse())]
        if kind == "response_headers":
            return self._response_headers(req)
        if kind == "response_body":
            rb = req.response_body
            a = self.attempt
            if a is not None:
                a.response_chunk(rb.body)
                if rb.end_of_stream:
                    a.finish()
            return self.pb.body_chunks(rb.body, rb.end_of_stream, response=True)
        if kind == "response_trailers":
            if self.attempt is not None:
                self.attempt.finish()
            return [self.pb.ep.ProcessingResponse(
                response_trailers=self.pb.ep.TrailersResponse())]
        return []

    def _reject(self, exc: RouterError) -> list:
        if exc.reason:
            self.epp.state.rejected(exc.reason)
        self.done = True
        return [self.pb.immediate(exc)]

    def _decide(self, with_body: bool, trailers: bool = False) -> list:
        self.decided = True
        raw = b"".join(self.parts)
        self.parts = []
        try:
            a = self.epp.decide(self.headers, raw, self.subset)
        except RouterError as exc:
            return self._reject(exc)
        except Exception:  # noqa: BLE001 - the client gets an error object, the log the rest
            log.exception("unexpected error picking an endpoint")
            return self._reject(RouterError(500, "internal router error", "internal_error",
                                            "internal_error", reason=None))
        self.attempt = a
        body = a.body if with_body else None
        remove = ["x-anchorage-internal"]
        out = [self.pb.route(a.endpoint, len(body) if body is not None else None,
                             self.epp._auth, remove)]
        if body is not None:
            out.extend(self.pb.body_chunks(body, not trailers, response=False))
        return out

    def _response_headers(self, req) -> list:
        a = self.attempt
        if a is not None:
            h = header_dict(req.response_headers.headers)
            try:
                a.status = int(h.get(":status", "200"))
            except ValueError:
                a.status = 502
            a.sse = "text/event-stream" in h.get("content-type", "")
            served = (metadata_value(req, LB_NAMESPACE, SERVED_KEY) or h.get(SERVED_KEY)
                      or attribute(req, "upstream.address"))
            a.served(served if isinstance(served, str) else None)
            if req.response_headers.end_of_stream:
                a.finish()
        return [self.pb.ep.ProcessingResponse(
            response_headers=self.pb.ep.HeadersResponse(response=self.pb.ep.CommonResponse()))]

    def close(self) -> None:
        """The stream ended: an attempt still open was cancelled (the client or the
        gateway left before the response ended)."""
        if self.attempt is not None:
            self.attempt.finish("cancelled")


_FULL_DUPLEX = 4          # ProcessingMode.FULL_DUPLEX_STREAMED
_warned_mode = False


def _check_mode(pc) -> None:
    """The picker answers the request headers after the whole body, which only the
    ``FULL_DUPLEX_STREAMED`` body mode allows (in the other modes Envoy waits for that
    answer before it sends the body): say so once, loudly, when a gateway uses another."""
    global _warned_mode
    if pc.request_body_mode != _FULL_DUPLEX and not _warned_mode:
        _warned_mode = True
        log.error("the gateway sends request bodies in mode %d; the endpoint picker needs "
                  "FULL_DUPLEX_STREAMED (processing_mode.request_body_mode), as the "
                  "Inference Extension configures it", pc.request_body_mode)


# -- hosting --------------------------------------------------------------------------
class Readiness:
    """Health of the EPP (``grpc.health.v1``): liveness always; readiness when the
    endpoints are known (``synced``) and this replica leads (or no election)."""

    SERVICES = ("", "readiness", EXT_PROC_SERVICE)

    def __init__(self, servicer, leader_election: bool) -> None:
        from grpc_health.v1 import health_pb2
        self.servicer, self.pb = servicer, health_pb2
        self.synced = False
        self.leader = not leader_election
        servicer.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        self._apply()

    def set_synced(self, ok: bool = True) -> None:
        self.synced = ok
        self._apply()

    def set_leader(self, leader: bool) -> None:
        if leader != self.leader:
            log.info("leader election: %s", "leading" if leader else "following")
        self.leader = leader
        self._apply()

    @property
    def ready(self) -> bool:
        return self.synced and self.leader

    def _apply(self) -> None:
        s = self.pb.HealthCheckResponse
        status = s.SERVING if self.ready else s.NOT_SERVING
        for name in self.SERVICES:
            self.servicer.set(name, status)


def make_servicer(epp: EndpointPicker):
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as epg

    class ExternalProcessor(epg.ExternalProcessorServicer):
        async def Process(self, request_iterator, context):
            st = Stream(epp)
            epp.streams += 1
            try:
                async for req in request_iterator:
                    for resp in st.on_message(req):
                        yield resp
                    if st.done:
                        return
            finally:
                st.close()
    return ExternalProcessor()


class EppServer:
    """The gRPC server (ext_proc + health), the router's background work, discovery,
    leader election and the metrics listener, in one event loop."""

    def __init__(self, cfg: RouterConfig, epp: EppConfig, pool_api=None, lease_api=None) -> None:
        """``pool_api``/``lease_api``: the Kubernetes adapters (``pool.KubePoolAPI``,
        ``lease.KubeLeaseAPI`` when None: in cluster or the kubeconfig)."""
        self.cfg, self.epp_cfg = cfg, epp
        self._pool_api, self._lease_api = pool_api, lease_api
        self.picker = EndpointPicker(cfg, epp)
        self.server = None
        self.ports: dict[str, int] = {}
        self.readiness: Readiness | None = None
        self._threads: list = []
        self._metrics_runner = None
        self.share = None
        self._tasks: list = []

    async def start(self) -> "EppServer":
        import grpc
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as epg
        from grpc_health.v1 import health, health_pb2_grpc

        e = self.epp_cfg
        opts = [("grpc.max_receive_message_length", 16 << 20),
                ("grpc.max_send_message_length", 16 << 20)]
        self.server = grpc.aio.server(options=opts)
        epg.add_ExternalProcessorServicer_to_server(make_servicer(self.picker), self.server)
        hs = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(hs, self.server)
        self.readiness = Readiness(_SyncSetter(hs), e.leader_election)
        addr = f"{_host(e.host)}:{e.port}"
        if e.tls:
            key, cert = load_or_make_cert(e.tls_cert_file, e.tls_key_file)
            self.ports["grpc"] = self.server.add_secure_port(
                addr, grpc.ssl_server_credentials([(key, cert)]))
        else:
            self.ports["grpc"] = self.server.add_insecure_port(addr)
        if e.health_port:
            self.ports["health"] = self.server.add_insecure_port(f"{_host(e.host)}:{e.health_port}")
        await self.server.start()
        await self.picker.core.start(None)
        loop = asyncio.get_running_loop()
        if e.pool_name:
            self._start_pool(loop)
        else:
            self.readiness.set_synced(bool(self.cfg.replicas))
        if e.leader_election:
            self._start_election(loop)
        if e.peers or e.peer_selector:
            self._start_sharing(loop)
        if e.metrics_port:
            await self._start_metrics()
        return self

    def _start_sharing(self, loop) -> None:
        from anchorage.router.epp_peers import DecisionShare
        if not self.cfg.trusted_token:
            raise ValueError("sharing decisions between pickers needs the internal token "
                             "(ANCHORAGE_INTERNAL_TOKEN)")
        e = self.epp_cfg
        self.share = DecisionShare(self.picker.state, self.picker.core.session,
                                   self.cfg.trusted_token, self.cfg.sync_interval_s,
                                   lambda: self.readiness.leader, e.peers)
        self._tasks.append(loop.create_task(self.share.push_loop()))
        if e.peer_selector:
            import threading

            from anchorage.router.epp_peers import PeerPods
            from anchorage.router.pool import KubePoolAPI
            static = list(e.peers)

            def changed(urls):
                loop.call_soon_threadsafe(setattr, self.share, "peers",
                                          sorted(set(static) | set(urls)))
            pp = PeerPods(self._pool_api or KubePoolAPI(), e.pool_namespace, e.peer_selector,
                          e.peer_port or e.metrics_port, os.environ.get("POD_IP", ""), changed)
            threading.Thread(target=pp.run, daemon=True).start()
            self._threads.append(pp)

    def _start_pool(self, loop) -> None:
        import threading

        from anchorage.router.pool import KubePoolAPI, PoolSource
        e = self.epp_cfg
        src = PoolSource(self._pool_api or KubePoolAPI(), e.pool_namespace, e.pool_name)

        def changed(urls, names):
            loop.call_soon_threadsafe(self._apply_pool, urls, names)
        t = threading.Thread(target=src.watch, args=(changed,), daemon=True)
        t.start()
        self._threads.append(src)

    def _apply_pool(self, urls, names) -> None:
        self.picker.core._apply_urls(urls, names)
        self.readiness.set_synced(True)

    def _start_election(self, loop) -> None:
        import threading

        from anchorage.router.lease import KubeLeaseAPI, LeaseElector
        e = self.epp_cfg
        me = e.identity or os.environ.get("POD_NAME") or socket.gethostname()
        el = LeaseElector(self._lease_api or KubeLeaseAPI(), e.pool_namespace,
                          e.lease_name or f"{e.pool_name}-epp",
                          me, e.lease_duration_s, e.lease_renew_s,
                          lambda lead: loop.call_soon_threadsafe(self.readiness.set_leader, lead))
        threading.Thread(target=el.run, daemon=True).start()
        self._threads.append(el)

    async def _start_metrics(self) -> None:
        from aiohttp import web

        async def metrics(_req):
            return web.Response(body=self.picker.state.metrics_text(),
                                content_type="text/plain", charset="utf-8")
        app = web.Application(client_max_size=32 << 20)
        app.router.add_get("/metrics", metrics)
        if self.share is not None:
            from anchorage.router.pods import PATH
            app.router.add_post(PATH, self.share.receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.epp_cfg.host, self.epp_cfg.metrics_port)
        await site.start()
        self._metrics_runner = runner
        self.ports["metrics"] = site._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float = 2.0) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._threads:
            t.stop()
        if self.server is not None:
            await self.server.stop(grace_s)
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        await self.picker.core.stop()


class _SyncSetter:
    """``set(service, status)`` on the sync or the asyncio health servicer (whose ``set``
    is a coroutine) from plain code on the event loop."""

    def __init__(self, hs) -> None:
        self.hs = hs

    def set(self, service: str, status) -> None:
        r = self.hs.set(service, status)
        if asyncio.iscoroutine(r):
            asyncio.ensure_future(r)


def load_or_make_cert(cert_file: str, key_file: str) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM): from the files, else a self-signed P-256 certificate
    valid for a year (the gateway does not verify the picker's identity; the connection is
    encrypted)."""
    if cert_file:
        with open(key_file, "rb") as k, open(cert_file, "rb") as c:
            return k.read(), c.read()
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "anchorage-epp")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("anchorage-epp")]), False)
            .sign(key, hashes.SHA256()))
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
            cert.public_bytes(serialization.Encoding.PEM))


def _host(h: str) -> str:
    return f"[{h}]" if ":" in h and not h.startswith("[") else h


def serve(cfg: RouterConfig, epp: EppConfig, on_ready=None) -> None:
    """Run the EPP until SIGTERM/SIGINT (``anchorage router --mode epp``)."""
    import signal

    async def main() -> None:
        srv = await EppServer(cfg, epp).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"anchorage endpoint picker listening on {epp.host}:{srv.ports['grpc']} "
              f"(ext_proc{', TLS' if epp.tls else ''}, gRPC health)"
              + (f", health :{srv.ports['health']}" if "health" in srv.ports else "")
              + (f", metrics :{srv.ports['metrics']}" if "metrics" in srv.ports else ""),
              file=sys.stderr, flush=True)
        if on_ready is not None:
            on_ready(srv)
        await stop.wait()
        await srv.stop()
    asyncio.run(main())
