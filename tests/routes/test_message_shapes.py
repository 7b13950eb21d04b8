"""Any message shape is answered without a 5xx: a wrong type where the gateway reads a
value is a 400 in OpenAI's error envelope naming the part, anything else is served.

A hypothesis property over the ``messages`` a client may send (roles, names, contents,
content parts, ``tool_calls`` and their ``function`` of every JSON type), run against the
app on the default SQLite backend with the scripted fake upstream. One gateway serves
every example: it runs in a thread of its own and the examples call it over HTTP.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

EXAMPLES = 150

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
texts = st.one_of(st.text(max_size=40), st.sampled_from(["hello", "I like tea", "", " "]))
valid_parts = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": texts}),
    st.fixed_dictionaries({"type": st.just("image_url"),
                           "image_url": st.fixed_dictionaries({"url": st.sampled_from(
                               ["https://example.com/a.png", "data:image/png;base64,AAAA"])})}),
)
valid_calls = st.lists(st.fixed_dictionaries({
    "id": st.just("c1"), "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": st.just("f"), "arguments": st.just("{}")})}),
    min_size=1, max_size=2)
valid_messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
     "content": st.one_of(texts, st.none(), st.lists(valid_parts, min_size=1, max_size=3))},
    optional={"name": st.sampled_from(["alice", "Bob Smith"]), "tool_calls": valid_calls})
# Where one value of a valid message is replaced by any JSON value: each part the gateway
# reads, and one it does not.
PLACES = ["message", "role", "content", "name", "tool_calls", "tool_calls[0]", "function",
          "function.name", "function.arguments", "content[0]", "content[0].type",
          "content[0].text", "content[0].image_url", "tool_call_id", "x_vendor"]


def _replace(message: dict[str, Any], place: str, value: Any) -> Any:
    if place == "message":
        return value
    if place.startswith("content[0]"):
        if not isinstance(message.get("content"), list):
            message["content"] = [{"type": "text", "text": "hi"}]
        if place == "content[0]":
            message["content"][0] = value
        else:
            message["content"][0][place.split(".")[1]] = value
        return message
    if place.startswith(("tool_calls[0]", "function")):
        calls = message.setdefault("tool_calls", [{"id": "c1", "type": "function",
                                                   "function": {"name": "f"}}])
        if place == "tool_calls[0]":
            calls[0] = value
        elif place == "function":
            calls[0]["function"] = value
        else:
            calls[0].setdefault("function", {})[place.split(".")[1]] = value
        return message
    message[place] = value
    return message


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A chat request of valid messages, mostly with one value of one message replaced by
    any JSON value (a scalar as often as a nested value)."""
    sent = draw(st.lists(valid_messages, min_size=1, max_size=4))
    if draw(st.integers(0, 3)):
        index = draw(st.integers(0, len(sent) - 1))
        value = draw(st.one_of(scalars, json_values))
        sent[index] = _replace(sent[index], draw(st.sampled_from(PLACES)), value)
    body: dict[str, Any] = {"model": "m", "messages": sent}
    stream = draw(st.sampled_from([None, True, False]))
    if stream is not None:
        body["stream"] = stream
    return body


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway running in its own thread and event loop, until the test ends."""
    started = threading.Event()
    stopping = threading.Event()
    holder: list[Gateway] = []
    failure: list[BaseException] = []

    async def serve() -> None:
        async with running_gateway(make_settings(tmp_path), FakeUpstream()) as gateway:
            holder.append(gateway)
            started.set()
            await asyncio.to_thread(stopping.wait)

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # reported by the fixture, not lost in the thread
            failure.append(exc)
            started.set()

    thread = threading.Thread(target=run, name="gateway")
    thread.start()
    started.wait(60)
    try:
        assert holder, failure
        yield holder[0]
    finally:
        stopping.set()
        thread.join(60)
    assert not failure, failure


def test_no_message_shape_is_a_server_error(served: Gateway) -> None:
    """Whatever the shape of the messages, the answer is a 2xx, or a 400 in OpenAI's error
    envelope whose ``param`` names a part of ``messages``; a stream never ends in a server
    error event."""
    answered: dict[int, int] = {}

    with httpx.Client(base_url=served.base_url, timeout=30,
                      headers={"X-User-Id": "u1"}) as client:

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.function_scoped_fixture])
        @given(body=bodies())
        def one(body: dict[str, Any]) -> None:
            response = client.post("/v1/chat/completions", json=body)
            answered[response.status_code] = answered.get(response.status_code, 0) + 1
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                assert response.status_code == 400, (body, response.text)
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error"
                assert error["param"].startswith("messages"), (body, error)
                assert error["code"] in ("invalid_type", "invalid_value"), (body, error)
            elif body.get("stream"):
                assert b"server_error" not in response.content, (body, response.text)

        one()
    assert answered.get(200), answered
    assert answered.get(400), answered


anthropic_blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("t1"),
                           "content": st.one_of(texts, st.lists(st.fixed_dictionaries(
                               {"type": st.just("text"), "text": texts}), max_size=2))}),
)
anthropic_turns = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"),
                           "content": st.one_of(texts, st.lists(anthropic_blocks, min_size=1,
                                                                max_size=3))}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.one_of(
        texts, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                        min_size=1, max_size=2))}),
)
ANTHROPIC_PLACES = ["turn", "role", "content", "content[0]", "content[0].type",
                    "content[0].text", "content[0].content", "system", "system[0]",
                    "system[0].text", "metadata", "max_tokens"]


def _replace_anthropic(body: dict[str, Any], index: int, place: str, value: Any) -> None:
    turn = body["messages"][index]
    if place in ("system", "metadata", "max_tokens"):
        body[place] = value
    elif place.startswith("system[0]"):
        body["system"] = [{"type": "text", "text": "be brief"}]
        if place == "system[0]":
            body["system"][0] = value
        else:
            body["system"][0]["text"] = value
    elif place == "turn":
        body["messages"][index] = value
    elif place.startswith("content[0]"):
        if not isinstance(turn["content"], list):
            turn["content"] = [{"type": "text", "text": "hi"}]
        if place == "content[0]":
            turn["content"][0] = value
        else:
            turn["content"][0][place.split(".")[1]] = value
    else:
        turn[place] = value


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A Messages request of valid turns, mostly with one value replaced by any JSON
    value."""
    body: dict[str, Any] = {"model": "m", "max_tokens": 16,
                            "messages": draw(st.lists(anthropic_turns, min_size=1,
                                                      max_size=3))}
    if draw(st.integers(0, 3)):
        _replace_anthropic(body, draw(st.integers(0, len(body["messages"]) - 1)),
                           draw(st.sampled_from(ANTHROPIC_PLACES)),
                           draw(st.one_of(scalars, json_values)))
    if draw(st.booleans()):
        body["stream"] = True
    return body


def test_no_anthropic_message_shape_is_a_server_error(served: Gateway) -> None:
    """Whatever the shape of a Messages request's turns, system and metadata, the answer is
    a 2xx or a 400 in Anthropic's error shape (``invalid_request_error``)."""
    answered: dict[int, int] = {}

    with httpx.Client(base_url=served.base_url, timeout=30,
                      headers={"X-User-Id": "u1"}) as client:

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.function_scoped_fixture])
        @given(body=anthropic_bodies())
        def one(body: dict[str, Any]) -> None:
            response = client.post("/v1/messages", json=body)
            answered[response.status_code] = answered.get(response.status_code, 0) + 1
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                assert response.status_code == 400, (body, response.text)
                assert response.json()["error"]["type"] == "invalid_request_error"
            elif body.get("stream"):
                assert b"api_error" not in response.content, (body, response.text)

        one()
    assert answered.get(200), answered
    assert answered.get(400), answered
