"""Quotas, retention and deletions that race learning in flight."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.learning import quotas
from proxy.memory.records import Memory
from proxy.memory.store import ListQuery
from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    make_settings,
    running_gateway,
)

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def mem(n: int, **extra: Any) -> Memory:
    base: dict[str, Any] = {"id": f"01M{n:023d}", "tenant": "t", "user_id": "u",
                            "content": f"fact {n}", "last_seen_at": NOW, "score": 0.5}
    base.update(extra)
    return Memory(**base)


def test_retired_go_first_then_lowest_value_and_manual_last() -> None:
    """Over quota, retired memories go first, then learned ones of least value; manual
    memories go only when nothing else can."""
    retired = mem(1, enabled=False, superseded_at=NOW)
    weak = mem(2, score=0.1, last_seen_at=NOW - timedelta(days=300))
    strong = mem(3, score=0.9, hits=8)
    manual = mem(4, source="manual", score=0.0, last_seen_at=NOW - timedelta(days=900))
    victims = quotas.over_quota([strong, manual, weak, retired], limit=2, now=NOW)
    assert [v.id for v in victims] == [retired.id, weak.id]
    assert quotas.over_quota([strong, manual], limit=5, now=NOW) == []


def test_room_for_written_memories_comes_from_retired_then_learned_only() -> None:
    """Room for memories the user writes is made from retired, then learned ones of least
    value — never a manual one: ``None`` when those are not enough, ``[]`` under quota."""
    retired = mem(1, enabled=False, superseded_at=NOW)
    weak = mem(2, score=0.1, last_seen_at=NOW - timedelta(days=300))
    strong = mem(3, score=0.9, hits=8)
    manual = mem(4, source="manual", score=0.0, last_seen_at=NOW - timedelta(days=900))
    held = [strong, manual, weak, retired]
    assert quotas.make_room(held, adding=1, limit=5, now=NOW) == []
    room = quotas.make_room(held, adding=2, limit=4, now=NOW)
    assert [v.id for v in room or []] == [retired.id, weak.id]
    room = quotas.make_room(held, adding=2, limit=3, now=NOW)
    assert [v.id for v in room or []] == [retired.id, weak.id, strong.id]
    assert quotas.make_room(held, adding=1, limit=1, now=NOW) is None


def test_facts_about_one_person_are_capped() -> None:
    """No other person gets more than 40 facts; facts about the user are not affected."""
    about_bob = [mem(i, subject="Bob", score=i / 100) for i in range(45)]
    mine = [mem(100 + i) for i in range(10)]
    victims = quotas.evictions([*about_bob, *mine], max_per_user=500, now=NOW)
    assert len(victims) == 5
    assert all(v.subject == "Bob" for v in victims)
    assert {v.id for v in victims} == {m.id for m in about_bob[:5]}


async def _learn(gateway: Gateway, text: str) -> None:
    async with gateway.client() as client:
        await client.post("/v1/chat/completions", headers={"X-User-Id": "u1"},
                          json={"model": "m", "messages": [{"role": "user", "content": text}]})
    await gateway.settle()


async def test_user_quota_is_enforced_after_learning(tmp_path: Path) -> None:
    """With max_memory_per_user 3, learning a fourth and fifth fact evicts the least
    valuable ones, each audited as evicted."""
    upstream = FakeUpstream()
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1,
                                                 "max_memory_per_user": 3})
    async with running_gateway(settings, upstream) as gateway:
        for index, animal in enumerate(["cats", "dogs", "owls", "bats", "frogs"]):
            upstream.extract = lambda body, a=animal: {"memories": [{
                "title": a, "content": f"Keeps {a} at home", "category": "domain",
                "subject": "user"}]}
            await _learn(gateway, f"I keep {animal} at home.")
            del index
        kept = await gateway.res.store.list_memories(ListQuery(tenant="default", user="u1"))
        assert len(kept) == 3
        evicted = [e for _, e in await gateway.res.store.audit_log("default", "u1")
                   if e.action == "evicted"]
        assert len(evicted) == 2


async def test_retention_purges_old_memories_never_used(tmp_path: Path) -> None:
    """Memories older than retention_days that were never injected are purged; one that
    was injected stays."""
    settings = make_settings(tmp_path, learning={"enabled": True, "retention_days": 30})
    async with running_gateway(settings) as gateway:
        store = gateway.res.store
        old = datetime.now(UTC) - timedelta(days=60)
        unused = mem(1, tenant="default", user_id="u1", created_at=old, content="Old unused")
        used = mem(2, tenant="default", user_id="u1", created_at=old, content="Old used",
                   access_count=3)
        fresh = mem(3, tenant="default", user_id="u1", content="Fresh")
        for memory in (unused, used, fresh):
            await store.add(memory)
        assert gateway.res.worker is not None
        assert await gateway.res.worker.sweep_retention() == 1
        left = await store.list_memories(ListQuery(tenant="default", user="u1"))
        assert sorted(m.content for m in left) == ["Fresh", "Old used"]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def kept(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway with learning on and 30 days' retention, on each backend."""
    settings = make_settings(tmp_path, learning={"enabled": True, "retention_days": 30},
                             **backend_overrides(request, tmp_path))
    async with running_gateway(settings) as gateway:
        yield gateway


async def test_retention_never_purges_what_the_user_wrote_or_imported(kept: Gateway) -> None:
    """A memory added or imported with a ``created_at`` older than the retention window
    and never injected stays (it was accepted with a 201 / ``imported``, and the user
    wrote it); the learned one as old goes. More such manual memories than the sweep's
    page do not hide the learned one behind them."""
    old = (datetime.now(UTC) - timedelta(days=400)).isoformat()
    async with kept.client(headers={"X-User-Id": "u1"}) as client:
        for n in range(3):
            added = await client.post("/v1/memories", json={
                "content": f"Has a dog named Rex {n}0", "created_at": old})
            assert added.status_code == 201, added.text
        imported = await client.post("/v1/memories/import", json={"results": [
            {"id": "m1", "memory": "Allergic to peanuts", "created_at": old}]})
        assert imported.json()["imported"] == 1, imported.text
    learned = mem(1, tenant="default", user_id="u1", content="Likes jazz",
                  created_at=datetime.now(UTC) - timedelta(days=400))
    await kept.res.store.add(learned)
    assert kept.res.worker is not None
    assert await kept.res.worker.sweep_retention(limit=2) == 1
    left = await kept.res.store.list_memories(ListQuery(tenant="default", user="u1"))
    assert sorted(m.content for m in left) == [
        "Allergic to peanuts", "Has a dog named Rex 00", "Has a dog named Rex 10",
        "Has a dog named Rex 20"]
    assert await kept.res.worker.sweep_retention() == 0


async def test_delete_all_during_learning_in_flight_wins(tmp_path: Path) -> None:
    """A user who clears their memory while the extraction call is running keeps an empty
    memory: the job's results are discarded when applied: a deletion
    wins over learning in flight, so a job queued before it must not bring the fact back."""
    upstream = FakeUpstream()
    settings = make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1})
    async with running_gateway(settings, upstream) as gateway:
        upstream.extract = lambda body: {"memories": [{
            "title": "Home", "content": "Lives in City Q", "category": "user_preference",
            "subject": "user"}]}
        async def clear_mid_extraction(request: httpx.Request) -> httpx.Response:
            if b"New messages" in request.content:
                async with gateway.client(headers={"X-User-Id": "u1"}) as client:
                    response = await client.delete("/v1/memories", params={"confirm": "true"})
                    assert response.status_code == 200
            return await upstream.respond(request)

        async with gateway.client() as client:
            await client.post("/v1/chat/completions", headers={"X-User-Id": "u1"}, json={
                "model": "m", "messages": [{"role": "user", "content": "I live in City Q."}]})
        upstream.intercept = clear_mid_extraction
        await gateway.settle()
        assert [k for k, _ in upstream.learning_calls] == ["score", "extract"]
        assert await gateway.res.store.list_memories(
            ListQuery(tenant="default", user="u1", include_retired=True)) == []
