"""Chat completions pass through unchanged: bodies, SSE frames, fields, content types."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.fakes import (
    FakeUpstream,
    Gateway,
    Reply,
    chunk,
    completion_body,
    text_chunks,
    usage_chunk,
)


def data_lines(body: str) -> list[str]:
    return [line[len("data: "):] for line in body.split("\n\n") if line.startswith("data: ")]


@pytest.mark.parametrize("stream_field", ["absent", None, False])
async def test_non_streaming_when_stream_is_absent_null_or_false(
    gateway: Gateway, stream_field: Any
) -> None:
    """An absent, null or false ``stream`` gets one JSON chat.completion. A public failure: a
    proxy that treated a missing ``stream`` as streaming broke clients parsing JSON."""
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "ping"}]}
    if stream_field != "absent":
        body["stream"] = stream_field
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["content"] == "Hello there!"
    assert "stream_options" not in gateway.upstream.last_chat


async def test_non_streaming_body_is_returned_byte_for_byte(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """The upstream's JSON body reaches the client unchanged, unknown fields included."""
    raw = completion_body("Hi 👋 — 你好")
    raw["system_fingerprint"] = "fp_x"
    raw["provider_extra"] = {"nested": [1, 2]}
    upstream.push(Reply(json=raw))
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert response.content == orjson.dumps(raw)


async def test_stream_frames_are_forwarded_unchanged(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Each upstream event reaches the client as the same ``data:`` line, then [DONE]."""
    events = text_chunks("Grüße, 世界! 🚀", pieces=5)
    upstream.push(Reply(events=events))
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = data_lines(response.text)
    assert lines[-1] == "[DONE]"
    assert [orjson.loads(x) for x in lines[:-1]] == events
    assert "".join(
        c["choices"][0]["delta"].get("content", "") for c in events
    ) == "Grüße, 世界! 🚀"


async def test_every_request_field_passes_through(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Tools, response_format, n, stop, seed, logprobs, image parts and unknown fields reach
    the upstream as sent; only ``model`` is mapped to the deployment's id."""
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                                    "detail": "low"}},
            ]},
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "parameters": {"type": "object", "properties": {}}}}],
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "n": 2, "stop": ["\n\n"], "seed": 7, "logprobs": True, "top_logprobs": 2,
        "max_completion_tokens": 50, "temperature": 0.3, "parallel_tool_calls": False,
        "future_openai_field": {"anything": True},
    }
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    sent = upstream.last_chat
    assert sent["model"] == "up-model"
    for key, value in body.items():
        if key not in ("model", "messages"):
            assert sent[key] == value, key
    assert sent["messages"] == body["messages"]


async def test_tool_call_turn_with_null_content_is_accepted(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """An assistant tool-call turn with ``content: null`` and a tool result are accepted and
    forwarded unchanged. A public failure: a server that typed ``content`` as a string
    rejected the second request of every tool-using conversation with 422."""
    messages = [
        {"role": "user", "content": "Weather in City A?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"City A\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, cloudy"},
    ]
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": messages, "tools": [{"type": "function", "function": {
                "name": "get_weather", "parameters": {"type": "object"}}}]},
            headers={"X-User-Id": "u1"})
    assert response.status_code == 200
    assert upstream.last_chat["messages"] == messages


@pytest.mark.parametrize("variant", ["whole_calls_same_index", "fragmented"])
async def test_tool_call_deltas_stream_unchanged(
    gateway: Gateway, upstream: FakeUpstream, variant: str
) -> None:
    """Tool-call chunks reach the client as sent, indices untouched (parallel calls that
    share ``index: 0`` are never merged or renumbered)."""
    if variant == "whole_calls_same_index":
        events = [
            chunk([{"index": 0, "delta": {"role": "assistant", "tool_calls": [{
                "index": 0, "id": "call_a", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"City A\"}"}}]}}]),
            chunk([{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "id": "call_b", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"City B\"}"}}]}}]),
            chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        ]
    else:
        events = [
            chunk([{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "id": "call_x", "type": "function",
                "function": {"name": "lookup", "arguments": ""}}]}}]),
            chunk([{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "function": {"arguments": "{\"q\":"}}]}}]),
            chunk([{"index": 0, "delta": {"tool_calls": [{
                "index": 0, "function": {"arguments": "\"abc\"}"}}]}}]),
            chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        ]
    upstream.push(Reply(events=events))
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]})
    assert [orjson.loads(x) for x in data_lines(response.text)[:-1]] == events


async def test_multiple_choices_stream_unchanged(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """``n > 1`` streams keep every choice's chunks in order."""
    events = text_chunks("one", n=2)
    upstream.push(Reply(events=events))
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "stream": True, "n": 2,
            "messages": [{"role": "user", "content": "go"}]})
    assert [orjson.loads(x) for x in data_lines(response.text)[:-1]] == events


async def test_models_lists_configured_names(gateway: Gateway) -> None:
    """``GET /v1/models`` lists model_list names in OpenAI's shape."""
    async with gateway.client() as client:
        response = await client.get("/v1/models")
    assert response.json()["object"] == "list"
    assert [m["id"] for m in response.json()["data"]] == ["m"]


async def test_openai_sdk_streams_and_completes(gateway: Gateway) -> None:
    """The official SDK works unchanged against the gateway, streaming and not."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
    completion = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], user="alice")
    assert completion.choices[0].message.content == "Hello there!"
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], user="alice", stream=True,
        stream_options={"include_usage": True})
    text, usage = "", None
    async for part in stream:
        if part.choices:
            text += part.choices[0].delta.content or ""
        if part.usage:
            usage = part.usage
    assert text == "Hello there!"
    assert usage is not None
    assert usage.total_tokens == 15
    await client.close()


@pytest.mark.parametrize(("given", "expected"), [
    (b"{not json", "invalid_json"),
    (b"[]", "invalid_json"),
    (orjson.dumps({"messages": [{"role": "user", "content": "x"}]}), "model"),
    (orjson.dumps({"model": "m"}), "messages"),
    (orjson.dumps({"model": "m", "messages": []}), "messages"),
    (orjson.dumps({"model": "m", "messages": ["hi"]}), "messages[0]"),
    (orjson.dumps({"model": "m", "messages": [{"content": "x"}]}), "messages[0].role"),
    (orjson.dumps({"model": "m", "messages": [{"role": "user", "content": 5}]}),
     "messages[0].content"),
    (orjson.dumps({"model": "m", "stream": "yes",
                   "messages": [{"role": "user", "content": "x"}]}), "stream"),
])
async def test_malformed_bodies_get_400_envelope(
    gateway: Gateway, upstream: FakeUpstream, given: bytes, expected: str
) -> None:
    """Malformed bodies get 400 in OpenAI's envelope naming the problem; nothing is sent
    upstream."""
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", content=given,
                                     headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert expected in (error["param"] or error["code"])
    assert upstream.requests == []


async def test_unknown_model_is_404(gateway: Gateway) -> None:
    """A model not in model_list is a 404 ``model_not_found`` envelope."""
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


async def test_unknown_path_is_404_envelope(gateway: Gateway) -> None:
    """Unknown paths answer in the same error envelope."""
    async with gateway.client() as client:
        response = await client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


async def test_usage_chunk_from_upstream_is_relayed(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """With include_usage the upstream's usage chunk is relayed after the finish chunk."""
    upstream.push(Reply(events=[*text_chunks("ok"), usage_chunk(20, 2)]))
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "x"}]})
    lines = data_lines(response.text)
    assert orjson.loads(lines[-2])["usage"]["total_tokens"] == 22
