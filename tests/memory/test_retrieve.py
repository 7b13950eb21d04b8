"""Hybrid recall through the SQLite store: query planning, sub-queries, degradation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.embed import CachedEmbedder, RawEmbeddings
from proxy.memory.index import RecallIndexes
from proxy.memory.recall import RankWeights
from proxy.memory.records import Memory
from proxy.memory.retrieve import Retriever, SubQuery, plan_queries, sentences
from proxy.memory.store import Candidate, SearchQuery
from tests.fakes import ConceptBackend, concept_embedder

NOW = datetime(2024, 6, 30, tzinfo=UTC)
CONCEPTS = [["dog", "puppy", "hound"], ["spouse", "wife", "husband"],
            ["allergic", "allergy", "intolerant"]]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize(("turns", "expected"), [
    (["What is my dog called?"], [("What is my dog called?", 1.0)]),
    (["I'm planning the Kyoto trip.", "What is my dog called?"],
     [("I'm planning the Kyoto trip.\nWhat is my dog called?", 1.0),
      ("What is my dog called?", 0.8)]),
    (["Book the usual table for Friday. Also, what is my wife allergic to?"],
     [("Book the usual table for Friday. Also, what is my wife allergic to?", 1.0),
      ("Book the usual table for Friday.", 0.8), ("Also, what is my wife allergic to?", 0.8)]),
    (["Hi. What is my dog called?"],  # "Hi." names nothing: no sub-query of its own
     [("Hi. What is my dog called?", 1.0), ("What is my dog called?", 0.8)]),
    ([""], []),
    ([], []),
])
def test_plan_queries(turns: list[str], expected: list[tuple[str, float]]) -> None:
    """Main query = latest turn + one earlier turn; sub-queries = the latest turn alone and
    its sentences with at least two content terms, without duplicates."""
    plan = plan_queries([user(t) for t in turns], context_turns=1, max_subqueries=3,
                        subquery_weight=0.8)
    assert [(q.text, q.weight) for q in plan] == expected


def test_plan_queries_caps_and_disables_sub_queries() -> None:
    """``max_subqueries`` bounds the sub-queries; 0 leaves only the main query."""
    text = "Where do I live? What car do I drive? Which team do I support? What is my job?"
    assert len(plan_queries([user(text)], context_turns=0, max_subqueries=2,
                            subquery_weight=1.0)) == 3
    assert len(plan_queries([user(text)], context_turns=0, max_subqueries=0,
                            subquery_weight=1.0)) == 1


def test_sentences_split_latin_and_cjk() -> None:
    """Sentence ends are . ! ? ; and their CJK forms, and line breaks."""
    assert sentences("One. Two!\nThree 我去了北京。你呢？") == [
        "One.", "Two!", "Three 我去了北京。", "你呢？"]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMemoryStore]:
    async with SqliteDatabase(tmp_path / "m.db") as db:
        yield SqliteMemoryStore(db)


async def add(store: SqliteMemoryStore, embedder: CachedEmbedder | None,
              *texts: str) -> None:
    for i, text in enumerate(texts):
        vector = await embedder.embed_query(text) if embedder is not None else None
        await store.add(Memory(id=f"m{i:02d}", tenant="t", user_id="u", content=text,
                               embedding=vector, created_at=NOW, last_seen_at=NOW,
                               updated_at=NOW))


def retriever(store: SqliteMemoryStore, embedder: CachedEmbedder | None) -> Retriever:
    return Retriever(store=store, embedder=embedder, weights=RankWeights(), candidate_pool=30)


async def contents(store: SqliteMemoryStore, embedder: CachedEmbedder | None,
                   queries: list[SubQuery], limit: int = 3,
                   budget: float | None = None) -> tuple[list[str], str | None]:
    found = await retriever(store, embedder).recall(
        tenant="t", user="u", queries=queries, limit=limit, now=NOW, embed_budget=budget)
    return [r.memory.content for r in found.ranked], found.degraded


JAPAN = [
    "Booked hotels in Kyoto and Osaka for the Japan trip",
    "The Japan trip starts in Tokyo, then Kyoto and Osaka by train",
    "Wants to see temples in Kyoto during the Japan trip",
    "Bought a rail pass for the Japan trip to Osaka",
]


async def test_a_sub_query_keeps_the_latest_question_from_being_drowned(
    store: SqliteMemoryStore,
) -> None:
    """After a long turn about Japan, "what is my dog called" still recalls the dog: the
    joined query's vector is mostly about Japan, so the latest turn also runs alone."""
    embedder = concept_embedder([["japan", "kyoto", "osaka", "tokyo", "trip", "hotels",
                                  "train", "temples"], *CONCEPTS])
    await add(store, embedder, *JAPAN, "The dog is called Rex")
    messages = [user("Tell me about the Japan trip, hotels in Kyoto and Osaka, the train"),
                user("What is my dog called?")]
    single = plan_queries(messages, context_turns=1, max_subqueries=0, subquery_weight=1.0)
    multi = plan_queries(messages, context_turns=1, max_subqueries=3, subquery_weight=1.0)
    assert "The dog is called Rex" not in (await contents(store, embedder, single))[0]
    assert (await contents(store, embedder, multi))[0][0] == "The dog is called Rex"


async def test_vectors_recall_a_paraphrase(store: SqliteMemoryStore) -> None:
    """With an embedder, "my hound" finds "the puppy" although no keyword is shared; with
    keyword recall alone it does not."""
    embedder = concept_embedder(CONCEPTS)
    await add(store, embedder, "Owns a puppy called Rex", "Enjoys chess on Sundays",
              "Drives a blue car")
    query = [SubQuery("What's the name of my hound?")]
    found, degraded = await contents(store, embedder, query, limit=1)
    assert (found, degraded) == (["Owns a puppy called Rex"], None)
    assert (await contents(store, None, query, limit=1))[0] != ["Owns a puppy called Rex"]


async def test_a_failing_embedder_degrades_to_keyword_recall(store: SqliteMemoryStore) -> None:
    """An embedder error costs only the vector half: keyword hits still come back, and
    the result says ``embedder_unavailable``."""
    await add(store, None, "Allergic to peanuts", "Drives a blue car")
    broken = CachedEmbedder(ConceptBackend(CONCEPTS, fail=ConnectionError("refused")))
    found, degraded = await contents(store, broken, [SubQuery("Am I allergic to peanuts?")])
    assert found == ["Allergic to peanuts"]
    assert degraded == "embedder_unavailable"


async def test_a_slow_embedder_is_abandoned_at_its_budget(store: SqliteMemoryStore) -> None:
    """An embedder slower than ``embed_budget`` is not waited for: keyword recall answers
    in time and the result says ``embedder_timeout``."""
    await add(store, None, "Allergic to peanuts", "Drives a blue car")
    slow = CachedEmbedder(ConceptBackend(CONCEPTS, delay=5.0))
    loop_started = datetime.now(UTC)
    found, degraded = await contents(store, slow, [SubQuery("Am I allergic to peanuts?")],
                                     budget=0.05)
    assert (datetime.now(UTC) - loop_started).total_seconds() < 1.0
    assert (found, degraded) == (["Allergic to peanuts"], "embedder_timeout")


async def test_vectors_of_another_dimension_are_skipped(store: SqliteMemoryStore) -> None:
    """After a model change, stored vectors of the old length are ignored by vector search
    (no error), and those memories stay reachable by keyword."""
    await store.add(Memory(id="old", tenant="t", user_id="u", content="Allergic to peanuts",
                           embedding=(1.0, 0.0, 0.0)))
    await store.add(Memory(id="new", tenant="t", user_id="u", content="Drives a blue car",
                           embedding=(0.0, 1.0, 0.0, 0.0)))
    found = await store.search(SearchQuery(tenant="t", user="u", terms=(),
                                           embedding=(0.0, 1.0, 0.0, 0.0)))
    assert [c.memory.id for c in found] == ["new"]
    found = await store.search(SearchQuery(tenant="t", user="u", terms=("peanuts",),
                                           embedding=(0.0, 1.0, 0.0, 0.0)))
    assert {c.memory.id for c in found} == {"old", "new"}


async def test_query_embedding_tokens_are_reported_with_the_recall(
        store: SqliteMemoryStore) -> None:
    """The provider tokens of the query embeddings come back with the recall (the
    request's ``recall_tokens``); a query served from the cache costs none."""
    embedder = CachedEmbedder(ConceptBackend(CONCEPTS, tokens_per_text=4))
    await add(store, None, "Owns a puppy called Rex")
    queries = [SubQuery("What's the name of my hound?"), SubQuery("my hound", 0.8)]
    first = await retriever(store, embedder).recall(tenant="t", user="u", queries=queries,
                                                    limit=3, now=NOW)
    again = await retriever(store, embedder).recall(tenant="t", user="u", queries=queries,
                                                    limit=3, now=NOW)
    assert (first.tokens, again.tokens) == (8, 0)
    assert (await retriever(store, None).recall(tenant="t", user="u", queries=queries,
                                                limit=3, now=NOW)).tokens == 0


async def test_vectors_of_another_model_are_not_compared(store: SqliteMemoryStore) -> None:
    """A memory whose vector came from another model is found by its keywords only: its
    vector is neither searched nor used in ranking, so spaces never mix."""
    embedder = concept_embedder(CONCEPTS)
    vector = await embedder.embed_query("Owns a puppy called Rex")
    await store.add(Memory(id="m1", tenant="t", user_id="u", content="Owns a puppy called Rex",
                           embedding=vector, embedding_model="another-model",
                           created_at=NOW, last_seen_at=NOW, updated_at=NOW))
    paraphrase = [SubQuery("What's the name of my hound?")]
    assert (await contents(store, embedder, paraphrase))[0] == []
    found = await retriever(store, embedder).recall(
        tenant="t", user="u", queries=[SubQuery("puppy Rex")], limit=3, now=NOW)
    assert [r.memory.id for r in found.ranked] == ["m1"]
    assert found.ranked[0].memory.embedding is None
    await store.update((await store.get("t", "u", "m1")).with_changes(  # type: ignore[union-attr]
        embedding_model=embedder.model))
    assert (await contents(store, embedder, paraphrase))[0] == ["Owns a puppy called Rex"]


class _RecordingStore(SqliteMemoryStore):
    """The SQLite store, noting each generation read and keyword search in ``events``."""

    def __init__(self, db: SqliteDatabase, events: list[str]) -> None:
        super().__init__(db)
        self.events = events

    async def recall_generations(self, tenant: str, user: str) -> tuple[int, ...]:
        self.events.append("store")
        return await super().recall_generations(tenant, user)

    async def search(self, query: SearchQuery) -> list[Candidate]:
        self.events.append("store")
        return await super().search(query)


class _RecordingBackend(ConceptBackend):
    """A concept model noting in ``events`` when a batch reaches it."""

    def __init__(self, events: list[str]) -> None:
        super().__init__(CONCEPTS)
        self.events = events

    async def embed(self, texts: Any, *, urgent: bool = False) -> RawEmbeddings:
        self.events.append("embed")
        return await super().embed(texts, urgent=urgent)


@pytest.mark.parametrize("indexed", [False, True])
async def test_the_query_embedding_starts_before_the_keyword_searches(
        tmp_path: Path, indexed: bool) -> None:
    """The query batch reaches the embedder before recall reads or searches the store
    (index current or not), so a model in a worker thread or behind the network embeds
    while the keyword searches run; without an embedder the store is read as before."""
    events: list[str] = []
    async with SqliteDatabase(tmp_path / "m.db") as db:
        store = _RecordingStore(db, events)
        embedder = CachedEmbedder(_RecordingBackend(events), dimension=len(CONCEPTS) + 16)
        await add(store, embedder, "Owns a puppy called Rex", "Drives a blue car")
        indexes = RecallIndexes() if indexed else None
        found = Retriever(store=store, embedder=embedder, weights=RankWeights(),
                          candidate_pool=30, indexes=indexes)
        plain = Retriever(store=store, embedder=None, weights=RankWeights(),
                          candidate_pool=30, indexes=indexes)
        if indexes is not None:
            await found.index("t", "u")
        for retriever_, first in ((found, "embed"), (plain, "store")):
            events.clear()
            recalled = await retriever_.recall(
                tenant="t", user="u", queries=[SubQuery("my hound and its puppy")],
                limit=2, now=NOW)
            assert recalled.ranked[0].memory.content == "Owns a puppy called Rex"
            assert events[0] == first
            assert "store" in events
