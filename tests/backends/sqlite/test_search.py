"""Hot-path reads of the SQLite store: keyword ranking as one query would give it, and
decoded memories reused only while their stored row is unchanged."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from proxy.backends.sqlite.codec import ACTIVE, COLUMNS, shared_token, user_token
from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.search import fts_query
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.records import Memory, new_id, utcnow
from proxy.memory.store import SearchQuery
from proxy.memory.text import query_terms

WORDS = ("ramen", "lisbon", "kafka", "pipelines", "chess", "sailing", "tea", "rust")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMemoryStore]:
    async with SqliteDatabase(tmp_path / "m.db") as db:
        store = SqliteMemoryStore(db)
        now = utcnow()
        for index in range(60):
            words = " ".join(WORDS[(index + k) % len(WORDS)] for k in range(index % 4 + 1))
            await store.add(Memory(
                id=new_id(), tenant="t", user_id="u" if index % 5 else None,
                scope="personal" if index % 5 else "shared",
                content=f"User likes {words}.", hits=index % 3 + 1,
                last_seen_at=now - timedelta(days=index % 7),
                source_channel="group:g" if index % 6 == 0 else "private",
            ))
        yield store


def one_query(path: Path, query: SearchQuery) -> list[tuple[str, float]]:
    """The ranking as the single join query (all columns through the sorter) gave it."""
    tokens = [user_token(query.tenant, query.user), shared_token(query.tenant)]
    sql = (f"SELECT {COLUMNS}, bm25(memories_fts, 0.0, 1.0) AS rank FROM memories_fts "  # noqa: S608
           f"JOIN memories m ON m.rowid = memories_fts.rowid WHERE memories_fts MATCH ? "
           f"AND {ACTIVE} ORDER BY rank LIMIT ?")
    with sqlite3.connect(path) as conn:
        rows = conn.execute(sql, (fts_query(tokens, query.terms), query.limit)).fetchall()
    return [(r[0], -float(r[-1])) for r in rows]


@pytest.mark.parametrize("text", ["ramen", "kafka pipelines", "tea rust chess", "lisbon",
                                  "likes", "sailing ramen kafka tea"])
@pytest.mark.parametrize("limit", [3, 30])
async def test_search_ranks_like_the_single_query(
    store: SqliteMemoryStore, tmp_path: Path, text: str, limit: int
) -> None:
    """Ids, order (ties included) and scores equal the one-query ranking."""
    query = SearchQuery(tenant="t", user="u", terms=tuple(query_terms(text)), limit=limit)
    found = await store.search(query)
    assert [(c.memory.id, c.keyword_score) for c in found] == one_query(tmp_path / "m.db",
                                                                        query)
    assert [c.keyword_rank for c in found] == list(range(1, len(found) + 1))


async def test_an_updated_memory_is_read_fresh(store: SqliteMemoryStore) -> None:
    """A memory changed after it was read (and cached) comes back changed."""
    query = SearchQuery(tenant="t", user="u", terms=("ramen",), limit=30)
    before = {c.memory.id: c.memory for c in await store.search(query)}
    target = next(iter(before.values()))
    await store.update(target.with_changes(content="User likes ramen a lot.", hits=9))
    after = {c.memory.id: c.memory for c in await store.search(query)}
    assert after[target.id].content == "User likes ramen a lot."
    assert after[target.id].hits == 9
    unchanged = [i for i in before if i != target.id and i in after]
    assert all(after[i] is before[i] for i in unchanged)  # decoded once, reused


async def test_resident_orders_by_evidence_then_recency(store: SqliteMemoryStore) -> None:
    """Top personal memories by (hits, last_seen_at) desc, retired ones left out."""
    resident = await store.resident("t", "u", limit=10, channels=None)
    keys = [(m.hits, m.last_seen_at) for m in resident]
    assert keys == sorted(keys, reverse=True)
    await store.update(resident[0].with_changes(superseded_at=utcnow()))
    again = await store.resident("t", "u", limit=10, channels=None)
    assert resident[0].id not in {m.id for m in again}


async def test_maintain_merges_the_keyword_index(store: SqliteMemoryStore,
                                                 tmp_path: Path) -> None:
    """Each write leaves its own FTS5 segment; maintain() merges them into one, so a
    query reads one b-tree per term, and a second run finds nothing left to merge."""
    def pages() -> int:
        with sqlite3.connect(tmp_path / "m.db") as conn:
            return int(conn.execute("SELECT count(*) FROM memories_fts_data").fetchone()[0])

    fragmented = pages()
    await store.maintain()
    merged = pages()
    assert merged < fragmented
    await store.maintain()
    assert pages() == merged


async def test_a_write_by_another_process_is_seen_on_the_next_search(
    store: SqliteMemoryStore, tmp_path: Path
) -> None:
    """Rows and vectors a search reused are read again once another connection (another
    gateway process, the worker) changed the owner's memories: added, edited, deleted."""
    query = SearchQuery(tenant="t", user="u", terms=("ramen",), limit=30)
    first = {c.memory.id: c.memory for c in await store.search(query)}
    again = {c.memory.id: c.memory for c in await store.search(query)}
    assert all(again[i] is first[i] for i in first)  # nothing changed: reused as read
    target = next(iter(first.values()))
    async with SqliteDatabase(tmp_path / "m.db") as other_db:
        other = SqliteMemoryStore(other_db)
        await other.update(target.with_changes(content="User likes ramen in Kyoto."))
        added = await other.add(Memory(id=new_id(), tenant="t", user_id="u",
                                       content="User cooks ramen on Sundays.",
                                       source_channel="private"))
        gone = next(i for i in first if i != target.id)
        assert await other.delete("t", "u", gone)
    after = {c.memory.id: c.memory for c in await store.search(query)}
    assert after[target.id].content == "User likes ramen in Kyoto."
    assert added.id in after
    assert gone not in after


async def test_vector_scans_follow_writes_of_any_connection(tmp_path: Path) -> None:
    """The vector search reuses its scan of a user's vectors until a memory of that user
    (or a shared one) changes, from this connection or another; another user's writes and
    access counts leave the result as it was."""
    def vec(x: float, y: float) -> tuple[float, ...]:
        return (x, y, 0.0, 0.0)

    async with SqliteDatabase(tmp_path / "v.db") as db:
        store = SqliteMemoryStore(db)
        near = await store.add(Memory(id=new_id(), tenant="t", user_id="u", content="near",
                                      embedding=vec(1.0, 0.1)))
        await store.add(Memory(id=new_id(), tenant="t", user_id="u", content="far",
                               embedding=vec(0.0, 1.0)))
        query = SearchQuery(tenant="t", user="u", terms=(), embedding=vec(1.0, 0.0))

        async def ranked() -> list[str]:
            found = await store.search(query)
            return [c.memory.content for c in sorted(found, key=lambda c: c.vector_rank or 0)]

        assert await ranked() == ["near", "far"]
        await store.add(Memory(id=new_id(), tenant="t", user_id="v", content="other user",
                               embedding=vec(1.0, 0.0)))
        await store.record_access("t", {near.id: 3}, utcnow())
        found = await store.search(query)
        assert [c.memory.content for c in found] == ["near", "far"]
        assert next(c for c in found if c.memory.id == near.id).memory.access_count == 3
        async with SqliteDatabase(tmp_path / "v.db") as other_db:
            other = SqliteMemoryStore(other_db)
            await other.add(Memory(id=new_id(), tenant="t", user_id="u", content="exact",
                                   embedding=vec(1.0, 0.0)))
            await other.add(Memory(id=new_id(), tenant="t", user_id=None, scope="shared",
                                   content="shared exact", embedding=vec(2.0, 0.0)))
        assert (await ranked())[:2] in (["exact", "shared exact"], ["shared exact", "exact"])
        assert len(await ranked()) == 4
        await store.update(near.with_changes(enabled=False))
        assert "near" not in await ranked()


def test_every_memory_column_bumps_a_generation(store: SqliteMemoryStore,
                                                tmp_path: Path) -> None:
    """Each column of ``memories`` is watched by a generation trigger (content columns by
    ``generation``, access statistics by ``accessed``): a column added later without its
    trigger would let reused rows go stale."""
    with sqlite3.connect(tmp_path / "m.db") as conn:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(memories)")} - {"rowid"}
        triggers = dict(conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall())

    def watched(name: str) -> set[str]:
        head = triggers[name].split("UPDATE OF", 1)[1].split(" ON memories", 1)[0]
        return {c.strip() for c in head.split(",")}

    content = watched("memories_generation_update")
    access = watched("memories_accessed_update")
    assert access == {"access_count", "last_access_at"}
    assert not content & access
    assert content | access == columns - {"rowid"}
