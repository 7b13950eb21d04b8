"""The MemoryStore contract for injection records, on both backends: a record reads back
as written and only for its owner, the retention window and the per-user cap drop a
written user's oldest at each write, and records stored as the API's JSON (before the compact form)
still read back.

Uses the shared ``store`` fixture of :mod:`tests.memory.conftest`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from proxy.backends.redis.keys import KeyLayout, user_token
from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.explain import InjectionRecord, Item, row
from proxy.memory.records import new_id, to_iso
from proxy.memory.store import MemoryStore

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
WEEK = timedelta(days=7)
ITEMS: tuple[Item, ...] = (("profile", "traits[2]", 0.42, ("resident",)),
                           ("memory", "m-tea", 0.87654321, ("keyword", "conversation")),
                           ("memory", "m-dog", 0.6, ("resident",)))


def record(at: datetime, *, user: str = "u1", tenant: str = "t1",
           items: tuple[Item, ...] = ITEMS) -> InjectionRecord:
    return InjectionRecord(id=new_id(), tenant=tenant, user=user, created_at=at,
                           model="gpt-x", conversation_id="c1", channel="private",
                           items=items)


async def test_a_record_reads_back_as_written_and_only_for_its_owner(
        store: MemoryStore) -> None:
    """Every field comes back (times to the microsecond); another user, another tenant,
    an unknown id or a ``since`` after it finds nothing."""
    mine = record(T0 + timedelta(microseconds=123))
    other = record(T0, user="u2", items=())
    await store.record_injections([row(mine), row(other)], now=T0, retention=WEEK,
                                  per_user=10)
    back = await store.get_injection("t1", "u1", mine.id, since=T0 - WEEK)
    assert back == mine
    assert back is not None
    assert back.to_api() == mine.to_api()
    assert await store.get_injection("t1", "u2", other.id, since=T0 - WEEK) == other
    assert await store.get_injection("t1", "u2", mine.id, since=T0 - WEEK) is None
    assert await store.get_injection("t2", "u1", mine.id, since=T0 - WEEK) is None
    assert await store.get_injection("t1", "u1", new_id(), since=T0 - WEEK) is None
    assert await store.get_injection("t1", "u1", mine.id,
                                     since=T0 + timedelta(seconds=1)) is None


async def test_each_write_keeps_only_the_users_newest_and_drops_expired_ones(
        store: MemoryStore) -> None:
    """A user over the cap keeps their newest ``per_user``, across batches; records older
    than the retention window are not read; another user's cap is theirs."""
    first = [record(T0 + timedelta(seconds=s)) for s in range(4)]
    await store.record_injections([row(r) for r in first], now=T0, retention=WEEK,
                                  per_user=3)
    later = [record(T0 + timedelta(seconds=s)) for s in (10, 11)]
    neighbour = record(T0, user="u2")
    await store.record_injections([row(r) for r in (*later, neighbour)], now=T0,
                                  retention=WEEK, per_user=3)

    async def present(records: list[InjectionRecord], user: str = "u1", *,
                      now: datetime = T0) -> list[bool]:
        """Which of ``records`` the user reads at ``now`` (as the route asks)."""
        return [await store.get_injection("t1", user, r.id, since=now - WEEK)
                is not None for r in records]

    assert await present(first + later) == [False, False, False, True, True, True]
    assert await present([neighbour], "u2") == [True]
    # A week on, those older than the window (first[3], at T0 + 3 s) are gone and a new
    # record's write keeps the rest within the cap.
    fresh = record(T0 + WEEK + timedelta(seconds=5))
    await store.record_injections([row(fresh)], now=fresh.created_at, retention=WEEK,
                                  per_user=3)
    assert await present([first[3], *later, fresh], now=fresh.created_at) == [
        False, True, True, True]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def legacy(request: pytest.FixtureRequest,
                 tmp_path: Path) -> AsyncIterator[tuple[MemoryStore, InjectionRecord]]:
    """A store holding one record written the way the store wrote it before the compact
    form: the API's JSON (SQLite: in the ``record`` column; Redis: as the key's value)."""
    old = record(T0)
    raw = orjson.dumps(old.to_api()).decode()
    if request.param == "sqlite":
        async with SqliteDatabase(tmp_path / "memory.db") as db:
            await db.write(lambda c: c.execute(
                "INSERT INTO injections (id, tenant, user_id, created_at, record) "
                "VALUES (?, ?, ?, ?, ?)", (old.id, "t1", "u1", to_iso(old.created_at), raw)))
            yield SqliteMemoryStore(db), old
        return
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.store import RedisMemoryStore

    prefix = request.getfixturevalue("redis_prefix")
    async with connect(request.getfixturevalue("redis_url")) as client:
        redis_store = RedisMemoryStore(client, key_prefix=prefix)
        await redis_store.prepare()
        ns = user_token("t1", "u1")
        await client.set(KeyLayout(prefix).injection(ns, old.id), raw)
        await client.zadd(KeyLayout(prefix).injections(ns), {old.id: T0.timestamp()})
        yield redis_store, old


async def test_a_record_stored_as_api_json_still_reads_and_is_capped(
        legacy: tuple[MemoryStore, InjectionRecord]) -> None:
    store, old = legacy
    back = await store.get_injection("t1", "u1", old.id, since=T0 - WEEK)
    assert back is not None
    assert back.to_api() == old.to_api()  # scores as the API rounds them
    assert await store.get_injection("t1", "u2", old.id, since=T0 - WEEK) is None
    newer = record(T0 + timedelta(seconds=1))
    await store.record_injections([row(newer)], now=T0, retention=WEEK, per_user=1)
    assert await store.get_injection("t1", "u1", old.id, since=T0 - WEEK) is None
    assert await store.get_injection("t1", "u1", newer.id, since=T0 - WEEK) == newer
