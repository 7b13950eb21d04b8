"""Anthropic Messages ⇄ chat completions translation (pure functions)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import InvalidRequestError, ProxyError, UpstreamError
from proxy.protocols.messages import (
    StreamTranslator,
    chat_body,
    error_body,
    error_type,
    message_from_reply,
)
from proxy.transcript import Reply, ToolCall, Usage

CACHED = {"type": "text", "text": "Long rules.", "cache_control": {"type": "ephemeral"}}


def events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(block.split(b"\ndata: ", 1)[1])
            for block in raw.split(b"\n\n") if block]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
            **fields}


@pytest.mark.parametrize(("keep_cache", "system"), [
    (True, {"role": "system", "content": [CACHED, {"type": "text", "text": "More."}]}),
    (False, {"role": "system", "content": "Long rules.\n\nMore."}),
])
def test_system_blocks_keep_cache_control_only_where_it_is_understood(
    keep_cache: bool, system: dict[str, Any]
) -> None:
    """System blocks stay blocks with cache_control for litellm (Anthropic), and become
    one string for OpenAI-compatible upstreams."""
    out = chat_body(body(system=[CACHED, {"type": "text", "text": "More."}]),
                    keep_cache=keep_cache)
    assert out["messages"][0] == system


def test_turns_tools_and_fields_are_mapped() -> None:
    """Images, tool_use/tool_result, tools, tool_choice, stop_sequences and
    metadata.user_id map to their chat forms; thinking blocks are dropped."""
    out = chat_body({
        "model": "m", "max_tokens": 50, "stop_sequences": ["##"], "temperature": 0,
        "metadata": {"user_id": "u1"},
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": "AAA"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                 "content": [{"type": "text", "text": "failed"}]},
                {"type": "text", "text": "and?"}]},
        ]}, keep_cache=False)
    assert out["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}]},
        {"role": "assistant", "content": "Calling.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f",
                                                          "arguments": '{"a":1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "Error: failed"},
        {"role": "user", "content": "and?"},
    ]
    assert (out["max_completion_tokens"], out["stop"], out["user"], out["temperature"]) == \
        (50, ["##"], "u1", 0)
    assert out["tools"] == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}, "description": "d"}}]
    assert (out["tool_choice"], out["parallel_tool_calls"]) == \
        ({"type": "function", "function": {"name": "f"}}, False)


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "messages[0].content[0].type"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"system": 5}, "system"),
])
def test_bad_requests_name_the_parameter(fields: dict[str, Any], param: str) -> None:
    """Missing or malformed fields, unknown blocks and server tools are a 400 naming the
    parameter."""
    with pytest.raises(InvalidRequestError) as caught:
        chat_body(body(**fields), keep_cache=False)
    assert caught.value.param == param


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (413, "request_too_large"), (429, "rate_limit_error"),
    (500, "api_error"), (502, "api_error"), (504, "timeout_error"), (529, "overloaded_error"),
    (409, "invalid_request_error"),
])
def test_error_types_follow_anthropics_table(status: int, kind: str) -> None:
    """Each HTTP status maps to Anthropic's error type."""
    assert error_type(status) == kind
    assert error_body(ProxyError("m", status_code=status)) == \
        {"type": "error", "error": {"type": kind, "message": "m"}}


def test_a_reply_becomes_a_message() -> None:
    """Text and tool calls become content blocks (arguments parsed), with stop reason."""
    reply = Reply(content="On it.", finish_reason="tool_calls",
                  tool_calls=[ToolCall(id="c1", name="f", arguments='{"x": 2}')])
    message = message_from_reply(model="m", reply=reply, usage=Usage(3, 4, 7))
    assert message["content"] == [{"type": "text", "text": "On it."},
                                  {"type": "tool_use", "id": "c1", "name": "f",
                                   "input": {"x": 2}}]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 3


def test_stream_blocks_are_indexed_and_closed() -> None:
    """Text then two tool calls: three blocks, each started, filled and stopped with its
    own index, then message_delta and message_stop; an error closes the open block."""
    translator = StreamTranslator("m")
    raw = translator.opening()
    for delta in ({"content": "Hi"},
                  {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f",
                                                                       "arguments": "{}"}}]},
                  {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g",
                                                                       "arguments": "{"}}]},
                  {"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]}):
        raw += translator.feed({"choices": [{"index": 0, "delta": delta}]})
    raw += translator.feed({"choices": [{"index": 0, "delta": {},
                                         "finish_reason": "tool_calls"}]})
    raw += translator.closing(Usage(1, 2, 3))
    out = events(raw)
    starts = [e["index"] for e in out if e["type"] == "content_block_start"]
    stops = [e["index"] for e in out if e["type"] == "content_block_stop"]
    assert starts == stops == [0, 1, 2]
    assert out[-2]["delta"]["stop_reason"] == "tool_use"
    assert out[-1]["type"] == "message_stop"
    cut = StreamTranslator("m")
    cut.feed({"choices": [{"index": 0, "delta": {"content": "x"}}]})
    failed = events(cut.failure(UpstreamError("boom")))
    assert [e["type"] for e in failed] == ["content_block_stop", "error"]
    assert failed[-1]["error"] == {"type": "api_error", "message": "boom"}
