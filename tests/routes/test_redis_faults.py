"""Redis stops answering (SIGSTOP: connections stay open, no reply comes): every store read
on the request path runs under a deadline, so a chat that names a user is answered within
the recall deadline plus the upstream's time, ``/readyz`` within a second saying
"degraded", and memory comes back as soon as Redis does."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from proxy.memory.records import Memory, new_id
from proxy.memory.store import ListQuery
from tests.fakes import (
    FakeUpstream,
    Gateway,
    eventually,
    make_settings,
    redis_storage,
    running_gateway,
)
from tests.redis_server import RedisServer

pytestmark = pytest.mark.redis
# A chat with a user while Redis is frozen: recall deadline (150 ms) + two settings reads
# (250 ms each) + the fake upstream, with room for a loaded 2-core CI machine.
FROZEN_CHAT_SECONDS = 1.5
RECALL_TIMEOUT_MS = 150  # the shipped deadline (test settings default to a generous one)
READY_SECONDS = 1.0
PLACES = ("Lisbon", "Oslo", "Kyoto")  # one turn each, said while Redis is frozen


@pytest.fixture
def own_redis(redis_url: str) -> Iterator[RedisServer]:
    """A private Redis this test may freeze (``redis_url`` only makes sure the binaries
    are usable)."""
    del redis_url
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """SIGSTOP the server for the block; SIGCONT always, whatever the block raised."""
    assert server._process is not None
    pid = server._process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
async def gateway_on(tmp_path: Path, own_redis: RedisServer,
                     upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    settings = make_settings(tmp_path, learning={"enabled": True},
                             memory={"recall_timeout_ms": RECALL_TIMEOUT_MS},
                             storage=redis_storage(tmp_path, own_redis.url, "faults"))
    async with running_gateway(settings, upstream) as gw:
        yield gw


async def timed_chat(gw: Gateway, mode: str) -> tuple[float, dict[str, str]]:
    headers = {"X-User-Id": "u1", "X-Memory": mode}
    async with gw.client(headers=headers) as client:
        started = time.monotonic()
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "What about my bees?"}]})
        elapsed = time.monotonic() - started
    assert response.status_code == 200
    return elapsed, dict(response.headers)


async def test_a_frozen_redis_costs_a_chat_milliseconds_not_seconds(
        gateway_on: Gateway, own_redis: RedisServer) -> None:
    """With Redis frozen, chats with a user (memory on, read-only, write-only) are each
    answered within 1.5 s — degraded where memory is read — and /readyz within 1 s
    saying degraded; after SIGCONT the user's memory is injected again."""
    gw = gateway_on
    await gw.res.store.add(Memory(id=new_id(), tenant="default", user_id="u1",
                                  content="Keeps bees in the garden"))
    _, warm = await timed_chat(gw, "on")
    assert warm["x-memory-status"] == "injected"
    with frozen(own_redis):
        for mode in ("on", "read-only", "write-only"):
            elapsed, headers = await timed_chat(gw, mode)
            assert elapsed <= FROZEN_CHAT_SECONDS, (mode, elapsed)
            expected = "write_only" if mode == "write-only" else "degraded"
            assert headers["x-memory-status"] == expected, mode
        async with gw.client() as client:
            started = time.monotonic()
            ready = await client.get("/readyz")
            elapsed = time.monotonic() - started
        assert elapsed <= READY_SECONDS
        assert ready.status_code == 200
        assert ready.json()["status"] == "degraded"
    for _ in range(50):  # the first reads after SIGCONT may still find a stale socket
        _, headers = await timed_chat(gw, "on")
        if headers["x-memory-status"] == "injected":
            break
        await asyncio.sleep(0.1)
    assert headers["x-memory-status"] == "injected"


def fact(content: str) -> dict[str, Any]:
    return {"title": content, "content": content, "category": "user_preference",
            "subcategory": "", "tags": [], "subject": "user", "duplicate_of": None,
            "supersedes": []}


async def test_turns_said_while_redis_is_frozen_are_learned_after_it_returns(
        tmp_path: Path, own_redis: RedisServer, upstream: FakeUpstream) -> None:
    """Chats answered while Redis is frozen lose no turn: the sink keeps them and writes
    them to the queue once Redis answers again, and each is learned."""
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1},
                             memory={"recall_timeout_ms": RECALL_TIMEOUT_MS},
                             storage=redis_storage(tmp_path, own_redis.url, "learnfrozen"))

    def extract(body: dict[str, Any]) -> dict[str, Any]:
        said = str(body["messages"])
        return {"memories": [fact(f"Has visited {place}") for place in PLACES
                             if f"visited {place}" in said], "profile": None}

    upstream.extract = extract
    async with running_gateway(settings, upstream) as gw:
        with frozen(own_redis):
            for place in PLACES:
                async with gw.client(headers={"X-User-Id": "u1"}) as client:
                    started = time.monotonic()
                    reply = await client.post("/v1/chat/completions", json={
                        "model": "m", "messages": [
                            {"role": "user", "content": f"Last summer I visited {place}."}]})
                    assert reply.status_code == 200
                    assert time.monotonic() - started <= FROZEN_CHAT_SECONDS

        async def learned() -> bool:
            await gw.settle()
            stored = await gw.res.store.list_memories(ListQuery(tenant="default", user="u1"))
            return {m.content for m in stored} >= {f"Has visited {p}" for p in PLACES}

        await eventually(learned, within=30.0)
