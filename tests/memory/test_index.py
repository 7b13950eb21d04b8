"""The in-process recall index against the stores' own searches, its freshness across
store instances (a second process simulated by a second store object on the same file or
Redis prefix), and its byte bound."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.index import RecallIndexes, UserIndex
from proxy.memory.recall import RankWeights
from proxy.memory.records import Memory, new_id
from proxy.memory.retrieve import Retriever, SubQuery
from proxy.memory.store import (
    AuditEvent,
    Bm25,
    Candidate,
    ChangeSet,
    MemoryStore,
    RecallCorpus,
    SearchQuery,
    StoreUnavailableError,
    VectorUpdate,
)
from proxy.memory.text import load_segmenter_for, query_terms
from proxy.settings import GLOBAL_NAMESPACE
from tests.memory.conftest import DIM

T0 = datetime(2025, 1, 1, tzinfo=UTC)
NOW = datetime(2025, 6, 1, tzinfo=UTC)

PHRASES = [
    "Is allergic to hazelnuts and peanuts",
    "Drinks green tea every morning before work",
    "Runs five kilometres on Sunday mornings, running is a habit",
    "Has a dog called Biscuit who loves the park",
    "Works as a nurse at the city hospital on night shifts",
    "Prefers short answers without emoji",
    "Is learning Japanese for a trip to Kyoto in spring",
    "Lives in Lyon with a partner and two cats",
    "喜欢喝乌龙茶，不喜欢咖啡",
    "周末常去公园跑步",
    "Plays the cello in an amateur orchestra on Thursday evenings",
    "Dislikes coffee but drinks tea tea tea all day",
    "Birthday is on the third of June",
    "Is vegetarian and cooks lentil curry often",
    "Reads science fiction novels, mostly Le Guin and Banks",
    "Café owner's favourite pastry is the croissant",
    "Has a sister in Toronto who is a teacher",
    "Saving money for a new bicycle for commuting to work",
    "Morning routine: coffee, news, then a walk with the dog",
    "Speaks French and some German, learning Japanese slowly",
]
QUERIES = [
    "What does the user drink in the morning?",
    "hazelnuts allergy",
    "推荐一款茶吧",
    "Tell me about the dog and the park",
    "running on sunday",
    "What does the user learn? Japanese trip",
    "tea coffee",
    "work commute bicycle money",
    "nothing matches zzzqqq",
]


def mem(content: str, *, user: str | None = "u1", tenant: str = "t1", minutes: int = 0,
        **fields: Any) -> Memory:
    at = T0 + timedelta(minutes=minutes)
    return Memory(id=fields.pop("id", new_id()), tenant=tenant, user_id=user,
                  content=content, title=fields.pop("title", content[:30]),
                  scope=fields.pop("scope", "personal" if user else "shared"),
                  created_at=at, updated_at=at,
                  last_seen_at=fields.pop("last_seen_at", at), **fields)


def vector(rng: random.Random) -> tuple[float, ...]:
    return tuple(rng.uniform(-1, 1) for _ in range(DIM))


def varied_memories() -> list[Memory]:
    """Personal (some learned in a group, some with vectors of two models or none),
    shared and system memories, varied lengths, CJK and repeated terms."""
    rng = random.Random(7)
    out: list[Memory] = []
    for i, text in enumerate(PHRASES):
        extra: dict[str, Any] = {"hits": 1 + i % 4, "score": (i % 5) / 5,
                                 "source_conversation_id": f"c{i % 3}"}
        if i % 3 != 2:
            extra["embedding"] = vector(rng)
            extra["embedding_model"] = "m" if i % 4 else None
        if i % 5 == 4:
            extra["source_channel"] = "group:g1"
        out.append(mem(text, minutes=i, **extra))
    out.append(mem("The office wifi password rotates every month", user=None, minutes=30,
                   embedding=vector(rng), embedding_model="m"))
    out.append(mem("Tea and coffee are free in the staff kitchen", user=None, minutes=31))
    out.append(mem("Always answer politely, in the user's language", user=None,
                   tenant=GLOBAL_NAMESPACE, scope="system", minutes=32,
                   embedding=vector(rng), embedding_model="other"))
    return out


def comparable(found: Sequence[Candidate]) -> dict[str, tuple[Any, ...]]:
    """id → (keyword rank, keyword score, vector rank, vector score), scores rounded."""
    return {c.memory.id: (c.keyword_rank, None if c.keyword_score is None else
                          round(c.keyword_score, 4), c.vector_rank,
                          None if c.vector_score is None else round(c.vector_score, 4))
            for c in found}


def ordered(found: Sequence[Candidate], rank: str, score: str) -> list[set[str]]:
    """Ids in rank order, those of one score (to 6 digits) grouped: stores may order ties
    either way."""
    hits = sorted((c for c in found if getattr(c, rank) is not None),
                  key=lambda c: getattr(c, rank))
    groups: list[tuple[float, set[str]]] = []
    for c in hits:
        value = round(getattr(c, score), 6)
        if groups and groups[-1][0] == value:
            groups[-1][1].add(c.memory.id)
        else:
            groups.append((value, {c.memory.id}))
    return [ids for _, ids in groups]


async def fill(store: MemoryStore, memories: Sequence[Memory]) -> None:
    await load_segmenter_for(*(m.content for m in memories))
    for memory in memories:
        await store.add(memory)


async def test_index_finds_what_the_store_search_finds(store: MemoryStore) -> None:
    """Keyword and vector candidates — ranks, BM25 and cosine scores, channel and model
    filters — equal the store's own search over the same corpus (both backends)."""
    memories = varied_memories()
    await fill(store, memories)
    index = UserIndex(await store.recall_corpus("t1", "u1"))
    assert {m.id for m in index.memories} == {m.id for m in memories}
    rng = random.Random(11)
    await load_segmenter_for(*QUERIES)
    compared = 0
    for text in QUERIES:
        for channels in (None, ("group:g1",), ()):
            for embedding, model in ((None, None), (vector(rng), "m"), (vector(rng), None)):
                query = SearchQuery(tenant="t1", user="u1", terms=tuple(query_terms(text)),
                                    embedding=embedding, embedding_model=model,
                                    channels=channels)
                expected, got = await store.search(query), index.search(query)
                assert comparable(got).keys() == comparable(expected).keys(), (text, channels)
                for key, value in comparable(expected).items():
                    assert comparable(got)[key][1::2] == pytest.approx(value[1::2], abs=2e-4)
                for rank, score in (("keyword_rank", "keyword_score"),
                                    ("vector_rank", "vector_score")):
                    assert ordered(got, rank, score) == ordered(expected, rank, score)
                compared += len(expected)
    assert compared > 200  # the comparison saw many candidates, not empty lists
    for channels in (None, ("group:g1",), ()):
        for limit in (0, 3, 50):
            expected_ids = [m.id for m in await store.resident("t1", "u1", limit=limit,
                                                                channels=channels)]
            got_ids = [m.id for m in index.resident(limit=limit, channels=channels)]
            assert got_ids == expected_ids, (channels, limit)
    assert len(index.resident(limit=50, channels=None)) == len(PHRASES)  # personal only


async def test_recall_through_the_index_ranks_as_through_the_store(
        store: MemoryStore) -> None:
    """The whole recall (several queries, vectors, ranking) returns the same memories in
    the same order with and without the index; nothing else is returned."""
    await fill(store, varied_memories())
    plain = Retriever(store=store, embedder=None, weights=RankWeights(), candidate_pool=30)
    indexed = Retriever(store=store, embedder=None, weights=RankWeights(), candidate_pool=30,
                        indexes=RecallIndexes())
    built = await indexed.index("t1", "u1")
    await load_segmenter_for(*QUERIES)
    for text in QUERIES:
        for channels in (None, ("group:g1",)):
            queries = [SubQuery(text), SubQuery(text.split("?")[0] + " tea", 0.8)]
            args = {"tenant": "t1", "user": "u1", "queries": queries, "limit": 8,
                    "now": NOW, "channels": channels}
            expected = [r.memory.id for r in (await plain.recall(**args)).ranked]
            got = [r.memory.id for r in (await indexed.recall(**args)).ranked]
            assert got == expected, text
    assert await indexed.index("t1", "u1") is built  # every recall above used it


async def test_index_holds_no_other_user_and_no_inactive_memory(store: MemoryStore) -> None:
    """Another user's memories, disabled and retired ones never enter u1's index; the
    user's own active ones do."""
    mine = mem("Drinks green tea every morning")
    await fill(store, [
        mine, mem("Drinks green tea too", user="u2"),
        mem("Drinks tea at the other tenant", tenant="t2"),
        mem("Disabled tea memory", enabled=False),
        mem("Retired tea memory", superseded_at=T0, superseded_by=mine.id),
    ])
    index = UserIndex(await store.recall_corpus("t1", "u1"))
    assert [m.content for m in index.memories] == [mine.content]
    found = index.search(SearchQuery(tenant="t1", user="u1", terms=("tea",)))
    assert [c.memory.id for c in found] == [mine.id]


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def two_stores(request: pytest.FixtureRequest, tmp_path: Path
                     ) -> AsyncIterator[tuple[MemoryStore, MemoryStore]]:
    """Two store objects on one SQLite file, or one Redis key prefix (two processes)."""
    if request.param == "sqlite":
        async with SqliteDatabase(tmp_path / "m.db") as a, \
                SqliteDatabase(tmp_path / "m.db") as b:
            yield SqliteMemoryStore(a), SqliteMemoryStore(b)
        return
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.store import RedisMemoryStore

    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    async with connect(url) as one, connect(url) as two:
        first = RedisMemoryStore(one, key_prefix=prefix, vector_dim=DIM)
        second = RedisMemoryStore(two, key_prefix=prefix, vector_dim=DIM)
        await first.prepare()
        await second.prepare()
        yield first, second


async def recalled(retriever: Retriever, text: str) -> list[str]:
    """The next recall's memories — through the index brought up to the store's
    generations — checked against a second recall through the same index."""
    async def once() -> list[str]:
        result = await retriever.recall(tenant="t1", user="u1", queries=[SubQuery(text)],
                                        limit=10, now=NOW)
        return [r.memory.content for r in result.ranked]

    first = await once()
    index = await retriever.index("t1", "u1")
    assert await retriever.index("t1", "u1") is index
    assert await once() == first
    return first


def erased() -> AuditEvent:
    return AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user", at=NOW)


async def test_a_write_by_another_store_is_seen_by_the_next_recall(
        two_stores: tuple[MemoryStore, MemoryStore]) -> None:
    """Every kind of write through the second store (add, update, learning apply, vector,
    delete, shared delete, clear, erasure) moves a generation, so the first store's next
    recall rebuilds; without a write the same index is reused."""
    reader, writer = two_stores
    retriever = Retriever(store=reader, embedder=None, weights=RankWeights(),
                          candidate_pool=30, indexes=RecallIndexes())
    tea = mem("Drinks green tea every morning")
    await reader.add(tea)
    assert await recalled(retriever, "tea") == [tea.content]
    first = await retriever.index("t1", "u1")
    assert await retriever.index("t1", "u1") is first  # no write: reused

    seen = [await reader.recall_generations("t1", "u1")]

    async def moved() -> None:
        now = await reader.recall_generations("t1", "u1")
        assert now != seen[-1]
        assert now not in seen
        seen.append(now)

    oolong = mem("Drinks oolong tea after lunch")
    await writer.add(oolong)
    await moved()
    assert set(await recalled(retriever, "tea")) == {tea.content, oolong.content}
    await writer.update(oolong.with_changes(enabled=False))
    await moved()
    assert await recalled(retriever, "tea") == [tea.content]
    learned = mem("Brews tea in a clay pot")
    await writer.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b1",
                                 upserts=(learned,)))
    await moved()
    assert learned.content in await recalled(retriever, "tea")
    assert await writer.set_vectors([VectorUpdate("t1", "u1", tea.id, tea.content,
                                                  (1.0, 0.0, 0.0, 0.0), "m")]) == 1
    await moved()
    assert (await retriever.index("t1", "u1")).vectors  # the new vector is in the index
    await writer.delete("t1", "u1", learned.id)
    await moved()
    assert learned.content not in await recalled(retriever, "tea")
    shared = mem("Tea is free in the kitchen", user=None)
    await writer.add(shared)
    await moved()
    assert shared.content in await recalled(retriever, "tea")
    assert await writer.delete_shared("t1", shared.id)
    await moved()
    assert shared.content not in await recalled(retriever, "tea")
    await writer.clear("t1", "u1")
    await moved()
    assert await recalled(retriever, "tea") == []
    await writer.add(mem("Drinks tea again"))
    await moved()
    assert await recalled(retriever, "tea") == ["Drinks tea again"]
    await writer.erase_user("t1", "u1", audit=erased())
    await moved()
    assert await recalled(retriever, "tea") == []


def corpus(*contents: str, generation: int = 1) -> RecallCorpus:
    return RecallCorpus((generation, 0, 0), tuple(mem(c) for c in contents), Bm25())


def test_indexes_evict_least_recently_used_beyond_the_byte_bound() -> None:
    """Past the byte bound the least recently used user goes; an index larger than the
    bound is not kept; a changed generation is a miss."""
    one = UserIndex(corpus(*(f"fact number {i} about tea" for i in range(50))))
    indexes = RecallIndexes(int(one.nbytes * 2.5))
    for user in ("a", "b"):
        indexes.put(("t", user), UserIndex(corpus(*(f"fact number {i} about tea"
                                                    for i in range(50)))))
    assert indexes.get(("t", "a"), (1, 0, 0)) is not None  # a is now the most recent
    indexes.put(("t", "c"), one)
    assert indexes.get(("t", "b"), (1, 0, 0)) is None  # evicted
    assert indexes.get(("t", "a"), (1, 0, 0)) is not None
    assert indexes.get(("t", "c"), (1, 0, 0)) is one
    assert indexes.nbytes <= indexes.capacity
    assert len(indexes) == 2
    assert indexes.get(("t", "a"), (2, 0, 0)) is None  # written since: not served
    huge = UserIndex(corpus(*(f"fact {i} " + "word " * 200 for i in range(100))))
    assert huge.nbytes > indexes.capacity
    indexes.put(("t", "d"), huge)
    assert indexes.get(("t", "d"), (1, 0, 0)) is None
    assert len(indexes) == 2


def test_index_bytes_grow_with_the_corpus() -> None:
    """The estimate the bound uses counts terms and vectors."""
    small = UserIndex(corpus("tea"))
    large = UserIndex(corpus(*(f"fact {i} about tea and coffee" for i in range(100))))
    with_vectors = UserIndex(RecallCorpus((1, 0, 0), tuple(
        mem(f"fact {i}", embedding=(0.1,) * 256) for i in range(100)), Bm25()))
    assert small.nbytes < large.nbytes
    assert with_vectors.nbytes > 100 * 256 * 4


class CorpusDown:
    """A store whose corpus read fails (everything else is the real store's)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.corpus_reads = 0

    async def recall_corpus(self, tenant: str, user: str, *,
                            since: RecallCorpus | None = None) -> RecallCorpus:
        self.corpus_reads += 1
        raise StoreUnavailableError("corpus read failed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_cold_user_is_recalled_through_the_store_while_the_index_builds(
        store: MemoryStore) -> None:
    """The first recall of a user answers from the store's search and starts one
    background build; a build that fails leaves recall working through the store."""
    tea = mem("Drinks green tea every morning")
    await store.add(tea)
    indexes = RecallIndexes()
    retriever = Retriever(store=store, embedder=None, weights=RankWeights(),
                          candidate_pool=30, indexes=indexes)
    assert await recalled_once(retriever) == [tea.content]
    for _ in range(20):  # the background build finishes on its own
        if len(indexes):
            break
        await asyncio.sleep(0.05)
    assert len(indexes) == 1

    failing = CorpusDown(store)
    broken = Retriever(store=failing, embedder=None,  # type: ignore[arg-type]
                       weights=RankWeights(), candidate_pool=30, indexes=RecallIndexes())
    for _ in range(3):
        assert await recalled_once(broken) == [tea.content]
        await asyncio.sleep(0.01)
    assert failing.corpus_reads >= 1
    with pytest.raises(StoreUnavailableError):
        await broken.index("t1", "u1")


async def recalled_once(retriever: Retriever) -> list[str]:
    result = await retriever.recall(tenant="t1", user="u1", queries=[SubQuery("tea")],
                                    limit=10, now=NOW)
    return [r.memory.content for r in result.ranked]


async def test_sqlite_index_scores_with_the_whole_store_statistics(tmp_path: Path) -> None:
    """On SQLite, whose BM25 reads the statistics of the whole keyword index, the index
    ranks as the store's search also when other users' memories change those statistics
    (their memories move the IDF; none of them is returned)."""
    async with SqliteDatabase(tmp_path / "m.db") as db:
        store = SqliteMemoryStore(db)
        mine = varied_memories()
        others = [mem(f"{text} and tea", user=f"o{i % 4}", minutes=40 + i)
                  for i, text in enumerate(PHRASES * 3)]
        await fill(store, mine + others)
        index = UserIndex(await store.recall_corpus("t1", "u1"))
        assert index.memories
        assert all(m.user_id in ("u1", None) for m in index.memories)
        await load_segmenter_for(*QUERIES)
        for text in QUERIES:
            query = SearchQuery(tenant="t1", user="u1", terms=tuple(query_terms(text)))
            expected, got = await store.search(query), index.search(query)
            assert comparable(got) == comparable(expected), text
        own = UserIndex(RecallCorpus(index.generations, tuple(index.memories), index.bm25))
        tea = SearchQuery(tenant="t1", user="u1", terms=("tea",))
        assert comparable(own.search(tea)) != comparable(index.search(tea))  # stats matter
