"""JSON on the request path, parsed and written once per request.

``loads(bytes)`` / ``dumps(obj) -> bytes`` use ``msgspec`` when it is installed (it is
wherever vLLM is; about 40x faster than the standard library here), else ``orjson``, else
the standard library. Semantics the router relies on are the same for each: the last of
duplicate keys wins (as in vLLM's own parser, so what the router validates is what the
engine reads), deep nesting raises ``RecursionError`` or ``ValueError``, bad input
raises ``ValueError``. ``usage_and_id(content)`` reads only ``usage`` and ``id`` of an
answer (msgspec skips the rest without building it). ``extend_object(raw, extra)``
appends keys to an object's raw text without re-encoding it.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import msgspec

    _dec = msgspec.json.Decoder()
    _enc = msgspec.json.Encoder()
    loads = _dec.decode
    dumps = _enc.encode

    class _UsageId(msgspec.Struct):
        usage: Any = None
        id: Any = None

    _usage_dec = msgspec.json.Decoder(_UsageId)

    def usage_and_id(content: bytes) -> tuple[Any, Any]:
        try:
            u = _usage_dec.decode(content)
        except (msgspec.DecodeError, RecursionError):   # ValidationError: not an object
            return None, None
        return u.usage, u.id
    BACKEND = "msgspec"
except ImportError:  # pragma: no cover - depends on the install
    try:
        import orjson

        loads = orjson.loads
        dumps = orjson.dumps
        BACKEND = "orjson"
    except ImportError:
        loads = json.loads

        def dumps(obj: Any) -> bytes:
            return json.dumps(obj, separators=(",", ":")).encode()
        BACKEND = "json"

    def usage_and_id(content: bytes) -> tuple[Any, Any]:
        try:
            d = loads(content)
        except (ValueError, RecursionError):
            return None, None
        return (d.get("usage"), d.get("id")) if isinstance(d, dict) else (None, None)


def extend_object(raw: bytes, extra: dict[str, Any]) -> bytes | None:
    """``raw`` (the text of a non-empty JSON object that has none of ``extra``'s keys)
    with ``extra``'s keys appended; None when ``raw`` does not end as an object does."""
    if not extra:
        return raw
    r = raw.rstrip()
    if not r.endswith(b"}"):
        return None
    return r[:-1] + b"," + dumps(extra)[1:]
