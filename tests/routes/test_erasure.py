"""``DELETE /v1/me`` through the gateway leaves nothing of the user's words in learning
(docs/design.md#erasure): their lines in a group's buffer are not shown to the learning
model at the group's next flush, their resent history is not "already seen", and an
admin key erasing the user does the same; and no queued job, Redis key or SQLite row
holds the erased user's id afterwards but the documented tombstone. Both backends
(Redis: the real test Redis)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fakes import FakeUpstream, Gateway, backend_overrides, make_settings, running_gateway

GROUP = {"X-Memory-Channel": "group", "X-Memory-Group-Id": "hikers"}
APP = {"Authorization": "Bearer app-key"}
ADMIN = {"Authorization": "Bearer admin-key"}
ERASED = "zanzibarquokka"  # said by Alice only
KEPT = "kilimanjarotea"  # said by Bob


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gw(request: pytest.FixtureRequest, tmp_path: Path,
             upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    settings = make_settings(
        tmp_path, learning={"enabled": True, "batch_messages": {"private": 50, "group": 50}},
        auth={"keys": [{"key_sha256": _sha("app-key"), "tenant": "t"}],
              "admin_keys": [{"key_sha256": _sha("admin-key"), "tenant": "t",
                              "name": "ops"}]},
        **backend_overrides(request, tmp_path))
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


async def _chat(gw: Gateway, user: str, messages: list[dict[str, Any]],
                headers: dict[str, str] | None = None) -> None:
    async with gw.client(headers={**APP, "X-User-Id": user, **(headers or {})}) as client:
        response = await client.post("/v1/chat/completions",
                                     json={"model": "m", "messages": messages})
    assert response.status_code == 200, response.text


async def _buffer(gw: Gateway) -> None:
    await gw.res.sink.flush()
    assert gw.res.worker is not None
    await gw.res.worker.drain()


def _prompts(upstream: FakeUpstream) -> str:
    return "\n".join(orjson.dumps(body).decode() for _, body in upstream.learning_calls)


async def _group_talk(gw: Gateway) -> None:
    """Alice and Bob introduce themselves (their names are bound), then Bob's request
    carries the group's history: a line of Alice's and one of his own."""
    await _chat(gw, "u-alice", [{"role": "user", "name": "Alice", "content": "hi all"}],
                GROUP)
    await _chat(gw, "u-bob", [{"role": "user", "name": "Bob", "content": "hello"}], GROUP)
    await _buffer(gw)
    await _chat(gw, "u-bob", [
        {"role": "user", "name": "Alice", "content": f"I hide my key under the {ERASED}"},
        {"role": "user", "name": "Bob", "content": f"I only drink {KEPT} on hikes"},
    ], GROUP)
    await _buffer(gw)


@pytest.mark.parametrize("erasing", [{**APP, "X-User-Id": "u-alice"},
                                     {**ADMIN, "X-User-Id": "u-alice"}],
                         ids=["self", "admin"])
async def test_erased_users_group_lines_never_reach_the_learning_model(
        gw: Gateway, upstream: FakeUpstream, erasing: dict[str, str]) -> None:
    """After Alice is erased (by herself or by an admin), the group's next flush shows the
    learning model Bob's line but none of Alice's words."""
    await _group_talk(gw)
    async with gw.client(headers=erasing) as client:
        response = await client.delete("/v1/me", params={"confirm": "true"})
    assert response.status_code == 200, response.text
    await gw.flush_conversations()
    prompts = _prompts(upstream)
    assert KEPT in prompts
    assert ERASED not in prompts


async def test_without_erasure_the_group_flush_shows_every_line(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """Negative case: when nobody is erased, Alice's line reaches the model too."""
    await _group_talk(gw)
    await gw.flush_conversations()
    prompts = _prompts(upstream)
    assert KEPT in prompts
    assert ERASED in prompts


async def test_after_erasure_resent_history_is_not_taken_for_seen(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """The erased user's fingerprints are gone: their old history, resent after the
    erasure, is new to the queue (learned from as the fresh user's words), while before
    the erasure the same resend was skipped as already seen."""
    history = [{"role": "user", "content": "I collect antique compasses"},
               {"role": "assistant", "content": "Nice."},
               {"role": "user", "content": "Any tips?"}]
    await _chat(gw, "u-carol", history[:1])
    await _buffer(gw)
    await gw.flush_conversations()
    assert "antique compasses" in _prompts(upstream)
    upstream.learning_calls.clear()
    await _chat(gw, "u-carol", history)
    await gw.flush_conversations()
    assert "antique compasses" not in _prompts(upstream)  # seen: skipped
    async with gw.client(headers={**APP, "X-User-Id": "u-carol"}) as client:
        assert (await client.delete("/v1/me", params={"confirm": "true"})).status_code == 200
    upstream.learning_calls.clear()
    await _chat(gw, "u-carol", [*history, {"role": "assistant", "content": "Oil them."},
                                {"role": "user", "content": "Thanks"}])
    await gw.flush_conversations()
    assert "antique compasses" in _prompts(upstream)


# No id left behind ---------------------------------------------------------------------

TRACED = "u-dora-traced"  # the erased user's id: a string no other key or row holds
OTHER = "u-ezra-kept"


async def _pending_work(gw: Gateway, *users: str) -> None:
    """For each of ``users``: a sealed batch awaiting its learn job, an exchange job not
    yet run, an explicit flush (``POST /v1/memories/flush``) and an idle flush — none run
    (the worker drains only while the first turns are buffered)."""
    from proxy.learning.jobs import Flush, flush_job

    for user in users:
        await _chat(gw, user, [{"role": "user", "content": "I sail a yawl called Petrel"}])
    await _buffer(gw)
    queue = gw.res.queue
    assert queue is not None
    for user in users:
        for conversation in await queue.buffered_conversations("t", user):
            assert await queue.seal("t", user, conversation, now=0) is not None
        await _chat(gw, user, [{"role": "user", "content": "My yawl is moored at Ribe"}])
        await gw.res.sink.flush()
        async with gw.client(headers={**APP, "X-User-Id": user}) as client:
            assert (await client.post("/v1/memories/flush")).status_code == 202
        await queue.enqueue_many([flush_job(Flush("t", user, "c-idle"))])
    depth = await queue.depth_by_kind()
    assert {kind: depth[(kind, "ready")] for kind in ("exchange", "flush", "learn")} == {
        "exchange": len(users), "flush": 2 * len(users), "learn": len(users)}


# The documented tombstone (docs/design.md#erasure): the content-free ``cleared_at``
# marker (SQLite's user_settings row) and the ``erased`` audit event.
MARKER_TABLES = frozenset({"user_settings"})


def _tombstone(text: str) -> bool:
    return "erased" in text


def _rows_holding(path: Path, needle: str) -> list[str]:
    """``table: row`` of every row of the SQLite file at ``path`` holding ``needle``."""
    import sqlite3

    if not path.exists():
        return []
    found = []
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # noqa: S608 (own tables)
                text = repr(row)
                if needle in text and table not in MARKER_TABLES and not (
                        table == "audit_log" and _tombstone(text)):
                    found.append(f"{table}: {text}"[:300])
    return found


async def _traces(gw: Gateway, needle: str) -> list[str]:
    """Every Redis key (under the test prefix) whose name or value holds ``needle``, and
    every SQLite row that does, as ``table: row`` lines — the tombstone left out: a
    marker row, an audit row or stream entry of the ``erased`` event."""
    found: list[str] = []
    storage = gw.res.settings.storage
    if storage.backend == "redis":
        from proxy.backends.redis.client import connect

        async with connect(storage.url.get_secret_value()) as client:
            async for raw in client.scan_iter(match=f"{storage.key_prefix}:*", count=1000):
                key = raw.decode()
                kind = (await client.type(key)).decode()
                if kind == "stream":
                    parts = [repr(entry) for entry in await client.xrange(key)]
                    hit = any(needle in p and not _tombstone(p) for p in parts)
                else:
                    value = {"string": client.get, "hash": client.hgetall,
                             "set": client.smembers,
                             "list": lambda k: client.lrange(k, 0, -1),
                             "zset": lambda k: client.zrange(k, 0, -1)}[kind]
                    hit = needle in repr(await value(key))
                if needle in key or hit:
                    found.append(key)
    found += _rows_holding(Path(storage.path), needle)
    return found


@pytest.mark.parametrize("erasing", [APP, ADMIN], ids=["self", "admin"])
async def test_erasure_leaves_no_job_key_or_row_holding_the_users_id(
        gw: Gateway, erasing: dict[str, str]) -> None:
    """After the user is erased (by themself or by an admin), no queued job (exchange,
    flush, learn), Redis key or SQLite row holds their id but the documented tombstone
    (the ``cleared_at`` marker and the ``erased`` audit event) — on Redis only the
    tombstone keys and the generation counter carry the user's token; the other user's
    pending work is all still there."""
    await _pending_work(gw, TRACED, OTHER)
    assert await _traces(gw, TRACED)
    async with gw.client(headers={**erasing, "X-User-Id": TRACED}) as client:
        assert (await client.delete("/v1/me", params={"confirm": "true"})).status_code == 200
    left = await _traces(gw, TRACED)
    assert left == [], "\n".join(left)
    storage = gw.res.settings.storage
    if storage.backend == "redis":  # under the user's token: the tombstone and the counter
        from proxy.backends.redis.client import connect
        from proxy.backends.redis.keys import user_token

        async with connect(storage.url.get_secret_value()) as client:
            tagged = {k.decode() async for k in client.scan_iter(
                match=f"{storage.key_prefix}:*{{{user_token('t', TRACED)}}}*")}
            [log] = [k for k in tagged if k.split(":")[1] == "chg"]
            assert await client.zrange(log, 0, -1) == [b"*"]  # "read everything", no id
        assert {k.split(":")[1] for k in tagged} == {
            "gen", "chg", "settings", "audit", "auditrefs"}
    assert gw.res.queue is not None
    depth = await gw.res.queue.depth_by_kind()
    assert {kind: depth[(kind, "ready")] for kind in ("exchange", "flush", "learn")} == {
        "exchange": 1, "flush": 2, "learn": 1}  # the other user's, all of them
    assert await _traces(gw, OTHER)
