"""The chat request is checked where the gateway reads it: the parts it reads must have the
type they are read as (a 400 naming the part, in bracket form), everything else passes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import InvalidRequestError
from proxy.request import parse_chat_body, parse_chat_request
from proxy.request.problems import param_of

HI = [{"role": "user", "content": "hi"}]


def _refusal(body: Any) -> tuple[str | None, str | None, str]:
    with pytest.raises(InvalidRequestError) as caught:
        parse_chat_request(orjson.dumps(body))
    error = caught.value
    assert error.status_code == 400
    assert error.error_type == "invalid_request_error"
    return error.param, error.code, error.message


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"messages": HI}, "model", "missing_required_parameter"),
    ({"model": None, "messages": HI}, "model", "missing_required_parameter"),
    ({"model": " ", "messages": HI}, "model", "invalid_type"),
    ({"model": 5, "messages": HI}, "model", "invalid_type"),
    ({"model": "m"}, "messages", "missing_required_parameter"),
    ({"model": "m", "messages": []}, "messages", "invalid_type"),
    ({"model": "m", "messages": {}}, "messages", "invalid_type"),
    ({"model": "m", "messages": [5]}, "messages[0]", "invalid_type"),
    ({"model": "m", "messages": [*HI, {"content": "x"}]}, "messages[1].role", "invalid_type"),
    ({"model": "m", "messages": [{"role": ""}]}, "messages[0].role", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "name": 5}]}, "messages[0].name",
     "invalid_value"),
    ({"model": "m", "messages": [{"role": "user", "name": "a\x85"}]}, "messages[0].name",
     "invalid_value"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content",
     "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}, 3]}]},
     "messages[0].content[1]", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]},
     "messages[0].content[0]", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x"}},
        {"type": "text", "text": ["x"]}]}]}, "messages[0].content[1].text", "invalid_type"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": -1}]},
     "messages[0].tool_calls", "invalid_type"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{}, "call"]}]},
     "messages[0].tool_calls[1]", "invalid_type"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": 1}]}]},
     "messages[0].tool_calls[0].function", "invalid_type"),
    ({"model": "m", "messages": HI, "stream": 1}, "stream", "invalid_type"),
    ({"model": "m", "messages": HI, "stream_options": []}, "stream_options", "invalid_type"),
    ({"model": "m", "messages": HI, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", "invalid_type"),
    ({"model": "m", "messages": HI, "user": 5}, "user", "invalid_type"),
    ({"model": "m", "messages": HI, "safety_identifier": ["a"]}, "safety_identifier",
     "invalid_type"),
    ({"model": "m", "messages": HI, "metadata": "x"}, "metadata", "invalid_type"),
    ({"model": "m", "messages": HI, "n": True}, "n", "invalid_type"),
    ({"model": "m", "messages": HI, "n": 0}, "n", "invalid_type"),
])
def test_a_part_the_gateway_reads_of_the_wrong_type_is_400(body: dict[str, Any], param: str,
                                                           code: str) -> None:
    """Each part the gateway reads, when missing or of the wrong type, is refused naming
    it in bracket form with the code for what is wrong."""
    got_param, got_code, message = _refusal(body)
    assert (got_param, got_code) == (param, code)
    assert message


def test_the_first_problem_in_reading_order_is_named() -> None:
    """With several problems, the one a reader meets first is named: ``model`` before
    ``messages``, an earlier message before a later one, a message before ``n``."""
    assert _refusal({"model": 5, "messages": 5})[0] == "model"
    assert _refusal({"model": "m", "messages": [{"role": "u", "content": 5}, 5]})[0] == \
        "messages[0].content"
    assert _refusal({"model": "m", "messages": [{"role": 5}], "n": 0})[0] == \
        "messages[0].role"


def test_the_messages_say_what_to_send() -> None:
    """The error messages name the part and what it must be."""
    assert _refusal({"model": "m", "messages": [{"role": "user", "content": [7]}]})[2] == \
        "messages[0].content[0] must be an object with a 'type'."
    assert _refusal({"model": "m", "messages": HI, "stream": "yes"})[2] == \
        "'stream' must be a boolean."
    assert _refusal({"model": "m", "messages": [{"role": "user", "name": "x" * 300}]})[2] == \
        "messages[0].name must be a string of at most 256 printable characters."


@pytest.mark.parametrize("raw", [b"", b"[1]", b"{x", b"null"])
def test_a_body_that_is_not_a_json_object_is_invalid_json(raw: bytes) -> None:
    """No body, an array, broken JSON and ``null`` are ``invalid_json``."""
    with pytest.raises(InvalidRequestError) as caught:
        parse_chat_request(raw)
    assert caught.value.code == "invalid_json"
    assert caught.value.param is None


def test_what_the_gateway_does_not_read_passes_untouched() -> None:
    """Unknown fields, unknown part types, null content and vendor extensions are
    accepted, and the request keeps the client's own objects."""
    messages = [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}},
                                     {"type": "image_url", "image_url": 5}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": 1, "arguments": None}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny", "x_vendor": [1]},
    ]
    body = {"model": "m", "messages": messages, "x_vendor": {"deep": [1, None]},
            "stream": None, "metadata": {"k": "v"}}
    request = parse_chat_body(body)
    assert request.body is body
    assert request.messages is messages
    assert (request.model, request.stream, request.include_usage) == ("m", False, False)


@pytest.mark.parametrize(("stream", "usage", "expected"), [
    (True, True, (True, True)), (True, None, (True, False)), (False, True, (False, False)),
    (None, True, (False, False)),
])
def test_usage_is_included_only_on_a_stream(stream: bool | None, usage: bool | None,
                                            expected: tuple[bool, bool]) -> None:
    """``stream_options.include_usage`` counts only for a streamed request."""
    request = parse_chat_body({"model": "m", "messages": HI, "stream": stream,
                               "stream_options": {"include_usage": usage}})
    assert (request.stream, request.include_usage) == expected


def test_a_location_in_bracket_form() -> None:
    """Indices in brackets, fields after dots, union tags dropped."""
    assert param_of(("messages", 0, "content", "~parts", 1, "~text", "text")) == \
        "messages[0].content[1].text"
    assert param_of(("stream_options", "include_usage")) == "stream_options.include_usage"
    assert param_of(("input", 2, "content")) == "input[2].content"
