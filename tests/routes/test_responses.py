"""``POST /v1/responses`` with the official OpenAI SDK as the client: translated to chat
completions for a chat upstream, relayed natively to a Responses upstream; memory,
learning, errors and isolation as on chat completions."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.memory.inject import BLOCK_START
from tests.fakes import (
    FakeUpstream,
    Gateway,
    Reply,
    chunk,
    completion_body,
    make_settings,
    running_gateway,
    text_chunks,
    usage_chunk,
)


def sdk(gw: Gateway, user: str | None = None) -> openai.AsyncOpenAI:
    headers = {"X-User-Id": user} if user else {}
    return openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key="sk-client",
                              max_retries=0, default_headers=headers)


async def remember(gw: Gateway, user: str, content: str) -> None:
    async with gw.client() as client:
        response = await client.post("/v1/memories", json={"content": content},
                                     headers={"X-User-Id": user})
    assert response.status_code == 201, response.text


TOOL_CALL = [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}


# ------------------------------------------------------------------ translated


async def test_text_reply_is_a_responses_object(any_gateway: Gateway,
                                                upstream: FakeUpstream) -> None:
    """A string ``input`` with ``instructions`` reaches a chat upstream as system + user
    messages, and the reply comes back as a Responses object with usage (relay and
    litellm transports alike)."""
    async with sdk(any_gateway) as client:
        response = await client.responses.create(model="m", input="ping",
                                                 instructions="Be brief.",
                                                 max_output_tokens=50)
    assert response.output_text == "Hello there!"
    assert response.status == "completed"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (12, 3)
    sent = upstream.last_chat
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "ping"}]
    assert sent["max_completion_tokens"] == 50
    assert upstream.paths[-1].endswith("/chat/completions")


async def test_stream_has_the_event_sequence_the_sdk_helpers_expect(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A streamed reply is ``response.created`` … ``response.completed`` with usage; the
    SDK's stream helper assembles the final response from it."""
    upstream.push(Reply(events=[*text_chunks("Grüße, 世界!", pieces=4), usage_chunk(20, 5)]))
    async with sdk(gateway) as client, client.responses.stream(model="m",
                                                                 input="hi") as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert kinds.count("response.output_text.delta") == 4
    assert final.output_text == "Grüße, 世界!"
    assert final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (20, 5)
    assert upstream.last_chat["stream_options"] == {"include_usage": True}


async def test_function_tools_round_trip(gateway: Gateway, upstream: FakeUpstream) -> None:
    """Function tools are sent as chat tools, a tool call comes back as a
    ``function_call`` item, and its output goes back as a tool message."""
    upstream.push(Reply(json=completion_body("", tool_calls=TOOL_CALL)))
    async with sdk(gateway) as client:
        first = await client.responses.create(model="m", input="Weather in Paris?",
                                              tools=[WEATHER_TOOL],  # type: ignore[list-item]
                                              tool_choice="auto")
        call = first.output[0]
        assert call.type == "function_call"
        assert (call.name, call.arguments, call.call_id) == \
            ("get_weather", '{"city": "Paris"}', "call_1")
        assert upstream.last_chat["tools"] == [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather now",
            "parameters": WEATHER_TOOL["parameters"]}}]
        second = await client.responses.create(model="m", input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18°C, sunny"},
        ])
    assert second.output_text == "Hello there!"
    assert upstream.last_chat["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": TOOL_CALL},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"}]


async def test_streamed_tool_call_is_a_function_call_item(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Streamed tool-call fragments become ``function_call`` events and one item."""
    upstream.push(Reply(events=[
        chunk([{"index": 0, "delta": {"role": "assistant", "tool_calls": [{
            "index": 0, "id": "call_9", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}]}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "function": {"arguments": '{"city": '}}]}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "function": {"arguments": '"Oslo"}'}}]}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        usage_chunk()]))
    async with sdk(gateway) as client, client.responses.stream(
            model="m", input="Oslo?", tools=[WEATHER_TOOL]) as stream:  # type: ignore[list-item]
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds.count("response.function_call_arguments.delta") == 2
    assert "response.function_call_arguments.done" in kinds
    item = final.output[0]
    assert item.type == "function_call"
    assert (item.call_id, item.arguments) == ("call_9", '{"city": "Oslo"}')


async def test_previous_response_id_needs_a_responses_upstream(gateway: Gateway,
                                                               upstream: FakeUpstream) -> None:
    """A chat upstream keeps no response state: ``previous_response_id`` is a 400 that
    says so, and nothing is sent upstream."""
    async with sdk(gateway) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="m", input="again",
                                          previous_response_id="resp_123")
    assert caught.value.status_code == 400
    assert "keeps no response state" in str(caught.value)
    assert "whole conversation" in str(caught.value)
    assert upstream.chat_requests == []


@pytest.mark.parametrize(("payload", "param"), [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({}, "input"),
])
async def test_untranslatable_requests_are_400(gateway: Gateway, upstream: FakeUpstream,
                                               payload: dict[str, Any], param: str) -> None:
    """Built-in tools, item references, unknown roles and a missing ``input`` are a 400
    naming the parameter; nothing reaches the upstream."""
    async with gateway.client() as client:
        response = await client.post("/v1/responses", json={"model": "m", **payload})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert upstream.chat_requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_error_before_the_first_byte_is_an_http_error(
    gateway: Gateway, upstream: FakeUpstream, stream: bool
) -> None:
    """An upstream 429 reaches the SDK as RateLimitError, streaming or not."""
    upstream.push(Reply(status=429, json={"error": {"message": "slow down",
                                                    "type": "rate_limit_error"}},
                        headers={"retry-after": "7"}))
    async with sdk(gateway) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.responses.create(model="m", input="hi", stream=stream)
    assert "slow down" in str(caught.value)
    assert caught.value.response.headers["retry-after"] == "7"


async def test_error_after_the_first_byte_ends_the_stream_with_an_error_event(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """An upstream failure mid-stream becomes ``error`` and ``response.failed`` events."""
    upstream.push(Reply(events=[*text_chunks("partial answer")[:2],
                                {"error": {"message": "model crashed", "type": "server_error"}}],
                        done=False))
    async with sdk(gateway) as client:
        stream = await client.responses.create(model="m", input="hi", stream=True)
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created"
    assert "response.output_text.delta" in kinds
    assert kinds[-2:] == ["error", "response.failed"]
    assert "model crashed" in events[-2].message  # type: ignore[union-attr]


async def test_bad_key_is_an_openai_401(tmp_path: Path) -> None:
    """With gateway keys configured, a wrong key is the SDK's AuthenticationError."""
    digest = hashlib.sha256(b"good-key").hexdigest()
    settings = make_settings(tmp_path, auth={"keys": [{"key_sha256": digest, "tenant": "t"}]})
    async with running_gateway(settings) as gw, sdk(gw) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.responses.create(model="m", input="hi")
        good = client.with_options(api_key="good-key")
        assert (await good.responses.create(model="m", input="hi")).output_text


# ------------------------------------------------------------------ memory


async def test_memory_is_injected_and_isolated(gateway: Gateway, upstream: FakeUpstream) -> None:
    """alice's memory reaches the upstream on her request (with the x-memory headers),
    never on bob's."""
    await remember(gateway, "alice", "Lives in Lisbon and cycles to work")
    async with sdk(gateway, "alice") as client:
        raw = await client.responses.with_raw_response.create(
            model="m", input="Where do I live?", instructions="Be brief.")
    assert raw.headers["x-memory-injected"] == "1"
    assert "Lisbon" in str(upstream.last_chat["messages"])
    assert BLOCK_START in upstream.last_chat["messages"][0]["content"]
    async with sdk(gateway, "bob") as client:
        raw = await client.responses.with_raw_response.create(model="m",
                                                              input="Where do I live?")
    assert raw.headers["x-memory-injected"] == "0"
    assert "Lisbon" not in str(upstream.last_chat["messages"])
    await gateway.res.usage.flush()  # accounted as chat is: one row each, memory apart
    alice = await gateway.res.ledger.usage_totals("default", "alice")
    assert (alice.requests, alice.prompt_tokens, alice.completion_tokens) == (1, 12, 3)
    assert alice.memory_tokens > 0
    assert (await gateway.res.ledger.usage_totals("default", "bob")).memory_tokens == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_turns_are_learned(learning_gateway: Gateway, upstream: FakeUpstream,
                                 stream: bool) -> None:
    """A finished reply is handed to learning under the user; the learned memory is the
    user's alone and is recalled on the next request."""
    upstream.extract = lambda body: {"memories": [{
        "title": "Pet", "content": "Has a cat named Miso", "category": "user_preference",
        "subject": "user"}]}
    async with sdk(learning_gateway, "carol") as client:
        if stream:
            async with client.responses.stream(model="m",
                                               input="My cat is called Miso.") as events:
                await events.get_final_response()
        else:
            await client.responses.create(model="m", input="My cat is called Miso.")
    await learning_gateway.settle()
    extract = [body for kind, body in upstream.learning_calls if kind == "extract"]
    assert extract
    assert "My cat is called Miso." in str(extract[-1]["messages"])
    assert "Hello there!" in str(extract[-1]["messages"])
    async with learning_gateway.client() as client:
        mine = (await client.get("/v1/memories", headers={"X-User-Id": "carol"})).json()
        theirs = (await client.get("/v1/memories", headers={"X-User-Id": "dave"})).json()
    assert [m["content"] for m in mine["data"]] == ["Has a cat named Miso"]
    assert theirs["data"] == []
    async with sdk(learning_gateway, "carol") as client:
        await client.responses.create(model="m", input="What is my cat called?")
    assert "Miso" in str(upstream.last_chat["messages"])


# ------------------------------------------------------------------ native


@pytest.fixture(params=["auto", "litellm"], ids=["relay", "litellm"])
async def native(request: pytest.FixtureRequest, tmp_path: Path,
                 upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """A gateway whose model ``m`` speaks the Responses API itself, on each transport
    (litellm: ``litellm.aresponses``, as for Azure)."""
    settings = make_settings(tmp_path, upstream={"transport": request.param}, model_list=[{
        "model_name": "m",
        "litellm_params": {"model": "openai/up-model", "api_base": "http://upstream.test/v1",
                           "api_key": "sk-upstream"},
        "model_info": {"max_input_tokens": 16000, "supports_responses_api": True}}])
    async with running_gateway(settings, upstream) as gw:
        yield gw


def responses_object(text: str, *, rid: str = "resp_up1") -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": 1700000000, "status": "completed",
            "model": "up-model", "error": None, "incomplete_details": None,
            "output": [{"id": "msg_up1", "type": "message", "status": "completed",
                        "role": "assistant", "content": [
                            {"type": "output_text", "text": text, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 30, "output_tokens": 4, "total_tokens": 34,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def responses_events(text: str) -> list[dict[str, Any]]:
    final = responses_object(text)
    started = {**final, "status": "in_progress", "output": [], "usage": None}
    item = {"id": "msg_up1", "type": "message", "status": "in_progress", "role": "assistant",
            "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    done_part = {**part, "text": text}
    seq = iter(range(100))
    return [
        {"type": "response.created", "sequence_number": next(seq), "response": started},
        {"type": "response.output_item.added", "sequence_number": next(seq),
         "output_index": 0, "item": item},
        {"type": "response.content_part.added", "sequence_number": next(seq),
         "item_id": "msg_up1", "output_index": 0, "content_index": 0, "part": part},
        {"type": "response.output_text.delta", "sequence_number": next(seq),
         "item_id": "msg_up1", "output_index": 0, "content_index": 0, "delta": text,
         "logprobs": []},
        {"type": "response.output_text.done", "sequence_number": next(seq),
         "item_id": "msg_up1", "output_index": 0, "content_index": 0, "text": text,
         "logprobs": []},
        {"type": "response.content_part.done", "sequence_number": next(seq),
         "item_id": "msg_up1", "output_index": 0, "content_index": 0, "part": done_part},
        {"type": "response.output_item.done", "sequence_number": next(seq),
         "output_index": 0, "item": final["output"][0]},
        {"type": "response.completed", "sequence_number": next(seq), "response": final},
    ]


async def test_native_upstream_gets_memory_in_instructions(native: Gateway,
                                                           upstream: FakeUpstream) -> None:
    """A Responses upstream gets the body as sent — ``previous_response_id`` included —
    with the memory block appended to ``instructions``; its reply comes back unchanged."""
    await remember(native, "erin", "Is vegetarian")
    upstream.push(Reply(json=responses_object("Try the falafel.")))
    async with sdk(native, "erin") as client:
        raw = await client.responses.with_raw_response.create(
            model="m", input="Dinner idea?", instructions="Be brief.",
            previous_response_id="resp_prev")
    response = raw.parse()
    assert response.output_text == "Try the falafel."
    assert response.id.startswith("resp_")  # litellm encodes its provider into the id
    assert raw.headers["x-memory-injected"] == "1"
    sent = upstream.requests[-1]
    assert upstream.paths[-1] == "/v1/responses"
    assert sent["previous_response_id"] == "resp_prev"
    assert sent["input"] == "Dinner idea?"
    assert sent["instructions"].startswith("Be brief.\n\n" + BLOCK_START)
    assert "Is vegetarian" in sent["instructions"]
    await native.res.usage.flush()
    totals = await native.res.ledger.usage_totals("default", "erin")
    assert (totals.requests, totals.prompt_tokens, totals.completion_tokens) == (1, 30, 4)
    assert totals.memory_tokens > 0


@pytest.mark.parametrize("transport", ["auto", "litellm"])
async def test_native_stream_is_relayed_and_learned(tmp_path: Path, upstream: FakeUpstream,
                                                    transport: str) -> None:
    """The upstream's Responses events reach the SDK (unchanged through the relay) and the
    finished turn is learned from."""
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1},
                             upstream={"transport": transport},
                             model_list=[{
                                 "model_name": "m",
                                 # a model litellm knows to stream natively
                                 "litellm_params": {"model": "openai/gpt-4o-mini",
                                                    "api_base": "http://upstream.test/v1",
                                                    "api_key": "sk-upstream"},
                                 "model_info": {"supports_responses_api": True}}])
    upstream.push(Reply(events=responses_events("Noted: you like jazz."), done=False))
    async with running_gateway(settings, upstream) as gw:
        async with sdk(gw, "frank") as client, client.responses.stream(
                model="m", input="I love jazz.") as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        await gw.settle()
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert final.output_text == "Noted: you like jazz."
    assert upstream.paths[0] == "/v1/responses"
    extract = [body for kind, body in upstream.learning_calls if kind == "extract"]
    assert "I love jazz." in str(extract[-1]["messages"])
    assert "Noted: you like jazz." in str(extract[-1]["messages"])


@pytest.mark.parametrize("stream", [False, True])
async def test_native_upstream_errors_reach_the_sdk(native: Gateway, upstream: FakeUpstream,
                                                    stream: bool) -> None:
    """A Responses upstream's error before the first byte is the SDK's error class, with
    the upstream's message."""
    upstream.push(Reply(status=400, json={"error": {
        "message": "Previous response with id 'resp_x' not found.",
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}}))
    async with sdk(native, "erin") as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="m", input="hi", stream=stream,
                                          previous_response_id="resp_x")
    assert "resp_x" in str(caught.value)
    assert upstream.paths[-1] == "/v1/responses"
