"""The recall index brought up to date from the Redis change log: a refresh reads only the
memories written since (counted on the real server), a write the log cannot name (clear,
erasure, an overflowing log) reads everything again, and a write that changes nothing
recall reads does not move the generation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from proxy.backends.redis.changes import UNKNOWN, ChangeLog, changed_ids
from proxy.backends.redis.client import connect
from proxy.backends.redis.generations import Generations
from proxy.backends.redis.keys import KeyLayout, user_token
from proxy.backends.redis.store import RedisMemoryStore
from proxy.memory.index import RecallIndexes
from proxy.memory.recall import RankWeights
from proxy.memory.records import Memory, Profile, new_id
from proxy.memory.retrieve import Retriever, SubQuery
from proxy.memory.store import READ_TURN, AuditEvent, ChangeSet

pytestmark = pytest.mark.redis

T0 = datetime(2025, 1, 1, tzinfo=UTC)
NOW = datetime(2025, 6, 1, tzinfo=UTC)
READS = ("hgetall", "FT.SEARCH", "FT.AGGREGATE")  # the commands a corpus read uses


def mem(content: str, **fields: Any) -> Memory:
    return Memory(id=new_id(), tenant="t1", user_id="u1", content=content,
                  title=content[:30], created_at=T0, updated_at=T0, last_seen_at=T0, **fields)


@pytest.fixture
async def stores(redis_url: str, redis_prefix: str
                 ) -> AsyncIterator[tuple[RedisMemoryStore, RedisMemoryStore, Redis]]:
    """A reader and a writer store on one prefix (two processes), and a plain client."""
    async with connect(redis_url) as one, connect(redis_url) as two, \
            connect(redis_url) as plain:
        reader = RedisMemoryStore(one, key_prefix=redis_prefix)
        writer = RedisMemoryStore(two, key_prefix=redis_prefix)
        await reader.prepare()
        await writer.prepare()
        yield reader, writer, plain


async def calls(client: Redis) -> dict[str, int]:
    """Commands the server has run so far, by name (``INFO commandstats``)."""
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(entry["calls"])
            for name, entry in stats.items()}


async def reads_of(client: Redis, step: Any) -> dict[str, int]:
    """The corpus-read commands the server ran during ``await step()``."""
    before = await calls(client)
    await step()
    after = await calls(client)
    return {name: after.get(name, 0) - before.get(name, 0) for name in READS
            if after.get(name, 0) - before.get(name, 0)}


def retriever(store: RedisMemoryStore) -> Retriever:
    return Retriever(store=store, embedder=None, weights=RankWeights(), candidate_pool=30,
                     indexes=RecallIndexes())


async def recall(retriever: Retriever, text: str) -> list[str]:
    result = await retriever.recall(tenant="t1", user="u1", queries=[SubQuery(text)],
                                    limit=10, now=NOW)
    return sorted(r.memory.content for r in result.ranked)


async def test_a_refresh_reads_only_the_memories_written_since(
        stores: tuple[RedisMemoryStore, RedisMemoryStore, Redis]) -> None:
    """After another process adds one memory and updates another, the next recall reads
    exactly those two hashes and no search; with no write it reads none."""
    reader, writer, plain = stores
    # Two digits each: a single digit is no term and "…number 1" lies inside "…number 12",
    # so with one digit the first-ranked text decides how many near-duplicates recall
    # drops, and ids made in one millisecond rank in a random order.
    kept = [mem(f"Drinks tea number {i:02d}") for i in range(20)]
    for memory in kept:
        await writer.add(memory)
    found = retriever(reader)
    await recall(found, "tea")
    await found.index("t1", "u1")  # the first build: a whole read
    assert len(await recall(found, "tea")) == 10

    assert await reads_of(plain, lambda: recall(found, "tea")) == {}
    oolong = mem("Drinks oolong tea after lunch")
    await writer.add(oolong)
    await writer.update(kept[3].with_changes(hits=7))
    seen: list[str] = []

    async def step() -> None:
        seen.extend(await recall(found, "oolong"))

    assert await reads_of(plain, step) == {"hgetall": 2}
    assert seen == [oolong.content]
    index = await found.index("t1", "u1")
    assert {m.id: m.hits for m in index.memories}[kept[3].id] == 7
    assert len(index.memories) == 21


async def test_a_refresh_drops_what_was_deleted_or_disabled(
        stores: tuple[RedisMemoryStore, RedisMemoryStore, Redis]) -> None:
    """A memory deleted or disabled by another process is gone from the next recall,
    read from the change log without a search."""
    reader, writer, plain = stores
    tea, oolong = mem("Drinks green tea"), mem("Drinks oolong tea")
    await writer.add(tea)
    await writer.add(oolong)
    found = retriever(reader)
    await recall(found, "tea")
    await found.index("t1", "u1")
    await writer.delete("t1", "u1", tea.id)
    await writer.update(oolong.with_changes(enabled=False))
    seen: list[str] = []

    async def step() -> None:
        seen.extend(await recall(found, "tea"))

    assert await reads_of(plain, step) == {"hgetall": 2}  # the deleted one: an empty hash
    assert seen == []


@pytest.mark.parametrize("wipe", ["clear", "erase"])
async def test_clear_and_erasure_read_everything_again(
        stores: tuple[RedisMemoryStore, RedisMemoryStore, Redis], redis_prefix: str,
        wipe: str) -> None:
    """A clear or an erasure names no memory in the log: the next recall reads the whole
    corpus again (a search) and serves nothing of what was wiped."""
    reader, writer, plain = stores
    await writer.add(mem("Drinks green tea"))
    found = retriever(reader)
    await recall(found, "tea")
    await found.index("t1", "u1")
    if wipe == "clear":
        await writer.clear("t1", "u1")
    else:
        await writer.erase_user("t1", "u1", audit=AuditEvent(
            tenant="t1", user_id="u1", action="erased", actor="user", at=NOW))
    seen: list[str] = []

    async def step() -> None:
        seen.extend(await recall(found, "tea"))

    assert "FT.SEARCH" in await reads_of(plain, step)
    assert seen == []
    token = user_token("t1", "u1")
    assert await plain.zrange(KeyLayout(redis_prefix).changes(token), 0, -1) \
        == [UNKNOWN.encode()]


async def test_a_write_of_nothing_recall_reads_keeps_the_generation(
        stores: tuple[RedisMemoryStore, RedisMemoryStore, Redis]) -> None:
    """A learning batch that only updates the profile leaves the generation as it was (the
    index stays current); one that writes a memory moves it."""
    reader, writer, _ = stores
    tea = mem("Drinks green tea")
    await writer.add(tea)
    before = await reader.recall_generations("t1", "u1")
    await writer.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b1",
                                 profile=Profile(tenant="t1", user_id="u1", style="terse")))
    assert await reader.recall_generations("t1", "u1") == before
    assert (await writer.get_profile("t1", "u1")).style == "terse"  # type: ignore[union-attr]
    await writer.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b2",
                                 upserts=(mem("Drinks oolong tea"),)))
    assert await reader.recall_generations("t1", "u1") != before


async def test_an_overflowing_log_sends_older_readers_to_a_whole_read(
        redis_url: str, redis_prefix: str) -> None:
    """With a log of three entries, a reader whose generation is older than a dropped
    entry is told to read everything; a reader after it gets the ids changed since."""
    keys = KeyLayout(redis_prefix)
    async with connect(redis_url) as client:
        log, generations = ChangeLog(client, keys, entries=3), Generations(client, keys)
        for name in ("a", "b", "c", "d", "e"):  # generations 1..5, "a" and "b" dropped
            async with client.pipeline(transaction=True) as pipe:
                log.queue(pipe, "ns", [name])
                await pipe.execute()
        assert await generations.changes(["ns"], [1]) == ((5,), None)
        assert await generations.changes(["ns"], [2]) == ((5,), [{"c", "d", "e"}])
        assert await generations.changes(["ns"], [4]) == ((5,), [{"e"}])
        assert await generations.changes(["ns"], [5]) == ((5,), [set()])
        async with client.pipeline(transaction=True) as pipe:
            log.queue(pipe, "ns", [])  # nothing changed: no move
            await pipe.execute()
        assert await generations.read(["ns"]) == (5,)


@pytest.mark.parametrize(("entries", "since", "now", "expected"), [
    ([], 3, 3, set()),
    ([(b"a", 4.0), (b"b", 5.0)], 3, 5, {"a", "b"}),
    ([(b"a", 4.0), (b"b", 6.0)], 3, 5, {"a", "b"}),  # a write after the counter was read
    ([(b"a", 4.0)], 3, 5, None),  # the move to 5 is not in the log: a write that did not log
    ([(b"a", 4.0), (b"*", 5.0)], 3, 5, None),
    ([], 5, 3, None),  # a counter that went back
])
def test_changed_ids_trusts_the_log_only_when_it_holds_the_latest_move(
        entries: list[tuple[bytes, float]], since: int, now: int,
        expected: set[str] | None) -> None:
    """The ids above ``since``; ``None`` (read everything) for an unknown change, a move
    the log does not hold, or a counter that went back."""
    assert changed_ids(entries, since=since, now=now) == expected


@pytest.mark.parametrize("profile_first", [True, False])
async def test_a_requests_profile_and_generations_are_one_round_trip(
        stores: tuple[RedisMemoryStore, RedisMemoryStore, Redis], profile_first: bool) -> None:
    """In one request's read turn, whichever of the profile and the recall generations is
    read first fetches both in one pipeline and the other then sends no command (once);
    another user's, or a read outside a turn, reads for itself."""
    reader, writer, plain = stores
    await writer.add(mem("Drinks green tea"))
    await writer.put_profile(Profile(tenant="t1", user_id="u1", style="terse"))
    expected = await reader.recall_generations("t1", "u1")

    async def counted(step: Any) -> tuple[Any, int]:
        before = (await calls(plain)).get("get", 0)
        value = await step()
        return value, (await calls(plain)).get("get", 0) - before

    def profile() -> Any:
        return reader.get_profile("t1", "u1")

    def generations(user: str = "u1") -> Any:
        return reader.recall_generations("t1", user)

    async def request() -> list[tuple[Any, int]]:
        READ_TURN.set(object())
        order = [profile, generations] if profile_first else [generations, profile]
        return [await counted(order[0]), await counted(order[1]),
                await counted(order[1]), await counted(lambda: generations("u2"))]

    first, second, again, other = await asyncio.create_task(request())
    assert first[1] == 4  # the profile and the three owners' counters, one pipeline
    assert second[1] == 0
    assert again[1] == 4  # taken once: read again (with the other again)
    profiles = [v for v, _ in (first, second, again) if not isinstance(v, tuple)]
    assert [p.style for p in profiles] == ["terse"] * len(profiles)
    assert [v for v, _ in (first, second, again) if isinstance(v, tuple)] == \
        [expected] * (3 - len(profiles))
    assert other[1] == 4
    assert await counted(generations) == (expected, 3)  # no turn: the counters alone
