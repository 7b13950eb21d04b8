"""``POST /v1/messages`` with the official Anthropic SDK as the client, against a chat
completions upstream: replies, streams, tool use, Anthropic's error shape, memory in
``system``, learning and isolation."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
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

TOOL_CALL = [{"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
WEATHER_TOOL = {"name": "get_weather", "description": "Weather now",
                "input_schema": {"type": "object",
                                 "properties": {"city": {"type": "string"}}}}


def sdk(gw: Gateway, user: str | None = None, key: str = "sk-client") -> anthropic.AsyncAnthropic:
    headers = {"X-User-Id": user} if user else {}
    return anthropic.AsyncAnthropic(base_url=gw.base_url, api_key=key, max_retries=0,
                                    default_headers=headers)


async def remember(gw: Gateway, user: str, content: str) -> None:
    async with gw.client() as client:
        response = await client.post("/v1/memories", json={"content": content},
                                     headers={"X-User-Id": user})
    assert response.status_code == 201, response.text


def ask(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def test_text_reply_is_an_anthropic_message(any_gateway: Gateway,
                                                  upstream: FakeUpstream) -> None:
    """``system`` and ``messages`` reach a chat upstream as chat messages; the reply is a
    Messages API object with usage and ``end_turn`` (relay and litellm transports)."""
    async with sdk(any_gateway) as client:
        message = await client.messages.create(model="m", max_tokens=64, system="Be brief.",
                                               messages=ask("ping"), stop_sequences=["##"])
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello there!"
    assert message.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 3)
    sent = upstream.last_chat
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "ping"}]
    assert (sent["max_completion_tokens"], sent["stop"]) == (64, ["##"])


async def test_stream_has_anthropics_event_sequence(gateway: Gateway,
                                                   upstream: FakeUpstream) -> None:
    """A streamed reply is ``message_start`` … ``message_stop``; the SDK's stream helper
    assembles the final message with usage."""
    upstream.push(Reply(events=[*text_chunks("Grüße, 世界!", pieces=3), usage_chunk(20, 5)]))
    async with sdk(gateway) as client, client.messages.stream(
            model="m", max_tokens=64, messages=ask("hi")) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].type == "text"
    assert final.content[0].text == "Grüße, 世界!"
    assert final.usage.output_tokens == 5
    assert final.stop_reason == "end_turn"


async def test_tool_use_round_trip(gateway: Gateway, upstream: FakeUpstream) -> None:
    """Tools go up as chat function tools, a tool call comes back as ``tool_use`` with its
    parsed input, and a ``tool_result`` goes back as a tool message."""
    upstream.push(Reply(json=completion_body("", tool_calls=TOOL_CALL)))
    async with sdk(gateway) as client:
        first = await client.messages.create(
            model="m", max_tokens=64, messages=ask("Weather in Paris?"),
            tools=[WEATHER_TOOL], tool_choice={"type": "any"})  # type: ignore[list-item]
        block = first.content[0]
        assert block.type == "tool_use"
        assert (block.id, block.name, block.input) == ("call_1", "get_weather",
                                                       {"city": "Paris"})
        assert first.stop_reason == "tool_use"
        assert upstream.last_chat["tool_choice"] == "required"
        assert upstream.last_chat["tools"][0]["function"]["parameters"] == \
            WEATHER_TOOL["input_schema"]
        await client.messages.create(model="m", max_tokens=64, messages=[
            *ask("Weather in Paris?"),
            {"role": "assistant", "content": [block.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                          "content": "18°C, sunny"}]},
        ])
    assert upstream.last_chat["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {**TOOL_CALL[0], "function": {"name": "get_weather",
                                          "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"}]


async def test_streamed_tool_call_is_a_tool_use_block(gateway: Gateway,
                                                     upstream: FakeUpstream) -> None:
    """Streamed tool-call fragments become one ``tool_use`` block of ``input_json_delta``s."""
    upstream.push(Reply(events=[
        chunk([{"index": 0, "delta": {"role": "assistant", "content": "Checking."},
                "finish_reason": None}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "id": "call_9", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": '}}]},
            "finish_reason": None}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{
            "index": 0, "function": {"arguments": '"Oslo"}'}}]}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        usage_chunk()]))
    async with sdk(gateway) as client, client.messages.stream(
            model="m", max_tokens=64, messages=ask("Oslo?"),
            tools=[WEATHER_TOOL]) as stream:  # type: ignore[list-item]
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    tool = final.content[1]
    assert tool.type == "tool_use"
    assert (tool.id, tool.input) == ("call_9", {"city": "Oslo"})
    assert final.stop_reason == "tool_use"


async def test_x_api_key_is_the_gateway_key_and_401_is_anthropic_shaped(
    tmp_path: Path,
) -> None:
    """``x-api-key`` authenticates like ``Authorization: Bearer``; a wrong key is a 401
    in Anthropic's error shape (the SDK's AuthenticationError)."""
    digest = hashlib.sha256(b"good-key").hexdigest()
    settings = make_settings(tmp_path, auth={"keys": [{"key_sha256": digest, "tenant": "t"}]})
    async with running_gateway(settings) as gw:
        async with sdk(gw, key="wrong") as client:
            with pytest.raises(anthropic.AuthenticationError) as caught:
                await client.messages.create(model="m", max_tokens=8, messages=ask("hi"))
        assert caught.value.body == {"type": "error", "error": {
            "type": "authentication_error", "message": "Incorrect API key provided."}}
        async with sdk(gw, key="good-key") as client:
            reply = await client.messages.create(model="m", max_tokens=8, messages=ask("hi"))
        assert reply.content[0].type == "text"


@pytest.mark.parametrize(("payload", "kind"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "invalid_request_error"),
    ({"max_tokens": 8, "messages": []}, "invalid_request_error"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]},
     "invalid_request_error"),
    ({"max_tokens": 8, "metadata": {"user_id": 5},
      "messages": [{"role": "user", "content": "x"}]}, "invalid_request_error"),
    ({"max_tokens": 8, "metadata": {"user_id": {"id": "alice"}},
      "messages": [{"role": "user", "content": "x"}]}, "invalid_request_error"),
])
async def test_bad_requests_are_anthropic_400s(gateway: Gateway, upstream: FakeUpstream,
                                               payload: dict[str, Any], kind: str) -> None:
    """A missing ``max_tokens``, empty ``messages``, a bad role or a ``metadata.user_id``
    that is not a string (never silently ignored) is a 400 in Anthropic's error shape;
    nothing reaches the upstream."""
    async with gateway.client() as client:
        response = await client.post("/v1/messages", json={"model": "m", **payload})
    assert response.status_code == 400
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == kind
    assert upstream.chat_requests == []


async def test_unknown_model_is_an_anthropic_404(gateway: Gateway) -> None:
    """An unknown model is the SDK's NotFoundError, in Anthropic's shape."""
    async with sdk(gateway) as client:
        with pytest.raises(anthropic.NotFoundError) as caught:
            await client.messages.create(model="nope", max_tokens=8, messages=ask("hi"))
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
async def test_error_before_the_first_byte_is_an_http_error(
    gateway: Gateway, upstream: FakeUpstream, stream: bool
) -> None:
    """An upstream 429 reaches the SDK as RateLimitError, streaming or not."""
    upstream.push(Reply(status=429, json={"error": {"message": "slow down",
                                                    "type": "rate_limit_error"}},
                        headers={"retry-after": "7"}))
    async with sdk(gateway) as client:
        with pytest.raises(anthropic.RateLimitError) as caught:
            await client.messages.create(model="m", max_tokens=8, messages=ask("hi"),
                                         stream=stream)
    assert caught.value.body["error"]["message"] == "slow down"  # type: ignore[index]
    assert caught.value.response.headers["retry-after"] == "7"


async def test_error_after_the_first_byte_is_an_error_event(gateway: Gateway,
                                                            upstream: FakeUpstream) -> None:
    """An upstream failure mid-stream ends the stream with Anthropic's ``error`` event,
    which the SDK raises."""
    upstream.push(Reply(events=[*text_chunks("partial answer")[:2],
                                {"error": {"message": "model crashed", "type": "server_error"}}],
                        done=False))
    seen: list[str] = []

    async def read(stream: Any) -> None:
        async for event in stream:
            seen.append(event.type)

    async with sdk(gateway) as client:
        stream = await client.messages.create(model="m", max_tokens=8, messages=ask("hi"),
                                              stream=True)
        with pytest.raises(anthropic.APIStatusError) as caught:
            await read(stream)
    assert seen[:2] == ["message_start", "content_block_start"]
    assert "model crashed" in str(caught.value)


async def test_memory_goes_to_system_and_is_isolated(gateway: Gateway,
                                                     upstream: FakeUpstream) -> None:
    """alice's memory is appended to her ``system`` text, after the cached block, whose
    ``cache_control`` prefix is unchanged; bob gets none of it."""
    await remember(gateway, "alice", "Lives in Lisbon and cycles to work")
    system = [{"type": "text", "text": "You are a travel agent.",
               "cache_control": {"type": "ephemeral"}}]
    async with sdk(gateway, "alice") as client:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=64, system=system,  # type: ignore[arg-type]
            messages=ask("Where do I live?"))
    assert raw.headers["x-memory-injected"] == "1"
    sent_system = upstream.last_chat["messages"][0]
    assert sent_system["role"] == "system"
    # An OpenAI-compatible upstream gets the text without cache_control, prefix first.
    assert sent_system["content"].startswith("You are a travel agent.\n\n" + BLOCK_START)
    assert "Lisbon" in sent_system["content"]
    async with sdk(gateway, "bob") as client:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=64, messages=ask("Where do I live?"))
    assert raw.headers["x-memory-injected"] == "0"
    assert "Lisbon" not in str(upstream.last_chat["messages"])
    await gateway.res.usage.flush()  # accounted as chat is: one row each, memory apart
    alice = await gateway.res.ledger.usage_totals("default", "alice")
    assert (alice.requests, alice.prompt_tokens, alice.completion_tokens) == (1, 12, 3)
    assert alice.memory_tokens > 0


async def test_cache_control_blocks_stay_whole_on_litellm_routes(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Through litellm (Anthropic models), system blocks keep ``cache_control`` and the
    memory is one more block after them; metadata.user_id names the user."""
    settings = make_settings(tmp_path, upstream={"transport": "litellm"},
                             memory={"position": "before_last_user"})
    async with running_gateway(settings, upstream) as gw:
        await remember(gw, "alice", "Lives in Lisbon and cycles to work")
        system = [{"type": "text", "text": "You are a travel agent.",
                   "cache_control": {"type": "ephemeral"}}]
        async with sdk(gw) as client:
            await client.messages.create(model="m", max_tokens=64, system=system,  # type: ignore[arg-type]
                                         metadata={"user_id": "alice"},
                                         messages=ask("Where do I live?"))
    sent_system = upstream.last_chat["messages"][0]
    assert sent_system["content"][0] == {"type": "text", "text": "You are a travel agent.",
                                         "cache_control": {"type": "ephemeral"}}
    assert sent_system["content"][1]["text"].startswith(BLOCK_START)
    assert "Lisbon" in sent_system["content"][1]["text"]
    assert upstream.last_chat["messages"][1] == {"role": "user",
                                                 "content": "Where do I live?"}


@pytest.mark.parametrize("stream", [False, True])
async def test_turns_are_learned(learning_gateway: Gateway, upstream: FakeUpstream,
                                 stream: bool) -> None:
    """A finished reply is handed to learning under ``metadata.user_id``; the memory is
    that user's alone and is recalled on the next request."""
    upstream.extract = lambda body: {"memories": [{
        "title": "Pet", "content": "Has a cat named Miso", "category": "user_preference",
        "subject": "user"}]}
    async with sdk(learning_gateway) as client:
        if stream:
            async with client.messages.stream(
                    model="m", max_tokens=64, metadata={"user_id": "carol"},
                    messages=ask("My cat is called Miso.")) as events:
                await events.get_final_message()
        else:
            await client.messages.create(model="m", max_tokens=64,
                                         metadata={"user_id": "carol"},
                                         messages=ask("My cat is called Miso."))
    await learning_gateway.settle()
    extract = [body for kind, body in upstream.learning_calls if kind == "extract"]
    assert "My cat is called Miso." in str(extract[-1]["messages"])
    async with learning_gateway.client() as client:
        mine = (await client.get("/v1/memories", headers={"X-User-Id": "carol"})).json()
        theirs = (await client.get("/v1/memories", headers={"X-User-Id": "dave"})).json()
    assert [m["content"] for m in mine["data"]] == ["Has a cat named Miso"]
    assert theirs["data"] == []


class BrokenUpstream:
    """An upstream with a bug of the gateway's own: every call raises a foreign error."""

    async def complete(self, call: Any) -> Any:
        raise RuntimeError("a bug, not an upstream failure")

    async def stream(self, call: Any) -> Any:
        raise RuntimeError("a bug, not an upstream failure")

    async def aclose(self) -> None:
        return None


async def test_other_methods_and_paths_are_anthropic_shaped(gateway: Gateway) -> None:
    """``GET /v1/messages`` is a 405 and an unknown path under it (the SDK's batches) the
    SDK's NotFoundError, both in Anthropic's error shape; other paths keep OpenAI's."""
    async with sdk(gateway) as client:
        with pytest.raises(anthropic.APIStatusError) as not_allowed:
            await client.get("/v1/messages", cast_to=object)
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await client.messages.batches.create(requests=[{
                "custom_id": "one", "params": {"model": "m", "max_tokens": 8,
                                               "messages": ask("hi")}}])
    assert not_allowed.value.status_code == 405
    assert not_allowed.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "Method GET is not allowed on /v1/messages."}}
    assert unknown.value.body == {"type": "error", "error": {
        "type": "not_found_error", "message": "Unknown path /v1/messages/batches."}}
    async with gateway.client() as client:
        elsewhere = await client.get("/v1/messagesx")
    assert elsewhere.status_code == 404
    assert elsewhere.json()["error"]["code"] == "unknown_url"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unexpected_failure_is_an_anthropic_500(gateway: Gateway,
                                                         stream: bool) -> None:
    """A foreign exception inside the handler is a 500 ``api_error`` in Anthropic's shape
    (the SDK's InternalServerError), streaming or not."""
    gateway.res.upstream = BrokenUpstream()
    async with sdk(gateway) as client:
        with pytest.raises(anthropic.InternalServerError) as caught:
            await client.messages.create(model="m", max_tokens=8, messages=ask("hi"),
                                         stream=stream)
    assert caught.value.body == {"type": "error", "error": {
        "type": "api_error", "message": "The gateway failed unexpectedly; see its logs."}}
