"""Erasure leaves no trace a later reader can see (docs/design.md#erasure): caches of
another store instance (another process) are invalid on their next read, and a write
after the erasure never brings the user's counters back to a value seen before. Both
backends; the Redis one on the session's real test Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.store import AuditEvent, MemoryStore
from tests.memory.test_store_contract import ask, mem

Pair = tuple[MemoryStore, MemoryStore]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    """Two store instances over the same data: two SQLite connections sets on one file,
    or two Redis clients on one prefix (what two gateway processes hold)."""
    if request.param == "sqlite":
        async with SqliteDatabase(tmp_path / "memory.db") as one, \
                SqliteDatabase(tmp_path / "memory.db") as two:
            yield SqliteMemoryStore(one), SqliteMemoryStore(two)
        return
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.store import RedisMemoryStore

    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
    async with connect(url) as a, connect(url) as b:
        first = RedisMemoryStore(a, key_prefix=prefix, vector_dim=4)
        second = RedisMemoryStore(b, key_prefix=prefix, vector_dim=4)
        await first.prepare()
        await second.prepare()
        yield first, second


def _tombstone() -> AuditEvent:
    return AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user",
                      at=datetime.now(UTC))


async def _recalled(store: MemoryStore) -> set[str]:
    found = await store.search(ask("Harbour fact", embedding=(1.0, 0.0, 0.0, 0.0),
                                   include_shared=False))
    return {c.memory.content for c in found}


async def test_recall_of_another_instance_sees_only_what_was_added_after_erasure(
        pair: Pair) -> None:
    """Three memories, recalled (and cached) by the second instance; the first erases
    the user and adds three others — the same number of writes as before: the second
    instance recalls the three new ones only."""
    first, second = pair
    for i in range(3):
        await first.add(mem(f"Harbour fact old {i}", embedding=(1.0, 0.0, 0.0, float(i))))
    assert await _recalled(second) == {f"Harbour fact old {i}" for i in range(3)}
    await _recalled(second)  # served from its caches now

    await first.erase_user("t1", "u1", audit=_tombstone())
    for i in range(3):
        await first.add(mem(f"Harbour fact new {i}", embedding=(1.0, 0.0, 0.0, float(i))))

    assert await _recalled(second) == {f"Harbour fact new {i}" for i in range(3)}


async def test_erasure_of_one_user_keeps_another_instances_cache_of_others(
        pair: Pair) -> None:
    """Negative case: erasing u1 changes nothing another instance recalls for u2."""
    first, second = pair
    await first.add(mem("Harbour fact of u2", user="u2", embedding=(1.0, 0.0, 0.0, 0.0)))
    query = ask("Harbour fact", user="u2", include_shared=False)
    assert [c.memory.content for c in await second.search(query)] == ["Harbour fact of u2"]
    await first.erase_user("t1", "u1", audit=_tombstone())
    assert [c.memory.content for c in await second.search(query)] == ["Harbour fact of u2"]


async def test_names_of_lists_the_users_bound_names_until_erasure(pair: Pair) -> None:
    """names_of gives the names bound to the user (normalised, sorted), never another
    user's; after erasure none (what erasure looked for in group buffers is gone too)."""
    store, _ = pair
    await store.bind_names("t1", "u1", ["Alice", "ＡＬＩ"])
    await store.bind_names("t1", "u2", ["Bob"])
    assert await store.names_of("t1", "u1") == ["ali", "alice"]
    assert await store.names_of("t1", "u2") == ["bob"]
    await store.erase_user("t1", "u1", audit=_tombstone())
    assert await store.names_of("t1", "u1") == []
    assert await store.names_of("t1", "u2") == ["bob"]
