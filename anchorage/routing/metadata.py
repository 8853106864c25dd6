"""The request metadata contract (docs/request-metadata.md), as pure functions.

Clients send metadata to the router in any of three spellings; the router forwards one
canonical form to vLLM, and the node agent reads it back from ``SamplingParams.extra_args``:

- session: header ``x-session-id``, else body ``session_id`` (vLLM's own field, kept).
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
