"""The request metadata contract (docs/request-metadata.md), as pure functions.

Clients send metadata to the router in any of three spellings; the router forwards one
canonical form to vLLM, and the node agent reads it back from ``SamplingParams.extra_args``:

- session: header ``x-session-id``, else body ``session_id`` (vLLM's own field, kept), else
  what agent clients already send (``SESSION_SOURCES``, first found): OpenAI's body field
  ``prompt_cache_key`` (the Responses and Chat Completions APIs' cache-routing key; Codex
  sets it to its conversation id), then the agent CLIs' session headers. The router keys
  every session by (tenant, session id), so two tenants with the same id never share one.
- ``vllm_xargs`` values must be scalars or lists of scalars in vLLM 0.32 (a nested dict is
  a 400), so the canonical form is flat: ``vllm_xargs["anchorage.agent"]`` (str),
  ``["anchorage.tool_name"]`` (str), ``["anchorage.tool_args"]`` (str: JSON text),
  ``["anchorage.warmup"]`` (0/1), ``["anchorage.tenant"]`` (str: the router's opaque tenant
  id, never the API key). Accepted on input as well: the nested
  ``vllm_xargs.anchorage = {...}`` and a top-level ``anchorage = {...}``.
- ``cache_salt``: set by the router per tenant (``keys.tenant_salt``); a client's own value
  is replaced so tenants cannot opt into each other's prefixes.

Everything is optional. Bad types raise ``MetadataError`` (a 400 at the edge).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

FIELDS = ("agent", "tool_name", "tool_args", "warmup", "tenant")
PREFIX = "anchorage."

# Where a session id comes from when the client sends none of Anchorage's own (x-session-id,
# body session_id), in this order: (kind, name). What the peers read, as found:
# - OpenAI's ``prompt_cache_key`` request field (Responses / Chat Completions): the key the
#   client groups its cache-sharing requests by; Codex CLI sends its conversation id there.
# - ``x-claude-code-session-id``: sent by Claude Code on every request (NVIDIA Dynamo's
#   "Session IDs" guide, docs.nvidia.com/dynamo, reads it for root turns; llm-d's
#   agent-identity plugin reads it too, per the ecosystem review of llm-d-router v0.9.0
#   behind issue 41).
# - ``session_id`` / ``session-id`` headers: Codex CLI's conversation id (proxies forward
#   both spellings); llm-d's agent-identity plugin reads both (same review).
# - ``x-session-affinity``: OpenCode and pi-ai send it with their session id next to
#   x-session-id (llm-d's agent-identity plugin reads it, same review). llm-d-router's own
#   session-id-producer defaults to ``x-session-id`` (pkg/epp/framework/plugins/
#   requestcontrol/dataproducer/sessionid/README.md at a3b490f), which is Anchorage's.
SESSION_SOURCES = (("body", "prompt_cache_key"), ("header", "x-claude-code-session-id"),
                   ("header", "session_id"), ("header", "session-id"),
                   ("header", "x-session-affinity"))


class MetadataError(ValueError):
    pass


@dataclass(slots=True)
class RequestMeta:
    session_id: str | None = None
    agent: str | None = None
    tool_name: str | None = None
    tool_args: Any = None
    warmup: bool = False
    tenant: str | None = None


def _nested(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    top = body.get("anchorage")
    xargs = body.get("vllm_xargs") or {}
    if not isinstance(xargs, Mapping):
        raise MetadataError("vllm_xargs must be an object")
    for src in (top, xargs.get("anchorage")):
        if src is None:
            continue
        if not isinstance(src, Mapping):
            raise MetadataError("anchorage metadata must be an object")
        out.update(src)
    for k, v in xargs.items():
        if isinstance(k, str) and k.startswith(PREFIX):
            out[k[len(PREFIX):]] = v
    return out


def parse_request(body: Mapping[str, Any], headers: Mapping[str, str]) -> RequestMeta:
    """Metadata from a client request (headers: lower-case names)."""
    raw = _nested(body)
    unknown = set(raw) - set(FIELDS)
    if unknown:
        raise MetadataError(f"unknown anchorage metadata field(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(FIELDS)}")
    sid = headers.get("x-session-id") or body.get("session_id")
    if sid is None or sid == "":
        sid = agent_session(body, headers)
    for name in ("agent", "tool_name"):
        if raw.get(name) is not None and not isinstance(raw[name], str):
            raise MetadataError(f"anchorage.{name} must be a string")
    if sid is not None and not isinstance(sid, (str, int)):
        raise MetadataError("session_id must be a string")
    warmup = raw.get("warmup", False)
    # a flag: true/false, or the canonical form's 0/1 (vllm_xargs carries no booleans);
    # "yes", "false" or 2 are refused rather than read by truthiness
    if warmup is not None and not (isinstance(warmup, bool) or (type(warmup) is int
                                                               and warmup in (0, 1))):
        raise MetadataError("anchorage.warmup must be a boolean (true or false)")
    args = raw.get("tool_args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return RequestMeta(session_id=None if sid is None else str(sid), agent=raw.get("agent"),
                       tool_name=raw.get("tool_name"), tool_args=args,
                       warmup=bool(warmup))


def agent_session(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The session id an agent client sends its own way (``SESSION_SOURCES``), or None."""
    for kind, name in SESSION_SOURCES:
        v = body.get(name) if kind == "body" else headers.get(name)
        if v is None or v == "":
            continue
        if not isinstance(v, str):
            raise MetadataError(f"{name} must be a string")
        return v
    return None


def to_vllm_body(body: dict[str, Any], meta: RequestMeta, cache_salt: str | None) -> dict[str, Any]:
    """The body forwarded to vLLM: canonical flat xargs, session_id, cache_salt."""
    out = {k: v for k, v in body.items() if k != "anchorage"}
    xargs = {k: v for k, v in (body.get("vllm_xargs") or {}).items()
             if k != "anchorage" and not str(k).startswith(PREFIX)}
    if meta.agent is not None:
        xargs[PREFIX + "agent"] = meta.agent
    if meta.tool_name is not None:
        xargs[PREFIX + "tool_name"] = meta.tool_name
    if meta.tool_args is not None:
        xargs[PREFIX + "tool_args"] = json.dumps(meta.tool_args, sort_keys=True)
    if meta.warmup:
        xargs[PREFIX + "warmup"] = 1
    if meta.tenant is not None:
        xargs[PREFIX + "tenant"] = meta.tenant
    if xargs:
        out["vllm_xargs"] = xargs
    else:
        out.pop("vllm_xargs", None)
    if meta.session_id is not None:
        out["session_id"] = meta.session_id
    if cache_salt is not None:
        out["cache_salt"] = cache_salt
    else:
        out.pop("cache_salt", None)
    return out


def from_extra_args(extra_args: Mapping[str, Any] | None, session_id: str | None = None) -> RequestMeta:
    """Inside the engine (node agent): read the canonical form back."""
    x = extra_args or {}
    args = x.get(PREFIX + "tool_args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    return RequestMeta(session_id=session_id, agent=x.get(PREFIX + "agent"),
                       tool_name=x.get(PREFIX + "tool_name"), tool_args=args,
                       warmup=bool(x.get(PREFIX + "warmup", 0)), tenant=x.get(PREFIX + "tenant"))
