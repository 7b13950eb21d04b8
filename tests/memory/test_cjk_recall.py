"""Chinese, Japanese and Korean keyword recall on both backends: character bigrams and
characters beside jieba's words (proxy/memory/text.py), and the upgrade of stores whose
index holds the terms of the older, words-only rule.

Each row of :data:`CASES` stores the same small corpus in a fresh store, asks the store's
keyword recall (:meth:`MemoryStore.search` with the terms chat recall builds) and checks
whether the named memory is among the candidates.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.backends.sqlite.codec import COLUMNS, ns_token, row_values
from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.migrations import MIGRATIONS
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.recall import RankWeights
from proxy.memory.records import Memory, new_id
from proxy.memory.retrieve import Retriever, plan_queries
from proxy.memory.store import ListQuery, MemoryStore, SearchQuery
from proxy.memory.text import (
    STOPWORDS,
    TERMS_VERSION,
    cjk_subwords,
    index_terms,
    query_terms,
    tokens,
)
from proxy.memory.titles import short_title

T0 = datetime(2025, 1, 1, tzinfo=UTC)
# The first migration after the words-only terms rule: re-terms every memory whose
# stored terms differ from the current rule.
RETERM_MIGRATION = 12

TEA = "喜欢喝乌龙茶，不喜欢咖啡"
CORPUS = (
    TEA,
    "住在上海浦东新区",
    "对花生过敏",
    "养了一只叫小白的猫",
    "每天早上跑步五公里",
    "在一家银行做软件工程师",
    "周末常去爬山",
    "最喜欢的水果是芒果",
    "儿子今年上小学三年级",
    "下个月要去日本旅行",
    "毎朝コーヒーを飲みます",
    "김치찌개를 좋아해요",
)

# (query, memory, found?): hits through a one-character word (茶, 猫), a word inside a
# longer one (咖啡 in 不喜欢咖啡), jieba words, and kana / Hangul bigrams; non-hits where
# query and memory share no word, no bigram, and the query has no one-character word the
# memory holds (红茶 does not match on 茶 alone: a longer query word needs a shared bigram).
CASES: tuple[tuple[str, str, bool], ...] = (
    ("推荐一款茶吧", TEA, True),
    ("茶", TEA, True),
    ("咖啡", TEA, True),
    ("我想喝点咖啡", TEA, True),
    ("乌龙", TEA, True),
    ("喜欢什么", TEA, True),
    ("上海", "住在上海浦东新区", True),
    ("浦东", "住在上海浦东新区", True),
    ("我对什么过敏", "对花生过敏", True),
    ("花生酱能吃吗", "对花生过敏", True),
    ("猫的名字", "养了一只叫小白的猫", True),
    ("小白", "养了一只叫小白的猫", True),
    ("跑步", "每天早上跑步五公里", True),
    ("工程师", "在一家银行做软件工程师", True),
    ("爬山", "周末常去爬山", True),
    ("芒果", "最喜欢的水果是芒果", True),
    ("小学", "儿子今年上小学三年级", True),
    ("日本", "下个月要去日本旅行", True),
    ("コーヒー", "毎朝コーヒーを飲みます", True),
    ("김치", "김치찌개를 좋아해요", True),
    ("推荐一款酒吧", TEA, False),
    ("红茶", TEA, False),
    ("北京", "住在上海浦东新区", False),
    ("游泳", "每天早上跑步五公里", False),
    ("狗", "养了一只叫小白的猫", False),
    ("香蕉", "最喜欢的水果是芒果", False),
    ("大学", "儿子今年上小学三年级", False),
    ("中国", "下个月要去日本旅行", False),
    ("紅茶", "毎朝コーヒーを飲みます", False),
    ("된장", "김치찌개를 좋아해요", False),
)




def mem(content: str, *, minutes: int = 0, **fields: Any) -> Memory:
    at = T0 + timedelta(minutes=minutes)
    return Memory(id=new_id(), tenant="t1", user_id="u1", content=content,
                  title=fields.pop("title", short_title(content)), scope="personal",
                  created_at=at, updated_at=at, last_seen_at=at, **fields)


async def recalled(store: MemoryStore, text: str) -> list[str]:
    """Contents of the keyword candidates for ``text``, best first."""
    hits = await store.search(SearchQuery(tenant="t1", user="u1",
                                          terms=tuple(query_terms(text)), limit=50))
    keyword = [c for c in hits if c.keyword_rank is not None]
    return [c.memory.content for c in sorted(keyword, key=lambda c: c.keyword_rank or 0)]


def test_the_table_has_hits_and_non_hits() -> None:
    assert len(CASES) >= 20
    assert {found for *_, found in CASES} == {True, False}
    assert all(memory in CORPUS for _, memory, _ in CASES)


@pytest.mark.parametrize(("query", "memory", "hit"), CASES)
async def test_cjk_keyword_recall(store: MemoryStore, query: str, memory: str,
                                  hit: bool) -> None:
    for i, content in enumerate(CORPUS):
        await store.add(mem(content, minutes=i))
    assert (memory in await recalled(store, query)) is hit


async def test_the_best_match_comes_first(store: MemoryStore) -> None:
    for i, content in enumerate(CORPUS):
        await store.add(mem(content, minutes=i))
    await store.add(mem("喜欢喝茶", minutes=20))
    found = await recalled(store, "喜欢喝什么茶")
    assert found[0] == "喜欢喝茶"
    assert TEA in found


async def test_chat_recall_brings_the_tea_memory(store: MemoryStore) -> None:
    """The whole recall path (query plan, keyword search, ranking) as chat runs it."""
    for i, content in enumerate(CORPUS):
        await store.add(mem(content, minutes=i))
    retriever = Retriever(store=store, embedder=None, weights=RankWeights(),
                          candidate_pool=30)
    queries = plan_queries([{"role": "user", "content": "推荐一款茶吧"}], context_turns=2,
                           max_subqueries=3, subquery_weight=0.8)
    found = await retriever.recall(tenant="t1", user="u1", queries=queries, limit=5,
                                   now=T0 + timedelta(days=1))
    assert [r.memory.content for r in found.ranked][:1] == [TEA]


async def test_search_finds_a_word_inside_a_longer_one(store: MemoryStore) -> None:
    """The list route's text filter (every query word a substring of the memory) keeps its
    words-only terms: a bigram spanning two query words would narrow it."""
    for i, content in enumerate(CORPUS):
        await store.add(mem(content, minutes=i))

    async def listed(text: str) -> list[str]:
        found = await store.list_memories(ListQuery(tenant="t1", user="u1", text=text))
        return [m.content for m in found]

    assert await listed("茶") == [TEA]
    assert await listed("咖啡") == [TEA]
    assert await listed("红茶") == []


async def test_english_memories_are_untouched_by_cjk_terms(store: MemoryStore) -> None:
    await store.add(mem("Drinks oolong tea every morning", title="Tea"))
    await store.add(mem(TEA, minutes=1))
    assert await recalled(store, "what tea do I drink") == ["Drinks oolong tea every morning"]
    assert await recalled(store, "茶") == [TEA]


def _old_terms(memory: Memory) -> str:
    """The index terms of the words-only rule: jieba's words, no sub-words."""
    return " ".join(tokens(f"{memory.title}\n{memory.content}\n{' '.join(memory.tags)}"))


def _old_sqlite_store(path: Path, memories: list[Memory]) -> None:
    """A database as the release before sub-words left it: the migrations up to the one
    before :data:`RETERM_MIGRATION`, memories indexed with words-only terms."""
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:RETERM_MIGRATION - 1]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {RETERM_MIGRATION - 1}")
    # Only the columns that schema had: later migrations add columns to memories.
    had = {row[1] for row in conn.execute("PRAGMA table_info(memories)")}
    names = [c.strip() for c in COLUMNS.split(",")] + ["norm"]
    keep = [i for i, name in enumerate(names) if name in had]
    insert = (f"INSERT INTO memories ({', '.join(names[i] for i in keep)}) "  # noqa: S608
              f"VALUES ({', '.join('?' * len(keep))})")
    for memory in memories:
        values = row_values(memory)
        conn.execute(insert, [values[i] for i in keep])
        rowid = conn.execute("SELECT rowid FROM memories WHERE id = ?",
                             (memory.id,)).fetchone()[0]
        conn.execute("INSERT INTO memories_fts (rowid, ns, terms) VALUES (?, ?, ?)",
                     (rowid, ns_token(memory), _old_terms(memory)))
    conn.commit()
    assert conn.execute("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH "
                        "'terms:\"茶\"'").fetchone()[0] == 0
    conn.close()


async def test_an_old_sqlite_store_finds_tea_after_the_migration(tmp_path: Path) -> None:
    tea, english = mem(TEA), mem("Drinks oolong tea", title="Tea", minutes=1)
    _old_sqlite_store(tmp_path / "memory.db", [tea, english])
    async with SqliteDatabase(tmp_path / "memory.db") as db:
        store = SqliteMemoryStore(db)
        assert await recalled(store, "推荐一款茶吧") == [TEA]
        assert await recalled(store, "oolong tea") == ["Drinks oolong tea"]
        version = await db.read(lambda c: c.execute("PRAGMA user_version").fetchone()[0])
        assert version == len(MIGRATIONS) >= RETERM_MIGRATION


@pytest.mark.redis
async def test_an_old_redis_store_finds_tea_after_a_restart(redis_url: str,
                                                           redis_prefix: str) -> None:
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.keys import KeyLayout, namespace_token
    from proxy.backends.redis.memories import terms_version_key
    from proxy.backends.redis.store import RedisMemoryStore
    from proxy.memory.text import stemmed_terms

    tea, english = mem(TEA), mem("Drinks oolong tea", title="Tea", minutes=1)
    layout = KeyLayout(redis_prefix)
    async with connect(redis_url) as client:
        old = RedisMemoryStore(client, key_prefix=redis_prefix)
        await old.prepare()
        for memory in (tea, english):
            await old.add(memory)
            key = layout.memory(namespace_token("t1", "u1"), memory.id)
            await client.hset(key, "ix_terms", stemmed_terms(_old_terms(memory)))
        await client.delete(terms_version_key(layout))
        assert await recalled(old, "推荐一款茶吧") == []

        restarted = RedisMemoryStore(client, key_prefix=redis_prefix)
        await restarted.prepare()
        assert await recalled(restarted, "推荐一款茶吧") == [TEA]
        assert await recalled(restarted, "oolong tea") == ["Drinks oolong tea"]
        assert await client.get(terms_version_key(layout)) == str(TERMS_VERSION).encode()


@pytest.mark.parametrize("text", [
    "What does the user usually drink in the morning before work?",
    "Is allergic to hazelnuts; café au lait, naïve Ünïcödé",
    "Ігнор Cyrillic and Ελληνικά words, digits 42 and under_scores",
    "",
])
def test_text_without_cjk_keeps_exactly_its_words(text: str) -> None:
    words = list(dict.fromkeys(
        t for t in tokens(text) if t not in STOPWORDS and not (len(t) == 1 and t.isascii())))
    assert index_terms(text) == " ".join(tokens(text))
    assert query_terms(text) == words == query_terms(text, subwords=False)


def test_cjk_sub_words() -> None:
    assert cjk_subwords("乌龙茶") == ["乌龙", "龙茶", "乌", "龙", "茶"]
    assert cjk_subwords("茶") == ["茶"]
    assert index_terms("乌龙茶 tea").split() == [
        "乌龙", "乌龙茶", "tea", "龙茶", "乌", "龙", "茶"]
    # Words first, then bigrams not made of stopwords alone; a substring filter gets words.
    assert query_terms("推荐一款茶吧") == ["推荐", "一款", "茶", "荐一", "款茶", "茶吧"]
    assert query_terms("推荐一款茶吧", subwords=False) == ["推荐", "一款", "茶"]
    assert query_terms("我的") == []
    assert query_terms("推荐一款茶吧", limit=4) == ["推荐", "一款", "茶", "荐一"]
