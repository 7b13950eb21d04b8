"""A title cut from the content is not indexed beside it (proxy/memory/titles.py:
indexed_text): learning stores a fact given without a title under the first words of its
content, and indexing those words twice would count them twice in BM25. A title of its
own is still indexed. Both backends, their upgrade of stores indexed under the older rule,
and the in-process recall index."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.migrations import MIGRATIONS
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.index import memory_terms
from proxy.memory.records import Memory, new_id
from proxy.memory.store import MemoryStore, SearchQuery
from proxy.memory.text import TERMS_VERSION, index_terms, query_terms
from proxy.memory.titles import indexed_text, short_title

T0 = datetime(2025, 1, 1, tzinfo=UTC)
CELLO = "Started learning the cello in March with a teacher from Porto"
FILLER = ("Lives in Lisbon with two cats", "Works as a nurse on night shifts",
          "Prefers tea to coffee in the morning", "Is allergic to hazelnuts")
# The migration that re-terms memories under the rule that leaves such titles out.
TITLE_RULE_MIGRATION = 19


def mem(content: str, *, user: str = "u1", title: str = "", minutes: int = 0) -> Memory:
    at = T0 + timedelta(minutes=minutes)
    return Memory(id=new_id(), tenant="t1", user_id=user, content=content, title=title,
                  scope="personal", created_at=at, updated_at=at, last_seen_at=at)


async def keyword_scores(store: MemoryStore, user: str, text: str) -> dict[str, float]:
    hits = await store.search(SearchQuery(tenant="t1", user=user,
                                          terms=tuple(query_terms(text)), limit=20))
    return {c.memory.content: c.keyword_score for c in hits
            if c.keyword_score is not None}


def test_the_rule_leaves_out_only_a_title_cut_from_the_content() -> None:
    assert short_title(CELLO) == "Started learning the cello in…"
    assert indexed_text(short_title(CELLO), CELLO, ["music"]) == f"\n{CELLO}\nmusic"
    short = "Plays the cello"
    assert indexed_text(short, short, []) == f"\n{short}\n"  # the whole text as its title
    assert indexed_text("Hobbies", CELLO, []) == f"Hobbies\n{CELLO}\n"
    assert indexed_text("Started learning", CELLO, []) == f"Started learning\n{CELLO}\n"
    assert indexed_text("", CELLO, []) == f"\n{CELLO}\n"


def test_the_recall_index_counts_a_learned_title_once() -> None:
    learned = mem(CELLO, title=short_title(CELLO))
    assert memory_terms(learned) == memory_terms(mem(CELLO))
    assert memory_terms(mem(CELLO, title="Music lessons")) == \
        ["music", "lesson", *memory_terms(mem(CELLO))]


async def test_a_learned_title_scores_as_no_title(store: MemoryStore) -> None:
    """The same fact for two users, once under learning's title and once without one:
    the same keyword score (the title's words counted twice scored the first higher)."""
    for i, text in enumerate(FILLER):
        await store.add(mem(text, minutes=i))
    await store.add(mem(CELLO, user="u1", title=short_title(CELLO), minutes=10))
    await store.add(mem(CELLO, user="u2", minutes=11))
    titled = await keyword_scores(store, "u1", "when did I start the cello")
    untitled = await keyword_scores(store, "u2", "when did I start the cello")
    assert CELLO in titled
    assert titled[CELLO] == pytest.approx(untitled[CELLO], rel=1e-9)


async def test_a_title_of_its_own_is_still_searched(store: MemoryStore) -> None:
    for i, text in enumerate(FILLER):
        await store.add(mem(text, minutes=i))
    await store.add(mem(CELLO, title="Music lessons", minutes=10))
    assert CELLO in await keyword_scores(store, "u1", "music")
    assert CELLO not in await keyword_scores(store, "u1", "painting")


def _old_terms(memory: Memory) -> str:
    """The terms of the rule before: the title always indexed beside the content."""
    return index_terms(f"{memory.title}\n{memory.content}\n{' '.join(memory.tags)}")


async def test_an_older_sqlite_index_is_retermed_at_open(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    learned, own = mem(CELLO, title=short_title(CELLO)), mem(FILLER[0], title="Home")
    async with SqliteDatabase(path) as db:
        store = SqliteMemoryStore(db)
        for memory in (learned, own):
            await store.add(memory)
    conn = sqlite3.connect(path)
    for memory in (learned, own):
        conn.execute("UPDATE memories_fts SET terms = ? WHERE rowid = (SELECT rowid FROM "
                     "memories WHERE id = ?)", (_old_terms(memory), memory.id))
    conn.execute(f"PRAGMA user_version = {TITLE_RULE_MIGRATION - 1}")
    conn.commit()
    before = conn.execute("SELECT f.terms FROM memories m JOIN memories_fts f ON f.rowid = "
                          "m.rowid WHERE m.id = ?", (learned.id,)).fetchone()[0]
    assert before.split().count("cello") == 2
    conn.close()

    async with SqliteDatabase(path) as db:
        terms = await db.read(lambda c: c.execute(
            "SELECT m.id, f.terms FROM memories m JOIN memories_fts f "
            "ON f.rowid = m.rowid").fetchall())
        version = await db.read(lambda c: c.execute("PRAGMA user_version").fetchone()[0])
    assert dict(terms) == {learned.id: index_terms(f"\n{CELLO}\n"),
                           own.id: index_terms(f"Home\n{FILLER[0]}\n")}
    assert version == len(MIGRATIONS) >= TITLE_RULE_MIGRATION


@pytest.mark.redis
async def test_an_older_redis_index_is_retermed_at_start(redis_url: str,
                                                         redis_prefix: str) -> None:
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.codec import terms_field
    from proxy.backends.redis.keys import KeyLayout, namespace_token
    from proxy.backends.redis.memories import terms_version_key
    from proxy.backends.redis.store import RedisMemoryStore
    from proxy.memory.text import stemmed_terms

    learned, own = mem(CELLO, title=short_title(CELLO)), mem(FILLER[0], title="Home")
    layout = KeyLayout(redis_prefix)
    keys = {m.id: layout.memory(namespace_token("t1", "u1"), m.id) for m in (learned, own)}
    async with connect(redis_url) as client:
        old = RedisMemoryStore(client, key_prefix=redis_prefix)
        await old.prepare()
        for memory in (learned, own):
            await old.add(memory)
            await client.hset(keys[memory.id], "ix_terms", stemmed_terms(_old_terms(memory)))
        await client.set(terms_version_key(layout), str(TERMS_VERSION - 1))

        restarted = RedisMemoryStore(client, key_prefix=redis_prefix)
        await restarted.prepare()
        stored = {i: (await client.hget(key, "ix_terms")).decode() for i, key in keys.items()}
        assert stored == {learned.id: terms_field("", CELLO, []),
                          own.id: terms_field("Home", FILLER[0], [])}
        assert await client.get(terms_version_key(layout)) == str(TERMS_VERSION).encode()
