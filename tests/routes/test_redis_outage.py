"""Redis stops mid-run and comes back: chat keeps answering, and nothing the gateway
accepted meanwhile is lost — the turns are learned and the usage counted once Redis returns."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.learning import sink as sink_module
from proxy.memory.store import ListQuery
from tests.fakes import FakeUpstream, make_settings, redis_storage, running_gateway
from tests.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def own_redis(redis_url: str) -> Iterator[RedisServer]:
    """A private, persistent Redis this test may stop and start (``redis_url`` only makes
    sure the binaries are usable)."""
    del redis_url
    server = RedisServer(persistent=True).start()
    try:
        yield server
    finally:
        server.stop()


async def test_turns_sent_while_redis_is_down_are_learned_when_it_returns(
        tmp_path: Path, own_redis: RedisServer, upstream: FakeUpstream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop Redis, send three turns (each answered 200), start Redis: each turn is
    learned and each request counted in the usage ledger."""
    monkeypatch.setattr(sink_module, "RETRY_BASE_SECONDS", 0.05)
    monkeypatch.setattr(sink_module, "RETRY_MAX_SECONDS", 0.2)
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1},
                             storage=redis_storage(tmp_path, own_redis.url, "outage"))
    facts = {"bees": "Keeps bees", "Lyon": "Lives in Lyon", "chess": "Plays chess"}
    upstream.extract = lambda body: {"memories": [
        {"title": fact, "content": fact, "subject": "user", "category": "domain"}
        for word, fact in facts.items() if word in str(body["messages"][-1])]}
    async with running_gateway(settings, upstream) as gw:
        own_redis.kill()
        async with gw.client(headers={"X-User-Id": "u1"}) as client:
            for text in ("I keep bees.", "I live in Lyon.", "I play chess."):
                response = await client.post("/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": text}]})
                assert response.status_code == 200
            await asyncio.sleep(0.5)  # the writer has tried, failed and kept the turns
            ready = (await client.get("/readyz")).json()
            assert ready["status"] == "degraded"
            spool = ready["checks"]["spool"]
            assert spool["unwritten_jobs"] + spool["pending_turns"] >= 1
            assert spool["pending_usage_rows"] == 3
            assert spool["dropped_turns"] == 0
            own_redis.start()
            for _ in range(200):
                spool = (await client.get("/readyz")).json()["checks"]["spool"]
                if not (spool["unwritten_jobs"] or spool["pending_turns"]
                        or spool["pending_usage_rows"]):
                    break
                await asyncio.sleep(0.05)
            assert spool["unwritten_jobs"] == spool["pending_turns"] == 0
            assert spool["pending_usage_rows"] == 0
        await gw.settle()
        learned = await gw.res.store.list_memories(ListQuery(tenant="default", user="u1"))
        assert sorted(m.content for m in learned) == sorted(facts.values())
        usage = await gw.res.ledger.usage_totals("default", "u1")
        assert usage.requests == 3
