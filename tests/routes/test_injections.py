"""Explainable replies on both backends: a reply that injected memory names its injection
record (``X-Memory-Injection-Id``), ``GET /v1/memories/injections/{id}`` explains it by ids,
fields, ranks, scores and reasons (never text), for its user only, within the retention
window and the per-user cap, unless the tenant switched records off; erasure removes them;
``POST /v1/memories/preview`` shows what recall would inject and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.memory.records import Profile, ScoredTag, from_iso, utcnow
from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway

ALICE = {"X-User-Id": "alice", "X-Conversation-Id": "conv-1"}
BOB = {"X-User-Id": "bob"}
ADMIN = {"Authorization": "Bearer admin-explain"}
TEA = "Drinks green tea every morning"
QUESTION = "What do I drink in the morning?"


class Clock:
    """A clock the test moves (records are stamped and read by it)."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now


Build = Callable[..., Any]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def build(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Build:
    """Settings on the fixture's backend with an admin key of the open tenant."""
    monkeypatch.setenv("K_EXPLAIN_ADMIN", "admin-explain")
    storage = backend_overrides(request, tmp_path)

    def settings(**overrides: Any) -> Any:
        return make_settings(tmp_path, auth={"admin_keys": [
            {"key": "os.environ/K_EXPLAIN_ADMIN", "tenant": "default", "name": "ops"}]},
            **storage, **overrides)
    return settings


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def gw(build: Build, upstream: FakeUpstream, clock: Clock) -> AsyncIterator[Gateway]:
    async with running_gateway(build(), upstream, clock=clock) as gateway:
        await add(gateway, TEA)
        yield gateway


async def add(gw: Gateway, content: str, user: str = "alice") -> str:
    async with gw.client(headers={"X-User-Id": user}) as client:
        response = await client.post("/v1/memories", json={"content": content})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


async def chat(gw: Gateway, text: str = QUESTION,
               headers: dict[str, str] = ALICE) -> httpx.Response:
    async with gw.client(headers=headers) as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": text}]})
        assert response.status_code == 200, response.text
        return response


async def flushed(gw: Gateway) -> None:
    """Write the buffered records now (the app does it every second)."""
    await gw.res.memory.injections.flush(gw.res.store, gw.res.clock())


async def read(gw: Gateway, injection_id: str,
               headers: dict[str, str] = ALICE) -> httpx.Response:
    async with gw.client(headers=headers) as client:
        return await client.get(f"/v1/memories/injections/{injection_id}")


async def test_a_reply_names_its_record_and_the_record_explains_it(gw: Gateway) -> None:
    response = await chat(gw)
    injection_id = response.headers["x-memory-injection-id"]
    assert response.headers["x-memory-injected"] == "1"
    await flushed(gw)
    found = await read(gw, injection_id)
    assert found.status_code == 200, found.text
    record = found.json()
    assert record["id"] == injection_id
    assert record["request"] == {"model": "m", "conversation_id": "conv-1",
                                 "channel": "private"}
    [item] = record["items"]
    async with gw.client(headers=ALICE) as client:
        [memory] = (await client.get("/v1/memories")).json()["data"]
    assert item["kind"] == "memory"
    assert item["memory_id"] == memory["id"]
    assert item["rank"] == 1
    assert item["score"] > 0
    assert "keyword" in item["reasons"]
    assert "resident" not in item["reasons"]
    # Ids and scores only: neither the memory's text nor the prompt.
    assert "green tea" not in found.text
    assert "drink" not in found.text


async def test_a_record_is_found_the_moment_its_reply_arrives(gw: Gateway) -> None:
    """The id a reply just carried is found at once, its record written from the buffer
    for the read (the background writes it within a second); another user asking for it
    finds nothing and writes nothing. Five replies: the background flush may land between
    a reply and a read, but not in all five windows."""
    log = gw.res.memory.injections
    seen: list[tuple[bool, bool]] = []  # per reply: buffered before / after Bob's read
    for _ in range(5):
        injection_id = (await chat(gw)).headers["x-memory-injection-id"]
        before = log.holds("default", "alice", injection_id)
        assert (await read(gw, injection_id, BOB)).status_code == 404
        seen.append((before, log.holds("default", "alice", injection_id)))
        found = await read(gw, injection_id)
        assert found.status_code == 200, found.text
        assert found.json()["id"] == injection_id
        assert not log.holds("default", "alice", injection_id)
    assert (True, True) in seen, seen


class SteppingClock(Clock):
    """A clock a week later at every reading while ``step`` is on."""

    step = False

    def __call__(self) -> datetime:
        if self.step:
            self.now += timedelta(weeks=1)
        return self.now


async def test_a_records_time_is_the_moment_its_items_were_scored(
        build: Build, upstream: FakeUpstream) -> None:
    """The block's tag decay, the items' scores and the record's time share one reading of
    the clock: with a clock a week later at every reading, a trait's recorded score is its
    effective score (score × 0.9^weeks) at the record's own time, not a week before or
    after it."""
    clock = SteppingClock()
    settings = build(memory={"injection_retention_days": 365})
    async with running_gateway(settings, upstream, clock=clock) as gw:
        stamped = clock.now
        await gw.res.store.put_profile(Profile(
            tenant="default", user_id="alice",
            traits=(ScoredTag("curious", 0.8, 3, stamped),)))
        await add(gw, TEA)
        clock.step = True
        injection_id = (await chat(gw)).headers["x-memory-injection-id"]
        clock.step = False
        await flushed(gw)
        record = (await read(gw, injection_id)).json()
    created = from_iso(record["created_at"])
    assert created is not None
    weeks = (created - stamped) / timedelta(weeks=1)
    assert weeks >= 1  # the clock was read before the block was fitted
    [trait] = [i for i in record["items"] if i.get("field") == "traits[0]"]
    assert trait["score"] == pytest.approx(0.8 * 0.9 ** weeks, abs=1e-4)
    assert trait["score"] != pytest.approx(0.8 * 0.9 ** (weeks - 1), abs=1e-3)
    assert [i["kind"] for i in record["items"]] == ["profile", "memory"]


async def test_no_memory_no_record(gw: Gateway) -> None:
    response = await chat(gw, headers=BOB)
    assert response.headers["x-memory-injected"] == "0"
    assert "x-memory-injection-id" not in response.headers
    assert gw.res.memory.injections.pending == []


async def test_a_record_is_its_users_alone(gw: Gateway) -> None:
    injection_id = (await chat(gw)).headers["x-memory-injection-id"]
    await flushed(gw)
    assert (await read(gw, injection_id, BOB)).status_code == 404
    missing = await read(gw, "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "injection_not_found"
    assert (await read(gw, "../etc")).status_code == 404
    # An admin of the tenant may read it for the user, and only for that user.
    assert (await read(gw, injection_id, {**ADMIN, "X-User-Id": "alice"})).status_code == 200
    assert (await read(gw, injection_id, {**ADMIN, "X-User-Id": "bob"})).status_code == 404


async def test_responses_and_messages_replies_carry_the_header(gw: Gateway) -> None:
    async with gw.client(headers=ALICE) as client:
        answer = await client.post("/v1/messages", json={
            "model": "m", "max_tokens": 50,
            "messages": [{"role": "user", "content": QUESTION}]})
        assert answer.status_code == 200, answer.text
        other = await client.post("/v1/responses", json={"model": "m", "input": QUESTION})
        assert other.status_code == 200, other.text
    ids = {answer.headers["x-memory-injection-id"], other.headers["x-memory-injection-id"]}
    assert len(ids) == 2
    await flushed(gw)
    for injection_id in ids:
        assert (await read(gw, injection_id)).status_code == 200


async def test_records_expire_after_the_retention_window(gw: Gateway, clock: Clock) -> None:
    injection_id = (await chat(gw)).headers["x-memory-injection-id"]
    await flushed(gw)
    clock.now += timedelta(days=6)
    assert (await read(gw, injection_id)).status_code == 200
    clock.now += timedelta(days=1, seconds=1)
    assert (await read(gw, injection_id)).status_code == 404


async def test_at_most_n_records_per_user_oldest_dropped(
        build: Build, upstream: FakeUpstream, clock: Clock) -> None:
    async with running_gateway(build(memory={"injections_per_user": 2}), upstream,
                               clock=clock) as gw:
        await add(gw, TEA)
        await add(gw, "Has a dog named Biscuit", user="bob")
        ids = []
        for _ in range(3):
            ids.append((await chat(gw)).headers["x-memory-injection-id"])
            clock.now += timedelta(seconds=1)
            await flushed(gw)
        bob = (await chat(gw, "my dog?", BOB)).headers["x-memory-injection-id"]
        await flushed(gw)
        assert (await read(gw, ids[0])).status_code == 404
        assert [(await read(gw, i)).status_code for i in ids[1:]] == [200, 200]
        assert (await read(gw, bob, BOB)).status_code == 200  # another user's cap


async def test_a_tenant_may_switch_records_off(gw: Gateway) -> None:
    async with gw.client(headers=ADMIN) as client:
        changed = await client.patch("/v1/admin/settings",
                                     json={"memory.record_injections": False})
        assert changed.status_code == 200, changed.text
    response = await chat(gw)
    assert response.headers["x-memory-injected"] == "1"  # memory still injected
    assert "x-memory-injection-id" not in response.headers
    assert gw.res.memory.injections.pending == []
    async with gw.client(headers=ADMIN) as client:
        back = await client.patch("/v1/admin/settings",
                                  json={"memory.record_injections": None})
        assert back.status_code == 200
    assert "x-memory-injection-id" in (await chat(gw)).headers


async def test_erasure_removes_the_records(gw: Gateway, clock: Clock) -> None:
    injection_id = (await chat(gw)).headers["x-memory-injection-id"]
    await flushed(gw)
    pending = (await chat(gw)).headers["x-memory-injection-id"]  # still buffered
    bob_memory = await add(gw, "Has a dog named Biscuit", user="bob")
    bob = (await chat(gw, "my dog?", BOB)).headers["x-memory-injection-id"]
    async with gw.client(headers=ALICE) as client:
        erased = await client.delete("/v1/me", params={"confirm": "true"})
        assert erased.status_code == 200, erased.text
    await flushed(gw)
    long_ago = clock.now - timedelta(days=365)
    for gone in (injection_id, pending):
        assert await gw.res.store.get_injection("default", "alice", gone,
                                                since=long_ago) is None
    kept = await gw.res.store.get_injection("default", "bob", bob, since=long_ago)
    assert kept is not None
    assert kept.items[0][1] == bob_memory


async def preview(gw: Gateway, body: Any, headers: dict[str, str] = ALICE) -> httpx.Response:
    async with gw.client(headers=headers) as client:
        return await client.post("/v1/memories/preview", json=body)


async def test_preview_shows_what_a_reply_would_inject_and_changes_nothing(
        build: Build, upstream: FakeUpstream, clock: Clock) -> None:
    learning = {"enabled": True, "batch_messages": 1}
    async with running_gateway(build(learning=learning), upstream, clock=clock) as gw:
        memory_id = await add(gw, TEA)
        res = gw.res

        async def state() -> tuple[int, int, object, int, int]:
            await res.sink.flush()
            await res.memory.access.flush(res.store, res.clock())
            await res.usage.flush()
            memory = await res.store.get("default", "alice", memory_id)
            assert memory is not None
            assert res.queue is not None
            usage = await res.ledger.usage_totals("default", "alice")
            return (memory.access_count, usage.requests,
                    await res.queue.depth(),
                    len(res.memory.injections.pending), len(upstream.chat_requests))

        before = await state()
        shown = await preview(gw, {"messages": [{"role": "user", "content": QUESTION}]})
        assert shown.status_code == 200, shown.text
        assert shown.json()["status"] == "injected"
        assert shown.json()["request"] == {"model": "m", "conversation_id": "conv-1",
                                           "channel": "private"}
        assert await state() == before  # no counter, usage, learning, record or model call
        # A reply to the same messages injects exactly what the preview showed…
        injection_id = (await chat(gw)).headers["x-memory-injection-id"]
        await flushed(gw)
        record = (await read(gw, injection_id)).json()
        assert record["items"] == shown.json()["items"]
        assert record["items"][0]["memory_id"] == memory_id
        # …and changes what the preview did not.
        after = await state()
        assert after[0] == before[0] + 1
        assert after[1] == before[1] + 1
        assert after[2] != before[2]
        assert after[4] == before[4] + 1


async def test_preview_without_memory_and_bad_bodies(gw: Gateway) -> None:
    empty = await preview(gw, {"messages": [{"role": "user", "content": "hi"}]}, BOB)
    assert empty.status_code == 200
    assert (empty.json()["status"], empty.json()["items"]) == ("empty", [])
    for bad, param in (({}, "messages"), ({"messages": []}, "messages"),
                       ({"messages": [{"content": "x"}]}, "messages[0].role"),
                       ({"messages": [{"role": "user", "content": "x"}], "model": 3},
                        "model")):
        refused = await preview(gw, bad)
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["error"]["param"] == param
    unknown = await preview(gw, {"messages": [{"role": "user", "content": "x"}],
                                 "model": "nope"})
    assert unknown.status_code == 404
    nobody = await preview(gw, {"messages": [{"role": "user", "content": "x"}]}, {})
    assert nobody.status_code == 400
    assert nobody.json()["error"]["code"] == "missing_user"
