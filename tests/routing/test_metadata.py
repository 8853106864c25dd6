import json

import pytest

from anchorage.routing.metadata import MetadataError, from_extra_args, parse_request, to_vllm_body


@pytest.mark.parametrize("body", [
    {"anchorage": {"agent": "planner", "tool_name": "search", "tool_args": {"q": 1}}},
    {"vllm_xargs": {"anchorage": {"agent": "planner", "tool_name": "search", "tool_args": {"q": 1}}}},
    {"vllm_xargs": {"anchorage.agent": "planner", "anchorage.tool_name": "search",
                    "anchorage.tool_args": '{"q": 1}'}},
])
def test_three_spellings_give_one_canonical_flat_form(body):
    meta = parse_request(body, {"x-session-id": "s1"})
    meta.tenant = "t-1"
    out = to_vllm_body({"prompt": [1, 2], **body}, meta, cache_salt="salt-1")
    assert "anchorage" not in out
    x = out["vllm_xargs"]
    assert all(not isinstance(v, dict) for v in x.values())      # vLLM 0.32 rejects nesting
    assert x == {"anchorage.agent": "planner", "anchorage.tool_name": "search",
                 "anchorage.tool_args": json.dumps({"q": 1}), "anchorage.tenant": "t-1"}
    assert out["session_id"] == "s1" and out["cache_salt"] == "salt-1"
    back = from_extra_args(x, "s1")
    assert (back.agent, back.tool_name, back.tool_args, back.tenant) == ("planner", "search", {"q": 1}, "t-1")


def test_header_wins_over_body_session_and_client_salt_is_replaced():
    meta = parse_request({"session_id": "body"}, {"x-session-id": "hdr"})
    assert meta.session_id == "hdr"
    assert parse_request({"session_id": 7}, {}).session_id == "7"
    out = to_vllm_body({"prompt": "x", "cache_salt": "mine", "vllm_xargs": {"other": 2}},
                       parse_request({}, {}), cache_salt=None)
    assert "cache_salt" not in out and out["vllm_xargs"] == {"other": 2}


@pytest.mark.parametrize("body, msg", [
    ({"anchorage": {"agnet": "x"}}, "unknown anchorage metadata field.*agnet"),
    ({"anchorage": {"agent": 3}}, "anchorage.agent must be a string"),
    ({"anchorage": "planner"}, "must be an object"),
    ({"vllm_xargs": [1]}, "vllm_xargs must be an object"),
    ({"anchorage": {"warmup": "yes"}}, "anchorage.warmup must be a boolean"),
    ({"anchorage": {"warmup": "false"}}, "anchorage.warmup must be a boolean"),
    ({"vllm_xargs": {"anchorage.warmup": 2}}, "anchorage.warmup must be a boolean"),
])
def test_bad_metadata_is_a_clear_error(body, msg):
    with pytest.raises(MetadataError, match=msg):
        parse_request(body, {})


def test_warmup_flags_in_both_forms():
    assert parse_request({"anchorage": {"warmup": True}}, {}).warmup is True
    assert parse_request({"vllm_xargs": {"anchorage.warmup": 1}}, {}).warmup is True
    assert parse_request({"anchorage": {"warmup": False}}, {}).warmup is False


def test_agent_clients_session_ids_are_read_where_they_send_them():
    """OpenAI's prompt_cache_key and the agent CLIs' session headers are session identity
    when the client sends none of Anchorage's own (issue 41)."""
    cases = [({"prompt_cache_key": "conv-1"}, {}, "conv-1"),                       # OpenAI / Codex
             ({}, {"x-claude-code-session-id": "cc-2"}, "cc-2"),                    # Claude Code
             ({}, {"session_id": "cx-3"}, "cx-3"), ({}, {"session-id": "cx-4"}, "cx-4"),  # Codex
             ({}, {"x-session-affinity": "oc-5"}, "oc-5")]                          # OpenCode
    for body, headers, want in cases:
        meta = parse_request(body, headers)
        assert meta.session_id == want, (body, headers)
        assert to_vllm_body(body, meta, None)["session_id"] == want
    # Anchorage's own spellings win, then prompt_cache_key, then the headers in order
    both = {"x-claude-code-session-id": "cc", "x-session-affinity": "oc"}
    assert parse_request({"prompt_cache_key": "pk"}, {"x-session-id": "mine", **both}).session_id == "mine"
    assert parse_request({"session_id": "b", "prompt_cache_key": "pk"}, both).session_id == "b"
    assert parse_request({"prompt_cache_key": "pk"}, both).session_id == "pk"
    assert parse_request({"prompt_cache_key": ""}, both).session_id == "cc"
    assert parse_request({}, {}).session_id is None
    with pytest.raises(MetadataError, match="prompt_cache_key must be a string"):
        parse_request({"prompt_cache_key": {"a": 1}}, {})
