"""Memories added by hand or imported carry a date and a conversation, as learned ones do:
``created_at`` in the body (validated, not in the future beyond the allowed clock skew)
and the request's ``X-Conversation-Id`` — on both backends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.memory.records import from_iso
from proxy.routes.shapes import MAX_CLOCK_SKEW
from tests.fakes import Gateway
from tests.routes.test_user_memory import U1, add, call, error, gw  # noqa: F401

CONV = {**U1, "X-Conversation-Id": "trip-planning"}


def at(memory: dict[str, Any], name: str) -> datetime:
    value = from_iso(memory[name])
    assert value is not None
    return value


async def test_an_added_memory_takes_the_given_date_and_the_conversation(
        gw: Gateway) -> None:  # noqa: F811
    memory = await add(gw, "Prefers window seats", CONV,
                       created_at="2024-07-20T09:30:00+08:00")
    assert at(memory, "created_at") == datetime(2024, 7, 20, 1, 30, tzinfo=UTC)
    assert at(memory, "last_seen_at") == at(memory, "created_at")
    assert memory["source_conversation_id"] == "trip-planning"
    [listed] = (await call(gw, "GET", "/v1/memories", U1)).json()["data"]
    assert (listed["created_at"], listed["source_conversation_id"]) == (
        memory["created_at"], "trip-planning")


async def test_without_them_the_memory_is_dated_now_with_no_conversation(
        gw: Gateway) -> None:  # noqa: F811
    before = datetime.now(UTC) - timedelta(seconds=5)
    memory = await add(gw, "Prefers aisle seats")
    assert at(memory, "created_at") >= before
    assert memory["source_conversation_id"] is None
    naive = await add(gw, "Lives in Lyon", created_at="2023-01-02T03:04:05")
    assert at(naive, "created_at") == datetime(2023, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_a_bad_or_future_created_at_is_a_400_naming_it(gw: Gateway) -> None:  # noqa: F811
    soon = (datetime.now(UTC) + MAX_CLOCK_SKEW / 5).isoformat()
    assert at(await add(gw, "Has a dentist appointment", created_at=soon),
              "created_at") > datetime.now(UTC)
    for bad in ("yesterday", "2024-13-01T00:00:00Z",
                (datetime.now(UTC) + MAX_CLOCK_SKEW * 2).isoformat()):
        response = await call(gw, "POST", "/v1/memories", U1,
                              json={"content": "Likes tea", "created_at": bad})
        body = error(response, 400)
        assert (body["param"], body["type"], body["code"]) == (
            "created_at", "invalid_request_error", "invalid_value"), bad
    response = await call(gw, "POST", "/v1/memories", U1,
                          json={"content": "Likes tea", "created_at": 20240101})
    assert error(response, 400)["param"] == "created_at"
    long = {**U1, "X-Conversation-Id": "c" * 300}
    response = await call(gw, "POST", "/v1/memories", long, json={"content": "Likes tea"})
    assert error(response, 400)["param"] == "X-Conversation-Id"
    assert (await call(gw, "GET", "/v1/memories", U1)).json()["data"][0]["content"] == \
        "Has a dentist appointment"


async def test_import_takes_mem0_dates_and_the_request_conversation(
        gw: Gateway) -> None:  # noqa: F811
    future = (datetime.now(UTC) + timedelta(days=3)).isoformat()
    response = await call(gw, "POST", "/v1/memories/import", CONV, json={"results": [
        {"id": "a", "memory": "Is vegetarian", "created_at": "2024-07-20T01:30:00.000000-07:00",
         "updated_at": "2024-08-01T00:00:00Z"},
        {"id": "b", "memory": "Plays the cello", "created_at": future},
        {"id": "c", "memory": "Has a dog named Rex"},
    ]})
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["imported"] == 2
    assert [(r["index"], r["reason"]) for r in result["rejected"]] == [(1, "invalid_value")]
    assert "future" in result["rejected"][0]["message"]
    memories = {m["content"]: m for m in
                (await call(gw, "GET", "/v1/memories", U1)).json()["data"]}
    veg = memories["Is vegetarian"]
    assert at(veg, "created_at") == datetime(2024, 7, 20, 8, 30, tzinfo=UTC)
    assert at(veg, "last_seen_at") == datetime(2024, 8, 1, tzinfo=UTC)
    assert {m["source_conversation_id"] for m in memories.values()} == {"trip-planning"}


async def test_an_imported_item_keeps_its_own_conversation(gw: Gateway) -> None:  # noqa: F811
    response = await call(gw, "POST", "/v1/memories/import", CONV, json={
        "object": "memory.export", "memories": [
            {"content": "Speaks Portuguese", "source_conversation_id": "lessons"},
            {"content": "Learns the piano"}]})
    assert response.status_code == 200, response.text
    found = {m["content"]: m["source_conversation_id"] for m in
             (await call(gw, "GET", "/v1/memories", U1)).json()["data"]}
    assert found == {"Speaks Portuguese": "lessons", "Learns the piano": "trip-planning"}
