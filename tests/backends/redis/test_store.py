"""What only the Redis backend has: index versioning and migration, key layout, the
registry sweep of clear(), and failure translation. (Behaviour shared with SQLite is in
test_store_contract.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from proxy.backends.redis.client import connect
from proxy.backends.redis.codec import memory_to_hash
from proxy.backends.redis.index import index_name
from proxy.backends.redis.keys import KeyLayout, tenant_token, user_token
from proxy.backends.redis.store import RedisMemoryStore
from proxy.memory.records import ConversationRecord, Memory, Profile, new_id
from proxy.memory.store import (
    AuditEvent,
    ChangeSet,
    ListQuery,
    SearchQuery,
    StoreUnavailableError,
    UserSettings,
)
from proxy.memory.text import query_terms
from tests.redis_server import free_port

pytestmark = pytest.mark.redis
T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    async with connect(redis_url) as redis:
        yield redis


async def opened(client: Redis, prefix: str, dim: int | None) -> RedisMemoryStore:
    store = RedisMemoryStore(client, key_prefix=prefix, vector_dim=dim)
    await store.prepare()
    return store


def mem(content: str, **fields: Any) -> Memory:
    return Memory(id=new_id(), tenant="t1", user_id="u1", content=content, **fields)


def keyword(text: str, **fields: Any) -> SearchQuery:
    return SearchQuery(tenant="t1", user="u1", terms=tuple(query_terms(text)), **fields)


async def indexes(client: Redis, prefix: str) -> list[str]:
    names = await client.execute_command("FT._LIST")  # type: ignore[no-untyped-call]
    return sorted(n.decode() for n in names if n.decode().startswith(prefix + "_"))


# versioning and migration ---------------------------------------------------------------

async def test_index_name_carries_schema_version_and_dimension() -> None:
    """Index names say what they index: prefix, schema version, vector dimension."""
    assert index_name("mp", None) == "mp_mem_v1_dnone"
    assert index_name("mp", 384) == "mp_mem_v1_d384"


async def test_adding_a_vector_dimension_migrates_without_losing_memories(
    client: Redis, redis_prefix: str
) -> None:
    """Memories written without a vector index stay keyword-searchable after a restart
    with dimension 4; those with 4-dimensional embeddings (stored before, or added
    later) become vector-searchable; the old index is dropped, no memory is."""
    before = await opened(client, redis_prefix, None)
    plain = mem("Keeps bees in the garden")
    vec4 = mem("Keeps chickens in the garden", embedding=(1.0, 0.0, 0.0, 0.0))
    vec3 = mem("Keeps goats in the garden", embedding=(1.0, 0.0, 0.0))
    for memory in (plain, vec4, vec3):
        await before.add(memory)
    assert await before.search(keyword("garden", embedding=(1.0, 0.0, 0.0, 0.0))) != []

    after = await opened(client, redis_prefix, 4)
    assert await indexes(client, redis_prefix) == [f"{redis_prefix}_mem_v1_d4"]
    found = await after.search(keyword("garden", embedding=(1.0, 0.0, 0.0, 0.0)))
    assert {c.memory.id for c in found} == {plain.id, vec4.id, vec3.id}
    by_vector = [c.memory.id for c in found if c.vector_rank is not None]
    assert by_vector == [vec4.id]
    await after.update(plain.with_changes(embedding=(0.0, 1.0, 0.0, 0.0)))
    nearest = await after.search(SearchQuery(tenant="t1", user="u1", terms=(),
                                             embedding=(0.0, 1.0, 0.0, 0.0)))
    assert sorted(nearest, key=lambda c: c.vector_rank or 0)[0].memory.id == plain.id
    assert (await after.count("t1", "u1"))["total"] == 3

    back = await opened(client, redis_prefix, None)
    assert await indexes(client, redis_prefix) == [f"{redis_prefix}_mem_v1_dnone"]
    assert len(await back.search(keyword("garden"))) == 3
    stored = await back.get("t1", "u1", vec4.id)
    assert stored is not None
    assert stored.embedding == (1.0, 0.0, 0.0, 0.0)


async def test_search_stays_complete_while_a_new_index_is_built(
    client: Redis, redis_prefix: str
) -> None:
    """Right after a dimension change, before the new index is built, queries go to the
    previous index, so no memory is missing from keyword search or counts; once built,
    the new index serves (vectors included) and the old one is gone."""
    import asyncio

    import numpy as np

    before = await opened(client, redis_prefix, None)
    rng = np.random.default_rng(3)
    total = 2000
    for start in range(0, total, 500):
        batch = tuple(mem(f"Garden note {i}", embedding=tuple(rng.standard_normal(64).tolist()))
                      for i in range(start, start + 500))
        await before.apply(ChangeSet(tenant="t1", user_id="u1", batch_key=f"b{start}",
                                     upserts=batch))
    after = RedisMemoryStore(client, key_prefix=redis_prefix, vector_dim=64,
                             index_build_wait_seconds=0)
    await after.prepare()
    served_by_previous = after.serving_index != after.index_name
    assert len(await after.search(keyword("garden note", limit=total))) == total
    for _ in range(600):
        assert (await after.count("t1", "u1"))["total"] == total
        if after.serving_index == after.index_name:
            break
        await asyncio.sleep(0.05)
        await after.ping()
    assert served_by_previous or after.serving_index == after.index_name
    assert after.serving_index == after.index_name
    assert await indexes(client, redis_prefix) == [after.index_name]
    probe = await after.list_memories(ListQuery(tenant="t1", user="u1", limit=1))
    assert probe[0].embedding is not None
    nearest = await after.search(SearchQuery(tenant="t1", user="u1", terms=(),
                                             embedding=probe[0].embedding, limit=1))
    assert [c.memory.id for c in nearest] == [probe[0].id]


async def test_reopening_with_the_same_schema_keeps_the_index(
    client: Redis, redis_prefix: str
) -> None:
    """A restart with unchanged settings reuses the index as it is."""
    first = await opened(client, redis_prefix, 4)
    await first.add(mem("Keeps bees"))
    second = await opened(client, redis_prefix, 4)
    assert await indexes(client, redis_prefix) == [first.index_name]
    assert len(await second.search(keyword("bees"))) == 1


async def test_an_index_with_unexpected_fields_is_refused(
    client: Redis, redis_prefix: str
) -> None:
    """An index under the configured name but with other fields (a schema change without
    a version bump) is reported as unavailable, not used, and nothing is deleted."""
    layout = KeyLayout(redis_prefix)
    await client.execute_command(  # type: ignore[no-untyped-call]
        "FT.CREATE", index_name(redis_prefix, None), "ON", "HASH", "PREFIX", "1",
        layout.memory_prefix, "SCHEMA", "ix_ns", "TAG")
    await client.hset(layout.memory("ns", "m1"), mapping={"ix_ns": "ns"})
    store = RedisMemoryStore(client, key_prefix=redis_prefix)
    with pytest.raises(StoreUnavailableError, match="SCHEMA_VERSION"):
        await store.prepare()
    assert await client.exists(layout.memory("ns", "m1")) == 1


# ranking parity with SQLite -------------------------------------------------------------

WORDS = (  # noqa: SIM905 - a vocabulary reads better as text
    "coffee tea garden river city chess piano guitar python cache deploy cluster "
    "invoice customer meeting project deadline budget travel hiking cycling yoga dog "
    "cat peanut sushi pasta wine birthday school exam novel movie jazz museum camera "
    "咖啡 绿茶 跑步 爬山 花园 钢琴 数据库 客户 会议 项目 旅行 小猫 电影 音乐会"
).split()


async def test_keyword_ranking_agrees_with_sqlite(
    client: Redis, redis_prefix: str, tmp_path: Any
) -> None:
    """On the same memories and queries, the Redis store's keyword top 5 is (nearly) the
    SQLite store's: same terms, stems and BM25 summed over query terms, no score from the
    namespace filters. Small differences in BM25 constants may swap near-ties."""
    import random

    from proxy.backends.sqlite.database import SqliteDatabase
    from proxy.backends.sqlite.store import SqliteMemoryStore

    rng = random.Random(11)
    memories = [Memory(id=f"{u}{i:05d}", tenant="t1", user_id=f"u{u}", title="",
                       content=" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))))
                for u in range(2) for i in range(300)]
    queries = [tuple(query_terms(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))))
               for _ in range(40)]
    redis_store = await opened(client, redis_prefix, None)
    async with SqliteDatabase(tmp_path / "parity.db") as db:
        sqlite_store = SqliteMemoryStore(db)
        for store in (redis_store, sqlite_store):
            for u in range(2):
                await store.apply(ChangeSet(tenant="t1", user_id=f"u{u}", batch_key="fill",
                                            upserts=tuple(m for m in memories
                                                          if m.user_id == f"u{u}")))
        shares = []
        for terms in queries:
            tops = []
            for store in (sqlite_store, redis_store):
                hits = await store.search(SearchQuery(tenant="t1", user="u0", terms=terms,
                                                      limit=5, include_shared=False))
                tops.append({c.memory.id for c in hits})
            shares.append(len(tops[0] & tops[1]) / max(1, len(tops[0])))
    # This data: 0.90 (BM25 constants differ: b 0.5 vs 0.75, IDF +1); a filtered
    # ``@ix_terms:(a|b)`` query, which lets tag filters score and unions stop early: 0.51.
    assert sum(shares) / len(shares) >= 0.8


# key layout ---------------------------------------------------------------------------

@pytest.mark.parametrize("user", ["u1", "x}{y", "{u1}"])
async def test_every_key_of_a_user_shares_one_cluster_slot(
    client: Redis, redis_prefix: str, user: str
) -> None:
    """All of a user's keys (memories, evidence, registries, profile, conversations,
    settings, batches, tombstones, audit stream) hash to one slot — whatever braces the
    user id holds — so one MULTI can change them together on Redis Cluster."""
    store = await opened(client, redis_prefix, None)
    memory = mem("Keeps bees").with_changes(user_id=user)
    doomed = mem("Keeps wasps").with_changes(user_id=user)
    await store.add(doomed)
    await store.delete("t1", user, doomed.id)
    await store.apply(ChangeSet(
        tenant="t1", user_id=user, batch_key="b1", upserts=(memory,),
        evidence=((memory.id, "b1"),), profile=Profile(tenant="t1", user_id=user, style="x"),
        conversation=ConversationRecord(tenant="t1", user_id=user, conversation_id="c{1}",
                                        learned_messages=1),
        audit=(AuditEvent(tenant="t1", user_id=user, action="created", actor="auto", at=T0),),
    ))
    await store.put_user_settings("t1", user, UserSettings(enable_personal_learning=False))
    token = user_token("t1", user)
    keys = [k async for k in client.scan_iter(match=f"{redis_prefix}:*{{{token}}}*")]
    kinds = {k.decode().split(":")[1] for k in keys}
    assert kinds == {"m", "ids", "ev", "tomb", "prof", "conv", "convs", "settings", "batches",
                     "audit", "auditrefs", "facts", "gen", "chg"}
    assert len({key_slot(k) for k in keys}) == 1
    assert await store.get("t1", user, memory.id) == memory


async def test_clear_leaves_no_memory_key_or_index_entry(
    client: Redis, redis_prefix: str
) -> None:
    """After clear() only the user's settings, tombstones, applied batches and audit log
    remain; no memory hash, evidence, conversation or profile key, and the index holds no
    document of the user (a purge that misses an index once let deleted memories come back
    in search)."""
    store = await opened(client, redis_prefix, 4)
    kept = mem("Keeps bees", embedding=(1.0, 0.0, 0.0, 0.0))
    await store.apply(ChangeSet(
        tenant="t1", user_id="u1", batch_key="b1", upserts=(kept,),
        evidence=((kept.id, "b1"),), profile=Profile(tenant="t1", user_id="u1", style="x"),
        conversation=ConversationRecord(tenant="t1", user_id="u1", conversation_id="c",
                                        learned_messages=1)))
    doomed = mem("Keeps wasps")
    await store.add(doomed)
    await store.delete("t1", "u1", doomed.id)
    assert await store.clear("t1", "u1") == 1
    token = user_token("t1", "u1")
    keys = [k async for k in client.scan_iter(match=f"{redis_prefix}:*{{{token}}}*")]
    # "gen": the memory write generation, a number that must never go back (recall index);
    # "chg": its change log, which names no memory any more, only "everything changed"
    assert {k.decode().split(":")[1] for k in keys} == {"settings", "tomb", "batches", "gen",
                                                        "chg"}
    assert await client.zrange(KeyLayout(redis_prefix).changes(token), 0, -1) == [b"*"]
    info = await client.ft(store.index_name).search(f"@ix_ns:{{{token}}}")
    assert info.total == 0  # type: ignore[union-attr]


async def test_clear_sweeps_memories_missing_from_the_registry(
    client: Redis, redis_prefix: str
) -> None:
    """A memory hash of the user that the id registry does not list (written by other
    means) is still found through the index and deleted by clear()."""
    store = await opened(client, redis_prefix, None)
    stray = mem("Stray fact about bees")
    layout = KeyLayout(redis_prefix)
    key = layout.memory(user_token("t1", "u1"), stray.id)
    await client.hset(key, mapping=memory_to_hash(stray))  # type: ignore[arg-type]
    assert len(await store.search(keyword("bees"))) == 1
    assert await store.clear("t1", "u1") == 1
    assert await client.exists(key) == 0
    assert await store.search(keyword("bees")) == []


async def test_no_deleted_text_stays_in_redis(client: Redis, redis_prefix: str) -> None:
    """After delete() and clear(), no key, field, value or stream entry under the prefix
    holds the deleted text — tombstones keep a digest, not the content
    (deleted means gone from every store)."""
    store = await opened(client, redis_prefix, 4)
    one = mem("Diagnosis code ZX81 from the clinic", embedding=(1.0, 0.0, 0.0, 0.0))
    two = mem("Salary is 93417 per year", title="Salary 93417")
    await store.add(one)
    await store.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b", upserts=(two,),
                                evidence=((two.id, "b"),)))
    await store.delete("t1", "u1", one.id)
    await store.clear("t1", "u1")
    assert set(await store.tombstoned("t1", "u1", ["diagnosis code zx81 from the clinic"]))
    dump: list[bytes] = []
    async for key in client.scan_iter(match=f"{redis_prefix}:*"):
        kind = (await client.type(key)).decode()
        dump.append(key)
        if kind == "hash":
            for field, value in (await client.hgetall(key)).items():
                dump += [field, value]
        elif kind == "stream":
            for _, fields in await client.xrange(key):
                dump += list(fields.values())
        elif kind in ("set", "zset"):
            members = await (client.smembers(key) if kind == "set"
                             else client.zrange(key, 0, -1))
            dump += list(members)
        else:
            dump.append(await client.get(key) or b"")
    text = b" ".join(dump).lower()
    assert b"zx81" not in text
    assert b"93417" not in text


async def test_audit_streams_are_trimmed(client: Redis, redis_prefix: str) -> None:
    """The audit streams keep about their MAXLEN newest entries (approximate trimming
    drops whole 100-entry nodes), newest first as always."""
    from proxy.backends.redis.audit import AuditStreams

    streams = AuditStreams(client, KeyLayout(redis_prefix), user_maxlen=50, tenant_maxlen=80)
    for n in range(6):
        await streams.append([AuditEvent(tenant="t1", user_id="u1", action="scored",
                                         actor="auto", at=T0, reason=f"{n}-{i}")
                              for i in range(100)])
    mine = await streams.read("t1", "u1", limit=1000, before_id=None)
    tenant = await streams.read("t1", None, limit=1000, before_id=None)
    assert 50 <= len(mine) <= 200
    assert 80 <= len(tenant) <= 200
    assert mine[0][1].reason == tenant[0][1].reason == "5-99"


# failures -----------------------------------------------------------------------------

Call = Callable[[RedisMemoryStore], Awaitable[object]]
CALLS: dict[str, Call] = {
    "ping": lambda s: s.ping(),
    "prepare": lambda s: s.prepare(),
    "search": lambda s: s.search(keyword("bees")),
    "resident": lambda s: s.resident("t1", "u1", limit=3, channels=None),
    "get_profile": lambda s: s.get_profile("t1", "u1"),
    "record_access": lambda s: s.record_access("t1", {"m": 1}, T0),
    "get": lambda s: s.get("t1", "u1", "m"),
    "list_memories": lambda s: s.list_memories(ListQuery(tenant="t1", user="u1")),
    "count": lambda s: s.count("t1", "u1"),
    "add": lambda s: s.add(mem("x")),
    "update": lambda s: s.update(mem("x")),
    "delete": lambda s: s.delete("t1", "u1", "m"),
    "clear": lambda s: s.clear("t1", "u1"),
    "related": lambda s: s.related("t1", "u1", "bees", limit=3),
    "apply": lambda s: s.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b")),
    "tombstoned": lambda s: s.tombstoned("t1", "u1", ["x"]),
    "put_profile": lambda s: s.put_profile(Profile(tenant="t1", user_id="u1")),
    "get_conversation": lambda s: s.get_conversation("t1", "u1", "c"),
    "get_user_settings": lambda s: s.get_user_settings("t1", "u1"),
    "put_user_settings": lambda s: s.put_user_settings("t1", "u1", UserSettings()),
    "audit": lambda s: s.audit([AuditEvent(tenant="t1", user_id="u1", action="edited",
                                           actor="user", at=T0)]),
    "audit_log": lambda s: s.audit_log("t1", "u1"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_an_unreachable_redis_raises_store_unavailable(name: str) -> None:
    """Every method turns a connection failure into StoreUnavailableError (which the
    gateway answers by degrading memory, never chat)."""
    async with connect(f"redis://127.0.0.1:{free_port()}/0") as unreachable:
        store = RedisMemoryStore(unreachable, key_prefix="mp")
        with pytest.raises(StoreUnavailableError, match="redis"):
            await CALLS[name](store)


async def test_a_client_speaking_resp3_is_refused(redis_url: str) -> None:
    """The store needs RESP2 replies (RedisVL parses those); another client is a
    programming error, reported at construction."""
    async with Redis.from_url(redis_url, protocol=3) as resp3:
        with pytest.raises(ValueError, match="RESP2"):
            RedisMemoryStore(resp3)
    async with Redis.from_url(redis_url, protocol=2, decode_responses=True) as text:
        with pytest.raises(ValueError, match="bytes"):
            RedisMemoryStore(text)


async def test_erasure_finds_tenant_log_entries_written_before_refs_were_kept(
    client: Redis, redis_prefix: str
) -> None:
    """Tenant-log entries of the user with no ref (written by an older version) are found
    by the server-side scan of the log's older part; other users' entries stay, and so do
    the user's in another tenant."""
    store = await opened(client, redis_prefix, None)
    layout = KeyLayout(redis_prefix)
    events = [AuditEvent(tenant="t1", user_id=user, action="extracted", actor="auto",
                         at=T0, reason=f"{user} {i}", detail={"user_id": "u1"})
              for i in range(30) for user in ("u1", "u1x", "u2")]
    await store.audit([*events, AuditEvent(tenant="t2", user_id="u1", action="scored",
                                           actor="auto", at=T0)])
    # As an older version left them: no refs, no tenant marker.
    await client.delete(layout.audit_refs(user_token("t1", "u1")),
                        layout.audit_refs(tenant_token("t1")))
    await store.audit([AuditEvent(tenant="t1", user_id="u1", action="created",
                                  actor="user", at=T0)])  # one with a ref, after them
    erased = AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user", at=T0)
    await store.erase_user("t1", "u1", audit=erased)
    left = [(e.user_id, e.action) for _, e in await store.audit_log("t1", None, limit=500)]
    assert [a for u, a in left if u == "u1"] == ["erased"]
    assert sum(1 for u, _ in left if u in ("u1x", "u2")) == 60
    assert [e.action for _, e in await store.audit_log("t2", "u1")] == ["scored"]


async def test_erasure_leaves_only_the_marker_and_the_tombstone_event(
    client: Redis, redis_prefix: str
) -> None:
    """After erase_user() the user's keys are the settings hash (cleared_at only), the
    audit stream with the one tombstone event and its ref; no memory is indexed."""
    store = await opened(client, redis_prefix, 4)
    kept = mem("Keeps bees", embedding=(1.0, 0.0, 0.0, 0.0))
    await store.apply(ChangeSet(
        tenant="t1", user_id="u1", batch_key="b1", upserts=(kept,),
        evidence=((kept.id, "b1"),), profile=Profile(tenant="t1", user_id="u1", style="x"),
        conversation=ConversationRecord(tenant="t1", user_id="u1", conversation_id="c",
                                        learned_messages=1),
        audit=(AuditEvent(tenant="t1", user_id="u1", action="created", actor="auto",
                          at=T0),)))
    doomed = mem("Keeps wasps")
    await store.add(doomed)
    await store.delete("t1", "u1", doomed.id)
    erased = AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user", at=T0)
    assert await store.erase_user("t1", "u1", audit=erased) == 1
    token = user_token("t1", "u1")
    keys = [k async for k in client.scan_iter(match=f"{redis_prefix}:*{{{token}}}*")]
    assert {k.decode().split(":")[1] for k in keys} == {"settings", "audit", "auditrefs",
                                                        "gen", "chg"}
    assert await client.zrange(KeyLayout(redis_prefix).changes(token), 0, -1) == [b"*"]
    generation = await client.get(KeyLayout(redis_prefix).generation(token))
    assert generation is not None
    assert int(generation) > 0
    assert set(await client.hkeys(KeyLayout(redis_prefix).settings(token))) == {b"cleared_at"}
    info = await client.ft(store.index_name).search(f"@ix_ns:{{{token}}}")
    assert info.total == 0  # type: ignore[union-attr]


async def test_erasure_unbinds_names_listed_under_the_user_and_from_the_profile(
    client: Redis, redis_prefix: str
) -> None:
    """erase_user removes the user from the name sets bind_names listed under them, and
    from a binding an older version made (no per-user list) under a name of the
    profile; other users keep their bindings."""
    store = await opened(client, redis_prefix, None)
    await store.bind_names("t1", "u1", ["Alice"])
    await store.bind_names("t1", "u2", ["Alice", "Bob"])
    layout = KeyLayout(redis_prefix)
    await client.sadd(layout.names(tenant_token("t1"), "bob"), "u1")  # as before the list
    await store.put_profile(Profile(tenant="t1", user_id="u1", names=("Bob",)))
    erased = AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user", at=T0)
    await store.erase_user("t1", "u1", audit=erased)
    assert await store.users_named("t1", "Alice") == ["u2"]
    assert await store.users_named("t1", "Bob") == ["u2"]
    assert not await client.exists(layout.user_names(user_token("t1", "u1")))
