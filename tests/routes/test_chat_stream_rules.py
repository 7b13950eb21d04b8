"""Usage-chunk rules, error mapping before/after the first byte, and client disconnects."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from tests.fakes import FakeUpstream, Gateway, Reply, chunk, text_chunks, usage_chunk

REQUEST: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}]}


def events(body: str) -> list[Any]:
    out = []
    for line in body.split("\n\n"):
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


async def stream(gateway: Gateway, **extra: Any) -> httpx.Response:
    async with gateway.client() as client:
        return await client.post("/v1/chat/completions",
                                 json={**REQUEST, "stream": True, **extra})


# --------------------------------------------------------------------------- usage

USAGE_TAILS = {
    "separate, choices []": [*text_chunks("hi"), usage_chunk(12, 3)],
    "separate, placeholder choice": [
        *text_chunks("hi"),
        chunk([{"index": 0, "delta": {}}], usage={"prompt_tokens": 12, "completion_tokens": 3,
                                                  "total_tokens": 15}),
    ],
    "on the finish chunk": [
        *text_chunks("hi")[:-1],
        chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}],
              usage={"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}),
    ],
    "usage null on every chunk, then usage chunk": [
        *[{**c, "usage": None} for c in text_chunks("hi")], usage_chunk(12, 3)],
}


@pytest.mark.parametrize("tail", list(USAGE_TAILS), ids=list(USAGE_TAILS))
async def test_requested_usage_arrives_once_with_empty_choices(
    any_gateway: Gateway, upstream: FakeUpstream, tail: str
) -> None:
    """With include_usage exactly one usage chunk is sent: ``choices: []``, after the
    finish_reason chunk, before [DONE]; earlier chunks carry no usage. A public failure: the
    usage chunk carried a placeholder choice, so clients that spot it by ``choices == []``
    counted tokens twice."""
    upstream.push(Reply(events=USAGE_TAILS[tail]))
    got = events((await stream(any_gateway, stream_options={"include_usage": True})).text)
    assert got[-1] == "[DONE]"
    usage_chunks = [e for e in got[:-1] if e.get("usage")]
    assert len(usage_chunks) == 1
    assert got[-2] is usage_chunks[0]
    assert usage_chunks[0]["choices"] == []
    assert usage_chunks[0]["usage"]["total_tokens"] == 15
    finish_at = max(i for i, e in enumerate(got[:-1]) if e["choices"]
                    and e["choices"][0].get("finish_reason"))
    assert finish_at < len(got) - 2


@pytest.mark.parametrize("tail", list(USAGE_TAILS), ids=list(USAGE_TAILS))
async def test_unrequested_usage_is_stripped(
    any_gateway: Gateway, upstream: FakeUpstream, tail: str
) -> None:
    """Without include_usage no chunk carries usage, although the gateway asked upstream
    for it (for its own ledger): no usage-only chunk reaches a client that did not ask."""
    upstream.push(Reply(events=USAGE_TAILS[tail]))
    got = events((await stream(any_gateway)).text)
    assert got[-1] == "[DONE]"
    assert all(not e.get("usage") for e in got[:-1])
    assert all(e["choices"] for e in got[:-1])
    assert upstream.last_chat["stream_options"] == {"include_usage": True}


async def test_usage_is_made_when_upstream_sends_none(
    any_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """An upstream that ignores include_usage still yields one usage chunk, counted by the
    gateway's tokenizer."""
    upstream.push(Reply(events=text_chunks("Hello there, friend.")))
    got = events((await stream(any_gateway, stream_options={"include_usage": True})).text)
    usage = got[-2]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] > 0
    assert usage["usage"]["prompt_tokens"] > 0


async def test_a_made_usage_chunk_counts_tool_calls_and_names_the_stream(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A reply of tool calls only, from an upstream whose chunks carry no id, created or
    model and no usage: the usage chunk the gateway makes counts the calls' names and
    arguments as completion tokens and still has an id, a time and the model."""
    bare = [{"object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}]},
         "finish_reason": None}]},
        {"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
    upstream.push(Reply(events=bare))
    got = events((await stream(gateway, stream_options={"include_usage": True})).text)
    usage = got[-2]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] >= 5
    assert usage["id"].startswith("chatcmpl-")
    assert usage["created"] > 1_700_000_000
    assert usage["model"] == "m"


async def test_usage_ledger_separates_memory_tokens(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Each request adds one usage row: upstream tokens plus, apart, memory tokens."""
    async with gateway.client() as client:
        await client.post("/v1/chat/completions", json=REQUEST, headers={"X-User-Id": "u1"})
    await gateway.res.usage.flush()
    totals = await gateway.res.ledger.usage_totals("default", "u1")
    assert totals.requests == 1
    assert totals.prompt_tokens == 12
    assert totals.completion_tokens == 3
    assert (await gateway.res.ledger.learning_totals("default", "u1")).requests == 0


# ------------------------------------------------------------- errors before first byte

ERRORS = [
    (400, {"error": {"message": "bad param", "type": "invalid_request_error",
                     "param": "temperature", "code": "invalid_value"}}, {}),
    (401, {"error": {"message": "bad key", "type": "invalid_request_error",
                     "code": "invalid_api_key"}}, {}),
    (404, {"error": {"message": "no such model", "type": "invalid_request_error",
                     "code": "model_not_found"}}, {}),
    (408, {"error": {"message": "timed out", "type": "timeout"}}, {}),
    (429, {"error": {"message": "slow down", "type": "rate_limit_error",
                     "code": "rate_limit_exceeded"}}, {"retry-after": "7"}),
    (500, {"error": {"message": "boom", "type": "server_error"}}, {}),
    (503, {"error": {"message": "overloaded", "type": "server_error"}}, {}),
]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("status", "body", "headers"), ERRORS,
                         ids=[str(e[0]) for e in ERRORS])
async def test_upstream_errors_keep_status_and_envelope(
    any_gateway: Gateway, upstream: FakeUpstream, *, status: int, body: dict[str, Any],
    headers: dict[str, str], streamed: bool,
) -> None:
    """Errors before the first byte keep the upstream's status, message, code and
    Retry-After, in OpenAI's envelope — streaming or not."""
    upstream.push(Reply(status=status, json=body, headers=headers))
    async with any_gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={**REQUEST,
                                                                   "stream": streamed})
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    if status == 401:
        # The gateway's own upstream key was refused: a gateway problem, not the client's.
        assert response.status_code == 502
        assert error["code"] == "upstream_auth_failed"
        assert body["error"]["message"] in error["message"]
        return
    assert response.status_code == status
    assert error["message"] == body["error"]["message"]
    if "code" in body["error"]:
        assert error["code"] == body["error"]["code"]
    if headers:
        assert response.headers["retry-after"] == "7"


async def test_upstream_refusing_the_clients_own_key_is_401(
    tmp_path: Any, upstream: FakeUpstream
) -> None:
    """With bring-your-own-key the client's key goes upstream, and its refusal is the
    client's 401."""
    from tests.fakes import make_settings, running_gateway

    upstream.push(Reply(status=401, json={"error": {"message": "bad key",
                                                    "code": "invalid_api_key"}}))
    settings = make_settings(tmp_path, auth={"forward_client_key": True})
    async with running_gateway(settings, upstream) as gateway, gateway.client() as client:
        response = await client.post("/v1/chat/completions", json=REQUEST,
                                     headers={"Authorization": "Bearer sk-client-own"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert upstream.headers[-1]["authorization"] == "Bearer sk-client-own"


async def test_error_event_before_content_becomes_http_error(
    any_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """An overflow reported inside a 200 stream before any content becomes HTTP 400 JSON
    with ``context_length_exceeded``. A public failure: an overflowing streamed request got
    200 with the error inside the SSE body, and the SDK kept waiting instead of raising."""
    upstream.push(Reply(events=[{"error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error", "code": "context_length_exceeded"}}]))
    response = await stream(any_gateway)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


async def test_error_after_first_byte_ends_stream_with_error_event(
    any_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A failure mid-stream ends the stream with an error event, then ``[DONE]`` (once), so
    a client that waits for ``[DONE]`` does not hang."""
    upstream.push(Reply(events=[*text_chunks("partial")[:2], {"error": {
        "message": "upstream crashed", "type": "server_error"}}], done=False))
    response = await stream(any_gateway)
    assert response.status_code == 200
    got = events(response.text)
    assert got[-2]["error"]["message"] == "upstream crashed"
    assert got[-1] == "[DONE]"
    assert got.count("[DONE]") == 1


async def test_truncated_stream_ends_with_error_event_then_done(
    any_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """An upstream stream that stops after content without finish_reason or [DONE] ends
    with the gateway's error event (the relay names it ``stream_truncated``), then
    ``[DONE]``."""
    upstream.push(Reply(events=text_chunks("partial")[:2], done=False))
    response = await stream(any_gateway)
    got = events(response.text)
    assert "error" in got[-2]
    assert got[-1] == "[DONE]"


async def test_mid_stream_timeout_ends_with_error_event_then_done(tmp_path: Any) -> None:
    """On the relay, when the upstream goes silent after content for longer than its
    timeout, the gateway ends the stream itself with a timeout error event, then
    ``[DONE]``."""
    from tests.fakes import make_settings, running_gateway

    fake = FakeUpstream()
    fake.push(Reply(events=text_chunks("partial")[:2], done=False, hang=True))
    settings = make_settings(tmp_path, upstream={"timeout_seconds": 0.5})
    async with running_gateway(settings, fake) as gw:
        response = await asyncio.wait_for(stream(gw), 20)
    got = events(response.text)
    assert "error" in got[-2]
    assert got[-1] == "[DONE]"


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/responses", {"model": "m", "input": "hi", "stream": True}),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "stream": True,
                      "messages": [{"role": "user", "content": "hi"}]}),
], ids=["responses", "messages"])
async def test_other_protocols_end_a_failed_stream_without_chat_done(
    gateway: Gateway, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    """The Responses and Messages streams end a mid-stream failure with their own error
    events; the chat-completions terminator ``[DONE]`` is not theirs and never appears."""
    upstream.push(Reply(events=[*text_chunks("partial")[:2], {"error": {
        "message": "upstream crashed", "type": "server_error"}}], done=False))
    async with gateway.client() as client:
        response = await client.post(path, json=body)
    assert "upstream crashed" in response.text
    assert "[DONE]" not in response.text


async def test_openai_sdk_raises_on_mid_stream_error(
    any_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """The SDK turns the final error event into an exception instead of hanging."""
    from openai import APIError, AsyncOpenAI

    upstream.push(Reply(events=[*text_chunks("partial")[:2], {"error": {
        "message": "upstream crashed", "type": "server_error"}}], done=False))
    client = AsyncOpenAI(base_url=any_gateway.base_url + "/v1", api_key="x", max_retries=0)
    stream_ = await client.chat.completions.create(model="m", stream=True,
                                                   messages=REQUEST["messages"])
    with pytest.raises(APIError, match="upstream crashed"):
        async for _ in stream_:
            pass
    await client.close()


async def test_unreachable_upstream_is_502(tmp_path: Any) -> None:
    """A connection failure to the upstream is a 502 envelope."""
    from tests.fakes import make_settings, running_gateway

    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    fake = FakeUpstream()
    fake.intercept = refuse
    async with running_gateway(make_settings(tmp_path), fake) as gw, gw.client() as client:
        response = await client.post("/v1/chat/completions", json=REQUEST)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_unavailable"


# --------------------------------------------------------------------- disconnects

async def _wait_closed(upstream: FakeUpstream, *, within: float = 1.5) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while upstream.closed_streams < 1:
        assert asyncio.get_running_loop().time() < deadline, "upstream was not closed"
        await asyncio.sleep(0.02)


async def test_disconnect_before_first_byte_cancels_upstream(
    learning_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A client that leaves before any byte arrived closes the upstream stream within a
    second, and nothing is queued for learning. A public failure: a proxy kept waiting on
    the upstream after the client left, billing tokens for a reply nobody read."""
    upstream.push(Reply(events=text_chunks("late"), delay=30))
    async with learning_gateway.client() as client:
        request = asyncio.create_task(client.post(
            "/v1/chat/completions", headers={"X-User-Id": "u1"},
            json={**REQUEST, "stream": True}))
        await asyncio.sleep(0.3)
        request.cancel()
    await _wait_closed(upstream)
    await learning_gateway.res.sink.flush()
    assert (await learning_gateway.res.queue.depth()).ready == 0  # type: ignore[union-attr]


async def test_disconnect_mid_stream_cancels_upstream(
    learning_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A client that leaves after reading 5 chunks closes the upstream stream, and the
    aborted reply is not learned as a finished exchange."""
    upstream.push(Reply(events=text_chunks("x" * 200, pieces=100), gap=0.05))
    await _read_five_then_leave(learning_gateway)
    await _wait_closed(upstream)
    await learning_gateway.res.sink.flush()
    assert (await learning_gateway.res.queue.depth()).ready == 0  # type: ignore[union-attr]


async def test_disconnect_mid_stream_closes_upstream_on_every_transport(
    any_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """The relay and the litellm path both close the upstream stream when the client
    leaves, so no upstream generation outlives its reader."""
    upstream.push(Reply(events=text_chunks("x" * 200, pieces=100), gap=0.05))
    await _read_five_then_leave(any_gateway)
    await _wait_closed(upstream)


async def _read_five_then_leave(gateway: Gateway) -> None:
    async with gateway.client() as client, client.stream(
        "POST", "/v1/chat/completions", headers={"X-User-Id": "u1"},
        json={**REQUEST, "stream": True},
    ) as response:
        seen = 0
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen += 1
            if seen == 5:
                break


async def test_disconnect_during_non_streaming_call_cancels_upstream(
    learning_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A non-streaming client that gives up cancels the upstream call (a middleware that hid
    ``http.disconnect`` once let such calls run to the end)."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("the upstream call was not cancelled")

    upstream.intercept = slow
    async with learning_gateway.client() as client:
        request = asyncio.create_task(client.post(
            "/v1/chat/completions", json=REQUEST, headers={"X-User-Id": "u1"}))
        await started.wait()
        await asyncio.sleep(0.2)
        request.cancel()
    await asyncio.wait_for(cancelled.wait(), 1.5)
    await learning_gateway.res.sink.flush()
    assert (await learning_gateway.res.queue.depth()).ready == 0  # type: ignore[union-attr]


OVERFLOW = {"error": {"message": "This model's maximum context length is 8192 tokens.",
                      "type": "invalid_request_error", "code": "context_length_exceeded"}}


@pytest.mark.parametrize("streamed", [True, False], ids=["stream", "json"])
async def test_a_turn_the_upstream_refused_queues_no_learning(
    learning_gateway: Gateway, upstream: FakeUpstream, streamed: bool
) -> None:
    """An overflow the upstream reports — as the stream's first event or as a 400 — is a
    400 for the client and queues nothing for learning; the same turn answered queues
    one exchange."""
    upstream.push(Reply(events=[OVERFLOW]) if streamed else Reply(status=400, json=OVERFLOW))
    async with learning_gateway.client(headers={"X-User-Id": "u1"}) as client:
        refused = await client.post("/v1/chat/completions",
                                    json={**REQUEST, "stream": streamed})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        await learning_gateway.res.sink.flush()
        assert (await learning_gateway.res.queue.depth()).ready == 0  # type: ignore[union-attr]
        answered = await client.post("/v1/chat/completions",
                                     json={**REQUEST, "stream": streamed})
        assert answered.status_code == 200
    await learning_gateway.res.sink.flush()
    assert (await learning_gateway.res.queue.depth()).ready == 1  # type: ignore[union-attr]
