"""Step 2 of a request: parse and validate the body (after ``limits``).

``parse(path, raw, headers, cfg)`` -> ``Parsed``: the JSON object, the request metadata
(docs/request-metadata.md), the tenant (a keyed hash of the API key; the key itself is
never stored), its cache salt, the requested model and whether the answer streams.
Warm-up marking is honoured only from trusted callers (the node-agent sidecar, with the
``x-anchorage-internal`` token the router is configured with); a client's own mark is
dropped, so no client can disguise its requests as warm-ups. Bad input raises
``RouterError`` (400) with a message naming the field.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any, Mapping

from anchorage.routing.keys import tenant_salt
from anchorage.routing.metadata import MetadataError, RequestMeta, parse_request
from anchorage.router import fastjson, limits
from anchorage.router.config import RouterConfig
from anchorage.router.errors import bad_request

# endpoint -> the body field its prompt is in ("" for none)
ROUTED = {"/v1/completions": "prompt", "/v1/chat/completions": "messages",
          "/v1/responses": "input", "/tokenize": "prompt", "/detokenize": "tokens"}


@dataclass(slots=True)
class Parsed:
    raw: bytes                       # the body as received
    path: str
    body: dict[str, Any]
    meta: RequestMeta
    model: str | None
    stream: bool
    salt: str | None


def tenant_of(headers: Mapping[str, str], secret: str) -> str | None:
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if not key:
        return None
    return "t-" + hashlib.blake2b(key.encode(), key=secret.encode()[:64], digest_size=8).hexdigest()


def trusted(headers: Mapping[str, str], token: str) -> bool:
    given = headers.get("x-anchorage-internal", "")
    return bool(token) and hmac.compare_digest(given.encode(), token.encode())


def parse(path: str, raw: bytes, headers: Mapping[str, str], cfg: RouterConfig) -> Parsed:
    try:
        body = fastjson.loads(raw)
    except RecursionError:
        raise bad_request(f"request JSON is nested deeper than {cfg.max_json_depth} levels",
                          code="too_deep") from None
    except ValueError:
        raise bad_request("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    if limits.check_depth_raw(raw, cfg):
        limits.check_depth(body, cfg)
    try:
        meta = parse_request(body, headers)
    except MetadataError as exc:
        raise bad_request(str(exc)) from None
    if meta.tool_args is not None:
        limits._cap(json.dumps(meta.tool_args), cfg.max_tool_args_chars, "anchorage.tool_args",
                    "anchorage.tool_args")
    if meta.warmup and not trusted(headers, cfg.trusted_token):
        meta.warmup = False
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    limits.check_request(body, meta, cfg, model)
    meta.tenant = tenant_of(headers, cfg.tenant_secret)
    field = ROUTED.get(path, "")
    if field == "prompt" and path == "/tokenize" and "messages" in body:
        field = "messages"
    if field and field not in body:
        raise bad_request(f"'{field}' is required", field)
    check_types(body, field)
    return Parsed(raw, path, body, meta, model, body.get("stream") is True,
                  tenant_salt(meta.tenant, cfg.tenant_secret))


_INT = {int}


def _token_ids(v: Any) -> bool:
    # bool is an int subclass: [true, 3] is not a token-id prompt (vLLM's lax parser
    # would read it as [1, 3]). set(map(type, ...)) runs in C: about the cost of the
    # min/max of the vocabulary check, a third of a generator over the ids
    return isinstance(v, list) and bool(v) and set(map(type, v)) == _INT


def _prompt_ok(v: Any) -> bool:
    """OpenAI's ``prompt``: a string, a list of strings, a list of token ids, or a list of
    token-id lists."""
    if isinstance(v, str):
        return True
    if not isinstance(v, list) or not v:
        return False
    if all(isinstance(x, str) for x in v):
        return True
    return _token_ids(v) or all(_token_ids(x) for x in v)


def check_types(body: dict[str, Any], field: str) -> None:
    """The types of the fields the router reads or routes by, strictly (no coercion: the
    engine's parser would turn ``true`` into 1 and ``"yes"`` into true). 400 naming the
    field."""
    v = body.get(field) if field else None
    if field == "prompt" and "prompt" in body and not _prompt_ok(v):
        raise bad_request("'prompt' must be a string or a list of token ids (integers), or a "
                          "list of strings or of token-id lists", "prompt")
    if field == "messages" and not (isinstance(v, list) and v
                                    and all(isinstance(m, dict) for m in v)):
        raise bad_request("'messages' must be a non-empty list of message objects", "messages")
    if field == "input" and not isinstance(v, (str, list)):
        raise bad_request("'input' must be a string or a list of input items", "input")
    if field == "tokens" and not _token_ids(v):
        raise bad_request("'tokens' must be a non-empty list of token ids (integers)", "tokens")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
