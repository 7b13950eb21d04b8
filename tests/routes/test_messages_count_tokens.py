"""``POST /v1/messages/count_tokens`` with the official Anthropic SDK as the client: the
prompt's tokens with the user's memory block, under the same identity rules as
``/v1/messages``; counting records nothing; errors are Anthropic's."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.fakes import FakeUpstream, Gateway
from tests.routes.test_messages import WEATHER_TOOL, ask, remember, sdk

QUESTION = ask("Where do I live?")


async def count(gw: Gateway, user: str | None = None, **kwargs: Any) -> int:
    async with sdk(gw, user) as client:
        result = await client.messages.count_tokens(model="m", messages=QUESTION, **kwargs)
    return result.input_tokens


async def test_memory_block_is_counted_for_a_user_with_memories(gateway: Gateway) -> None:
    """alice's count includes her memory block; a user without memories and a request
    without a user count the bare prompt, alike; turning memory off drops the block."""
    await remember(gateway, "alice", "Lives in Lisbon and cycles to work")
    bare = await count(gateway)
    assert bare > 0
    assert await count(gateway, "bob") == bare
    assert await count(gateway, "alice") > bare
    async with sdk(gateway, "alice") as client:
        off = await client.messages.count_tokens(model="m", messages=QUESTION,
                                                 extra_headers={"X-Memory": "off"})
    assert off.input_tokens == bare


async def test_the_user_comes_from_metadata_as_for_messages(gateway: Gateway) -> None:
    """``metadata.user_id`` names the user, as on ``/v1/messages``; the memory headers
    say what was counted."""
    await remember(gateway, "alice", "Lives in Lisbon and cycles to work")
    async with sdk(gateway) as client:
        raw = await client.messages.with_raw_response.count_tokens(
            model="m", messages=QUESTION, extra_body={"metadata": {"user_id": "alice"}})
    assert raw.headers["x-memory-injected"] == "1"
    assert (await raw.parse()).input_tokens > await count(gateway)


async def test_system_and_tools_are_counted(gateway: Gateway) -> None:
    """A system prompt and tool definitions add their tokens."""
    bare = await count(gateway)
    with_system = await count(gateway, system="You are a travel agent who answers briefly.")
    with_tools = await count(gateway, tools=[WEATHER_TOOL])
    assert with_system > bare
    assert with_tools > bare


async def test_counting_records_nothing(learning_gateway: Gateway,
                                        upstream: FakeUpstream) -> None:
    """No upstream call, no usage row, no access counted, nothing handed to learning."""
    gw = learning_gateway
    await remember(gw, "alice", "Lives in Lisbon and cycles to work")
    for _ in range(3):
        assert await count(gw, "alice") > 0
    assert gw.res.memory.access.pending == {}
    await gw.res.memory.access.flush(gw.res.store, gw.res.clock())
    await gw.res.usage.flush()
    await gw.settle()
    totals = await gw.res.ledger.usage_totals("default", "alice")
    assert (totals.requests, totals.prompt_tokens, totals.memory_tokens) == (0, 0, 0)
    assert upstream.chat_requests == []
    assert upstream.learning_calls == []
    async with gw.client() as client:
        listed = (await client.get("/v1/memories", headers={"X-User-Id": "alice"})).json()
    assert [m["access_count"] for m in listed["data"]] == [0]


@pytest.mark.parametrize("messages", [[], [{"role": "system", "content": "x"}]])
async def test_a_bad_body_is_an_anthropic_invalid_request_error(
    gateway: Gateway, messages: list[Any]
) -> None:
    """Empty ``messages`` or a bad role: the SDK's BadRequestError, Anthropic's shape."""
    async with sdk(gateway) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.count_tokens(model="m", messages=messages)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"


async def test_a_body_that_is_not_json_is_an_anthropic_400(gateway: Gateway) -> None:
    """Not JSON, or JSON but not an object: 400 ``invalid_request_error`` in Anthropic's
    shape, saying what the decoder found and where, or what to send."""
    async with gateway.client() as client:
        broken = await client.post("/v1/messages/count_tokens", content=b"[1, 2",
                                   headers={"content-type": "application/json"})
        listed = await client.post("/v1/messages/count_tokens", content=b"[1, 2]",
                                   headers={"content-type": "application/json"})
    assert broken.status_code == listed.status_code == 400
    assert broken.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "The request body is not valid JSON (unexpected end of data at position "
                   "5). Send a JSON object with 'model' and 'messages'."}}
    assert listed.json() == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "The request body must be a JSON object with 'model' and 'messages'."}}


async def test_an_unknown_model_is_an_anthropic_404(gateway: Gateway) -> None:
    """An unknown model: the SDK's NotFoundError, ``not_found_error``."""
    async with sdk(gateway) as client:
        with pytest.raises(anthropic.NotFoundError) as caught:
            await client.messages.count_tokens(model="nope", messages=QUESTION)
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
