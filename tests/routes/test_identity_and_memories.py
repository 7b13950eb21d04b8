"""Authentication, identity precedence, isolation between users and tenants, and the
memory management API."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.inject import BLOCK_START
from tests.fakes import FakeUpstream, Gateway, make_settings, running_gateway

KEYS = {"APP_KEY_A": "key-a-secret", "APP_KEY_B": "key-b-secret", "USER1_KEY": "key-user-1"}


@pytest.fixture
def keyed_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    return make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1}, auth={
        "keys": [
            {"key": "os.environ/APP_KEY_A", "tenant": "tenant-a"},
            {"key_sha256": hashlib.sha256(b"key-b-secret").hexdigest(), "tenant": "tenant-b"},
            {"key": "os.environ/USER1_KEY", "tenant": "tenant-a", "user": "user-1"},
        ]})


async def chat(gw: Gateway, key: str | None, text: str, *, user: str | None = None,
               header_user: str | None = None, body: dict[str, Any] | None = None) -> Any:
    headers = {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if header_user:
        headers["X-User-Id"] = header_user
    payload: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}],
                               **(body or {})}
    if user:
        payload["user"] = user
    async with gw.client() as client:
        return await client.post("/v1/chat/completions", json=payload, headers=headers)


async def add_memory(gw: Gateway, key: str | None, user: str, content: str) -> dict[str, Any]:
    headers = {"X-User-Id": user}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with gw.client() as client:
        response = await client.post("/v1/memories", json={"content": content},
                                     headers=headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


def block(upstream: FakeUpstream) -> str:
    return str(upstream.last_chat["messages"])


# -------------------------------------------------------------------- auth

async def test_unknown_or_missing_key_is_401(keyed_settings: Any) -> None:
    """With keys configured, a missing or wrong key is 401 in OpenAI's envelope."""
    async with running_gateway(keyed_settings) as gw:
        for key in (None, "wrong"):
            response = await chat(gw, key, "hi")
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert (await chat(gw, KEYS["APP_KEY_A"], "hi")).status_code == 200
        assert (await chat(gw, KEYS["APP_KEY_B"], "hi")).status_code == 200


async def test_open_mode_accepts_any_caller(gateway: Gateway) -> None:
    """Without auth.keys every caller is served as tenant 'default'."""
    assert (await chat(gateway, None, "hi", header_user="u")).status_code == 200


# --------------------------------------------------------------- identity

@pytest.mark.parametrize(("header", "body", "expected"), [
    ("from-header", {"user": "from-body", "metadata": {"user_id": "from-meta"}}, "from-header"),
    (None, {"user": "from-body", "metadata": {"user_id": "from-meta"}}, "from-body"),
    (None, {"metadata": {"user_id": "from-meta"}, "safety_identifier": "s"}, "from-meta"),
    (None, {"safety_identifier": "from-safety"}, "from-safety"),
])
async def test_user_precedence(gateway: Gateway, header: str | None, body: dict[str, Any],
                               expected: str) -> None:
    """Header, then body ``user``, then ``metadata.user_id``, then ``safety_identifier``."""
    await add_memory(gateway, None, expected, "Marker fact for " + expected)
    await chat(gateway, None, "Marker fact?", header_user=header, body=body)
    assert "Marker fact for " + expected in block(gateway.upstream)


@pytest.mark.parametrize("value", [42, True, ["alice"], {"id": "alice"}])
@pytest.mark.parametrize(("header", "beside"), [
    (None, {}), ("alice", {}), (None, {"user": "alice"}),
], ids=["alone", "beside-header", "beside-body-user"])
async def test_a_metadata_user_id_that_is_not_a_string_is_400(
        gateway: Gateway, value: Any, header: str | None, beside: dict[str, Any]) -> None:
    """``metadata.user_id`` of another JSON type is a 400 naming it, like a non-string body
    ``user`` — not a request silently answered without the user's memory, nor one whose
    malformed field goes unread because a header or the body's ``user`` names the user;
    nothing reaches the upstream. ``null`` means absent."""
    response = await chat(gateway, None, "hi", header_user=header,
                          body={**beside, "metadata": {"user_id": value}})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "metadata.user_id"
    assert gateway.upstream.chat_requests == []
    absent = await chat(gateway, None, "hi", header_user=header,
                        body={**beside, "metadata": {"user_id": None}})
    assert absent.status_code == 200
    assert (absent.headers["x-memory-status"] == "no_user") == (not (header or beside))


async def test_no_user_means_plain_pass_through(gateway: Gateway) -> None:
    """Without any user id nothing is injected and the header says why."""
    response = await chat(gateway, None, "hi")
    assert response.headers["x-memory-status"] == "no_user"
    assert BLOCK_START not in block(gateway.upstream)


async def test_bad_memory_header_is_400(gateway: Gateway) -> None:
    """An unknown X-Memory value is rejected with a message naming the header."""
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", headers={"X-Memory": "maybe"},
                                     json={"model": "m", "messages": [
                                         {"role": "user", "content": "x"}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Memory"


# -------------------------------------------------------------- isolation

async def test_users_never_see_each_others_memories(
    learning_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """user-2 asking the same question as user-1 gets no memory of user-1 (memory search
    not filtered by user once leaked memories across users)."""
    upstream.extract = lambda body: {"memories": [{
        "title": "Band", "content": "Favourite band is Band-X", "category": "user_preference",
        "subject": "user"}]}
    await chat(learning_gateway, None, "My favourite band is Band-X.", header_user="user-1")
    await learning_gateway.settle()
    await chat(learning_gateway, None, "What's my favourite band?", header_user="user-1")
    assert "Band-X" in block(upstream)
    response = await chat(learning_gateway, None, "What's my favourite band?",
                          header_user="user-2")
    assert "Band-X" not in block(upstream)
    assert response.headers["x-memory-injected"] == "0"


async def test_tenants_are_isolated(keyed_settings: Any) -> None:
    """The same user id under two tenants has two separate memories."""
    async with running_gateway(keyed_settings) as gw:
        await add_memory(gw, KEYS["APP_KEY_A"], "same-user", "Tenant A secret plan")
        await chat(gw, KEYS["APP_KEY_B"], "secret plan?", header_user="same-user")
        assert "Tenant A" not in block(gw.upstream)
        await chat(gw, KEYS["APP_KEY_A"], "secret plan?", header_user="same-user")
        assert "Tenant A secret plan" in block(gw.upstream)


async def test_user_bound_key_cannot_name_another_user(keyed_settings: Any) -> None:
    """A key bound to user-1 that names user-2 in the body or header still gets only
    user-1's memories. A public failure: a memory API trusted the caller's ``user_id``, so
    anyone could read another user's memories by naming them."""
    async with running_gateway(keyed_settings) as gw:
        await add_memory(gw, KEYS["APP_KEY_A"], "user-2", "User two diary entry")
        await add_memory(gw, KEYS["APP_KEY_A"], "user-1", "User one diary entry")
        await chat(gw, KEYS["USER1_KEY"], "What do you know about me? diary entry",
                   user="user-2", header_user="user-2")
        sent = block(gw.upstream)
        assert "User two" not in sent
        assert "User one diary entry" in sent
        async with gw.client() as client:
            listed = await client.get("/v1/memories", params={"user": "user-2"}, headers={
                "Authorization": f"Bearer {KEYS['USER1_KEY']}", "X-User-Id": "user-2"})
        assert [m["content"] for m in listed.json()["data"]] == ["User one diary entry"]


# -------------------------------------------------------------- management API

async def test_memory_api_round_trip(gateway: Gateway) -> None:
    """Create, list, get and delete a memory; it carries the
    docs/design.md#memory-record field names."""
    created = await add_memory(gateway, None, "u1", "Prefers metric units")
    assert created["source"] == "manual"
    assert created["hits"] == 1
    for name in ("id", "tenant", "user_id", "scope", "category", "subcategory", "title",
                 "content", "tags", "subject", "source", "source_conversation_id", "score",
                 "enabled", "hits", "created_at", "updated_at", "last_seen_at",
                 "access_count", "last_access_at", "superseded_at", "superseded_by",
                 "supersede_reason"):
        assert name in created
    async with gateway.client(headers={"X-User-Id": "u1"}) as client:
        listed = (await client.get("/v1/memories")).json()
        assert listed["object"] == "list"
        assert [m["id"] for m in listed["data"]] == [created["id"]]
        assert (await client.get(f"/v1/memories/{created['id']}")).json()["content"] == \
            "Prefers metric units"
        deleted = await client.delete(f"/v1/memories/{created['id']}")
        assert deleted.json() == {"id": created["id"], "object": "memory.deleted",
                                  "deleted": True}
        assert (await client.get(f"/v1/memories/{created['id']}")).status_code == 404
        assert (await client.delete(f"/v1/memories/{created['id']}")).status_code == 404


async def test_manual_chinese_memory_is_injected_as_written(
    gateway: Gateway, upstream: FakeUpstream
) -> None:
    """Full-width Chinese punctuation survives storage and injection unchanged."""
    text = "我住在杭州西湖区，喜欢喝龙井茶。"
    await add_memory(gateway, None, "u1", text)
    await chat(gateway, None, "我住在哪里？喜欢喝什么茶？", header_user="u1")
    assert f"- {text}" in upstream.last_chat["messages"][0]["content"].split("\n")


async def test_other_users_memory_is_not_found(gateway: Gateway) -> None:
    """Another user's memory id is a 404, for reading and for deleting."""
    created = await add_memory(gateway, None, "owner", "Private note")
    async with gateway.client(headers={"X-User-Id": "intruder"}) as client:
        assert (await client.get(f"/v1/memories/{created['id']}")).status_code == 404
        assert (await client.delete(f"/v1/memories/{created['id']}")).status_code == 404
    async with gateway.client(headers={"X-User-Id": "owner"}) as client:
        assert (await client.get(f"/v1/memories/{created['id']}")).status_code == 200


@pytest.mark.parametrize(("payload", "param"), [
    ({}, "content"), ({"content": ""}, "content"), ({"content": 5}, "content"),
    ({"content": "x", "category": "nonsense"}, "category"),
    ({"content": "x", "surprise": 1}, "surprise"),
])
async def test_memory_api_rejects_bad_input(gateway: Gateway, payload: dict[str, Any],
                                            param: str) -> None:
    """Bad input gets a 400 envelope naming the field; nothing is stored."""
    async with gateway.client(headers={"X-User-Id": "u1"}) as client:
        response = await client.post("/v1/memories", json=payload)
        assert response.status_code == 400
        assert response.json()["error"]["param"] == param
        assert (await client.get("/v1/memories")).json()["data"] == []


async def test_memory_api_needs_a_user(gateway: Gateway) -> None:
    """Without a user id the memory API answers 400, never another user's data."""
    async with gateway.client() as client:
        response = await client.get("/v1/memories")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "missing_user"


async def test_deleted_memories_never_come_back(
    learning_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """After delete-all nothing is injected or listed, and learning queued before the
    deletion — or the same history resent — does not bring the fact back. A public failure:
    "delete all" cleared the listing while retrieval kept returning the memories from an
    index never purged."""
    upstream.extract = lambda body: {"memories": [{
        "title": "Home", "content": "Lives in City B", "category": "user_preference",
        "subject": "user"}]}
    await chat(learning_gateway, None, "I live in City B.", header_user="u1")
    await learning_gateway.settle()
    # Race variant: a second statement is queued but not yet learned when the user clears.
    await chat(learning_gateway, None, "I really live in City B.", header_user="u1")
    await learning_gateway.res.sink.flush()
    async with learning_gateway.client(headers={"X-User-Id": "u1"}) as client:
        refused = await client.delete("/v1/memories")
        assert refused.status_code == 400
        cleared = await client.delete("/v1/memories", params={"confirm": "true"})
        assert cleared.json()["deleted"] == 1
    await learning_gateway.settle()
    await chat(learning_gateway, None, "I live in City B.", header_user="u1")  # resent
    await learning_gateway.settle()
    response = await chat(learning_gateway, None, "Where do I live?", header_user="u1")
    assert "City B" not in block(upstream)
    assert response.headers["x-memory-injected"] == "0"
    async with learning_gateway.client(headers={"X-User-Id": "u1"}) as client:
        assert (await client.get("/v1/memories",
                                 params={"include_retired": "true"})).json()["data"] == []
        assert (await client.get("/v1/memories", params={"q": "City"})).json()["data"] == []


async def test_deleted_single_memory_is_not_relearned_from_older_messages(
    learning_gateway: Gateway, upstream: FakeUpstream
) -> None:
    """A memory deleted while learning of the message that stated it is still queued does
    not come back from that message."""
    upstream.extract = lambda body: {"memories": [{
        "title": "Pet", "content": "Has a cat named Miso", "category": "user_preference",
        "subject": "user"}]}
    await chat(learning_gateway, None, "I have a cat named Miso.", header_user="u1")
    await learning_gateway.settle()
    await chat(learning_gateway, None, "Miso, my cat, is great.", header_user="u1")
    await learning_gateway.res.sink.flush()
    async with learning_gateway.client(headers={"X-User-Id": "u1"}) as client:
        memory_id = (await client.get("/v1/memories")).json()["data"][0]["id"]
        assert (await client.delete(f"/v1/memories/{memory_id}")).status_code == 200
    await learning_gateway.settle()
    async with learning_gateway.client(headers={"X-User-Id": "u1"}) as client:
        assert (await client.get("/v1/memories")).json()["data"] == []


async def test_health_endpoints(gateway: Gateway) -> None:
    """/healthz is alive; /readyz reports the store and the queue."""
    async with gateway.client() as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = (await client.get("/readyz")).json()
        assert ready["status"] == "ok"
        assert ready["checks"]["store"] == "ok"
        metrics = (await client.get("/metrics")).text
        assert "memory_proxy_requests_total" in metrics


async def test_before_last_user_keeps_the_prompt_cache_prefix(tmp_path: Path) -> None:
    """In ``before_last_user`` mode two consecutive turns of one conversation send the
    upstream byte-identical prefixes: everything before the latest user message is what the
    client sent, and the block sits inside the latest user message."""
    import orjson

    settings = make_settings(tmp_path, memory={"position": "before_last_user"})
    async with running_gateway(settings) as gw:
        await add_memory(gw, None, "u1", "Prefers metric units")
        turn1 = [{"role": "system", "content": "You are helpful."},
                 {"role": "user", "content": "How far is 5 miles in metric units?"}]
        await chat(gw, None, "x", header_user="u1", body={"messages": turn1})
        first = gw.upstream.last_chat["messages"]
        turn2 = [*turn1, {"role": "assistant", "content": "About 8 km."},
                 {"role": "user", "content": "And 10 miles in metric units?"}]
        await chat(gw, None, "x", header_user="u1", body={"messages": turn2})
        second = gw.upstream.last_chat["messages"]
    assert orjson.dumps(second[:3]) == orjson.dumps(turn2[:3])
    assert orjson.dumps(first[:1]) == orjson.dumps(second[:1])
    assert second[3]["content"].startswith(BLOCK_START)
    assert second[3]["content"].endswith("And 10 miles in metric units?")
    assert orjson.dumps(first[1]) != orjson.dumps(turn1[1])  # the block was in turn 1 too


async def test_a_utf8_user_header_names_the_same_user_as_the_body(gateway: Gateway) -> None:
    """``X-User-Id: zh用户`` (UTF-8 bytes on the wire, read by ASGI as Latin-1) is the user
    ``zh用户`` — the same one the body's ``user`` names — not mojibake."""
    async with gateway.client() as client:
        created = await client.post("/v1/memories", json={"content": "喜欢爬山"},
                                    headers={"X-User-Id": "zh用户".encode()})
        assert created.status_code == 201, created.text
        assert created.json()["user_id"] == "zh用户"
        listed = await client.get("/v1/memories", params={"user": "zh用户"})
        assert [m["content"] for m in listed.json()["data"]] == ["喜欢爬山"]
        latin = await client.get("/v1/memories", headers={"X-User-Id": b"caf\xe9"})
        assert latin.status_code == 200  # not UTF-8: kept as it came (Latin-1 "café")
        assert latin.json()["data"] == []


async def test_flush_takes_the_user_from_the_query_string(learning_gateway: Gateway) -> None:
    async with learning_gateway.client() as client:
        queued = await client.post("/v1/memories/flush", params={"user": "u-flush"})
        missing = await client.post("/v1/memories/flush")
        not_object = await client.post("/v1/memories/flush", content=b"[1]",
                                       headers={"X-User-Id": "u-flush"})
    assert queued.status_code == 202, queued.text
    assert missing.status_code == 400
    assert missing.json()["error"]["code"] == "missing_user"
    assert not_object.status_code == 400


@pytest.mark.parametrize("value", ["maybe", "2", "truee"])
async def test_boolean_query_parameters_refuse_other_words(gateway: Gateway,
                                                           value: str) -> None:
    async with gateway.client() as client:
        listed = await client.get("/v1/memories", params={"include_retired": value},
                                  headers={"X-User-Id": "u1"})
        cleared = await client.delete("/v1/memories", params={"confirm": value},
                                      headers={"X-User-Id": "u1"})
        fine = await client.get("/v1/memories", params={"include_retired": "false"},
                                headers={"X-User-Id": "u1"})
    assert listed.status_code == 400
    assert listed.json()["error"]["param"] == "include_retired"
    assert cleared.status_code == 400
    assert fine.status_code == 200


async def test_the_first_chinese_request_gets_its_memory_while_the_dictionary_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jieba's dictionary loads on the first Chinese text a process sees (~0.7 s): that
    load is not charged to the recall deadline, so the first Chinese request after a
    restart is injected, not degraded by a timeout."""
    from proxy.memory import text

    settings = make_settings(tmp_path, memory={"recall_timeout_ms": 100})
    async with running_gateway(settings) as gw:
        await add_memory(gw, None, "zh-user", "喜欢喝龙井茶")
        loaded = text._segmenter()

        def slow_load() -> object:  # the dictionary load of a freshly started process
            if text._jieba is None:
                time.sleep(0.5)
                text._jieba = loaded
            return loaded

        monkeypatch.setattr(text, "_jieba", None)
        monkeypatch.setattr(text, "_segmenter", slow_load)
        response = await chat(gw, None, "我喜欢喝什么茶？", header_user="zh-user")
        assert text.segmenter_loaded()
    assert response.status_code == 200
    assert response.headers["x-memory-status"] == "injected"
    assert "龙井茶" in block(gw.upstream)
