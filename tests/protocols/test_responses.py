"""Responses ⇄ chat completions translation (pure functions)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import InvalidRequestError, UpstreamError
from proxy.protocols.responses import (
    ResponseShell,
    StreamTranslator,
    chat_body,
    output_text,
    user_view,
)
from proxy.transcript import Usage


def events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(block.split(b"\ndata: ", 1)[1])
            for block in raw.split(b"\n\n") if block]


@pytest.mark.parametrize(("body", "messages"), [
    ({"input": "hi"}, [{"role": "user", "content": "hi"}]),
    ({"input": "hi", "instructions": "Be brief."},
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
                                              {"type": "input_text", "text": "b"}]}]},
     [{"role": "user", "content": "a\nb"}]),
    ({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAA", "detail": "low"}]}]},
     [{"role": "user", "content": [
         {"type": "text", "text": "what is this?"},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA",
                                             "detail": "low"}}]}]),
    ({"input": [{"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Hi!"}]},
                {"type": "reasoning", "summary": []},
                {"role": "developer", "content": "terse"}]},
     [{"role": "assistant", "content": "Hi!"}, {"role": "developer", "content": "terse"}]),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "1"}]},
     [{"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
         {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "1"}]),
])
def test_input_becomes_chat_messages(body: dict[str, Any], messages: list[Any]) -> None:
    """Strings, message items, parts, function calls (merged into one assistant turn) and
    their outputs become the chat messages a chat upstream expects; reasoning is dropped."""
    assert chat_body({"model": "m", **body})["messages"] == messages


def test_fields_are_mapped_and_responses_only_ones_dropped() -> None:
    """max_output_tokens, text.format, reasoning.effort, tools and tool_choice are mapped;
    store/include are dropped; sampling fields and unknown fields pass through."""
    out = chat_body({
        "model": "m", "input": "x", "max_output_tokens": 9, "temperature": 0.2,
        "store": True, "include": ["reasoning.encrypted_content"], "seed": 7,
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"},
                            "strict": True}},
        "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
    })
    assert out == {
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 9, "temperature": 0.2, "seed": 7,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "object"}, "strict": True}},
        "reasoning_effort": "low",
        "tools": [{"type": "function", "function": {"name": "f",
                                                    "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].image_url"),
    ({"input": 5}, "input"),
    ({"input": ["text"]}, "input[0]"),
])
def test_untranslatable_requests_name_the_parameter(body: dict[str, Any], param: str) -> None:
    """What a chat upstream cannot do is a 400 naming the parameter."""
    with pytest.raises(InvalidRequestError) as caught:
        chat_body({"model": "m", **body})
    assert caught.value.param == param


def test_the_native_view_skips_what_it_cannot_read() -> None:
    """For identity and recall on a relayed request, unknown items are skipped, not 400."""
    view = user_view({"input": [{"type": "item_reference", "id": "msg_1"},
                                {"role": "user", "content": "hello"}],
                      "previous_response_id": "resp_1"})
    assert view == [{"role": "user", "content": "hello"}]


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_stream_events_are_numbered_and_close_every_item() -> None:
    """Text then a tool call: each item is opened, filled and closed in order, sequence
    numbers count up from 0, and the final response lists both items with usage."""
    translator = StreamTranslator(ResponseShell(id="resp_1", model="m", request={}))
    raw = translator.opening()
    raw += translator.feed(chat_chunk({"content": "Hel"}))
    raw += translator.feed(chat_chunk({"content": "lo"}))
    raw += translator.feed(chat_chunk({"tool_calls": [
        {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]}))
    raw += translator.feed(chat_chunk({"tool_calls": [
        {"index": 0, "function": {"arguments": ": 1}"}}]}, "tool_calls"))
    raw += translator.closing(Usage(5, 2, 7))
    out = events(raw)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    final = out[-1]["response"]
    assert output_text(final) == "Hello"
    assert final["output"][1]["arguments"] == '{"a": 1}'
    assert [e["output_index"] for e in out if e["type"] == "response.output_item.done"] == \
        [0, 1]
    assert final["usage"]["total_tokens"] == 7


def test_a_cut_reply_is_incomplete_and_a_failure_is_reported() -> None:
    """finish_reason length ends with response.incomplete; an error after the start ends
    with an error event and response.failed."""
    shell = ResponseShell(id="resp_1", model="m", request={})
    translator = StreamTranslator(shell)
    translator.feed(chat_chunk({"content": "x"}, "length"))
    closing = events(translator.closing(Usage(1, 1, 2)))
    assert closing[-1]["type"] == "response.incomplete"
    assert closing[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    failed = events(StreamTranslator(shell).failure(UpstreamError("boom")))
    assert [e["type"] for e in failed] == ["error", "response.failed"]
    assert failed[0]["message"] == "boom"
    assert failed[1]["response"]["error"]["code"] == "server_error"
