"""The request path's shortcuts keep its semantics: the forwarded body is the canonical body
(``to_vllm_body``) whether it is re-encoded or the client's bytes are extended, and the
answer's ``usage``/``id`` are read as a full parse would."""

from __future__ import annotations

import json

import pytest

from anchorage.router import fastjson
from anchorage.router.config import RouterConfig
from anchorage.router.core import forward_body
from anchorage.router.parsing import parse
from anchorage.routing.metadata import to_vllm_body

BODIES = [
    (b'{"model": "tiny", "prompt": [1, 2, 3]}', {}),
    (b'  {"model":"tiny","prompt":"hi"}  \n', {"x-session-id": "s1"}),
    (b'{"prompt": "hi", "session_id": "old"}', {"x-session-id": "s2"}),
    (b'{"prompt": "hi", "anchorage": {"agent": "planner"}}', {"authorization": "Bearer k"}),
    (b'{"prompt": "hi", "vllm_xargs": {"x": 1}, "cache_salt": "client"}', {}),
    (b'{"prompt": "a", "prompt": "b"}', {}),
]


@pytest.mark.parametrize("raw,headers", BODIES)
def test_the_forwarded_body_is_the_canonical_body(raw, headers):
    cfg = RouterConfig(replicas=["http://u"], tenant_secret="s")
    p = parse("/v1/completions", raw, headers, cfg)
    assert json.loads(forward_body(p)) == to_vllm_body(p.body, p.meta, p.salt)


def test_duplicate_keys_resolve_as_vllm_reads_them():
    assert fastjson.loads(b'{"prompt": [1], "prompt": [5000]}') == {"prompt": [5000]}


def test_usage_and_id_are_read_without_the_rest():
    body = json.dumps({"id": "resp-1", "choices": [{"text": "x" * 100}],
                       "usage": {"prompt_tokens": 7}}).encode()
    assert fastjson.usage_and_id(body) == ({"prompt_tokens": 7}, "resp-1")
    assert fastjson.usage_and_id(b"[1, 2]") == (None, None)
    assert fastjson.usage_and_id(b"not json") == (None, None)
