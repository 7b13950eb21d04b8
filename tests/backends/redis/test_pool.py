"""The Redis connection pool under pressure: concurrent recalls wait briefly for a
connection instead of failing, a user's reads hold one connection at a time, and a wait
that runs out is counted and alerted on as a busy store — never as an unreachable one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.connection import AbstractConnection

from proxy.alerts import standard_checks
from proxy.backends.redis.client import BoundedPool, connect
from proxy.backends.redis.store import RedisMemoryStore
from proxy.memory.records import Memory, new_id
from proxy.memory.store import READ_TURN, SearchQuery, StoreBusyError
from proxy.memory.text import query_terms
from proxy.metrics import Metrics
from tests.fakes import FakeUpstream, Gateway, make_settings, redis_storage, running_gateway

pytestmark = pytest.mark.redis
POOL_SIZE = 4


def fact(user: str, content: str) -> Memory:
    return Memory(id=new_id(), tenant="default", user_id=user, content=content)


@pytest.fixture
async def store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisMemoryStore]:
    async with connect(redis_url, max_connections=POOL_SIZE) as client:
        opened = RedisMemoryStore(client, key_prefix=redis_prefix)
        await opened.prepare()
        yield opened


async def test_a_recall_holds_one_connection_at_a_time(
        store: RedisMemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Profile, several searches and the resident read started at once for one user (as
    the hot path starts them) never hold more than one pool connection between them."""
    await store.add(fact("u1", "Keeps bees in the garden"))
    peaks: list[int] = []
    original = BoundedPool.get_connection

    async def counting(self: BoundedPool, *args: Any, **kwargs: Any) -> AbstractConnection:
        connection = await original(self, *args, **kwargs)
        peaks.append(len(self._in_use_connections))
        return connection

    monkeypatch.setattr(BoundedPool, "get_connection", counting)
    query = SearchQuery(tenant="default", user="u1", terms=tuple(query_terms("bees")))
    READ_TURN.set(object())  # one request's reads, as MemoryService.prepare marks them
    profile, *found, resident = await asyncio.gather(
        store.get_profile("default", "u1"), store.search(query), store.search(query),
        store.resident("default", "u1", limit=5, channels=None))
    assert profile is None
    assert resident
    assert all(hits for hits in found)
    assert peaks
    assert max(peaks) == 1


@contextlib.asynccontextmanager
async def small_pool(tmp_path: Path, redis_url: str, redis_prefix: str,
                     upstream: FakeUpstream, *, recall_ms: int) -> AsyncIterator[Gateway]:
    """A gateway on Redis with a pool of :data:`POOL_SIZE` connections; its pool waits
    half of ``recall_ms`` for a connection."""
    storage = {**redis_storage(tmp_path, redis_url, redis_prefix),
               "redis_max_connections": POOL_SIZE}
    settings = make_settings(tmp_path, storage=storage,
                             memory={"recall_timeout_ms": recall_ms})
    async with running_gateway(settings, upstream) as gw:
        yield gw


async def chat(gw: Gateway, user: str, text: str) -> dict[str, str]:
    async with gw.client(headers={"X-User-Id": user}) as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200
    return dict(response.headers)


async def test_four_times_the_pool_in_concurrent_chats_all_get_memory(
        tmp_path: Path, redis_url: str, redis_prefix: str, upstream: FakeUpstream) -> None:
    """16 chats at once on a pool of 4 connections: every one is answered with its
    user's memory — none fails for lack of a connection, none is degraded. (The recall
    deadline is roomy: on a loaded CI machine the event loop, not the pool, would
    otherwise decide.)"""
    async with small_pool(tmp_path, redis_url, redis_prefix, upstream,
                          recall_ms=10_000) as gw:
        users = [f"user{i}" for i in range(4 * POOL_SIZE)]
        for user in users:
            await gw.res.store.add(fact(user, f"{user} keeps bees in the garden"))
        replies = await asyncio.gather(*(chat(gw, u, "Tell me about my bees")
                                         for u in users))
        assert [r["x-memory-status"] for r in replies] == ["injected"] * len(users)
        assert gw.res.metrics.store_pool_exhausted._value.get() == 0


async def test_an_exhausted_pool_is_counted_and_alerted_not_an_outage(
        tmp_path: Path, redis_url: str, redis_prefix: str, upstream: FakeUpstream) -> None:
    """With every connection held past the pool's bounded wait, a chat is answered
    without memory (reason store_busy), the exhaustion is counted, the
    store_pool_exhausted alert holds and store_unreachable does not; once connections
    are free again memory is back."""
    async with small_pool(tmp_path, redis_url, redis_prefix, upstream,
                          recall_ms=1_000) as gw:
        await _exhaust(gw)


async def _exhaust(gw: Gateway) -> None:
    await gw.res.store.add(fact("u1", "Keeps bees in the garden"))
    metrics = gw.res.metrics
    checks = {c.name: c for c in standard_checks(
        metrics=metrics, ping=gw.res.store.ping, dead_letters=None, gateway=False,
        learning=False, upstream_failure_ratio=0.5)}
    pool = gw.res.store._redis.connection_pool  # the gateway's own pool
    held = [await pool.get_connection() for _ in range(POOL_SIZE)]
    try:
        headers = await chat(gw, "u1", "Tell me about my bees")
        assert headers["x-memory-status"] == "degraded"
        assert headers["x-memory-reason"] == "store_busy"
        assert metrics.store_pool_exhausted._value.get() >= 1
        unreachable, _ = await checks["store_unreachable"].probe()
        exhausted, details = await checks["store_pool_exhausted"].probe()
        assert not unreachable
        assert exhausted
        assert details["exhausted"] >= 1
        ready = (await _get(gw, "/readyz")).json()
        assert ready["status"] == "degraded"
    finally:
        for connection in held:
            await pool.release(connection)
    headers = await chat(gw, "u1", "Tell me about my bees")
    assert headers["x-memory-status"] == "injected"


async def test_the_pool_waits_only_as_long_as_it_was_told(
        redis_url: str, redis_prefix: str) -> None:
    """A client whose single connection is busy gives up after its pool wait with
    :class:`StoreBusyError` through the store, and reports it once to ``on_exhausted``."""
    metrics = Metrics()
    async with connect(redis_url, max_connections=1, pool_wait_seconds=0.05,
                       on_exhausted=metrics.store_pool_exhausted.inc) as client:
        store = RedisMemoryStore(client, key_prefix=redis_prefix)
        await store.prepare()
        blocker = asyncio.create_task(client.blpop([f"{redis_prefix}:nothing"], timeout=1))
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreBusyError):
            await store.get_profile("default", "u1")
        assert loop.time() - started < 0.5
        assert metrics.store_pool_exhausted._value.get() == 1
        await blocker
        assert await store.get_profile("default", "u1") is None


async def _get(gw: Gateway, path: str) -> Any:
    async with gw.client() as client:
        return await client.get(path)
