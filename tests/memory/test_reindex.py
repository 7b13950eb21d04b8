"""Backfill (memory-proxy reindex): every active memory gets a vector of the configured
embedder, tokens go to the learning ledger, a model change re-embeds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.ledger import SqliteLedger
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.ledger import Totals
from proxy.memory.embed import CachedEmbedder
from proxy.memory.records import Memory
from proxy.memory.reindex import reindex
from proxy.memory.store import SearchQuery
from proxy.memory.vectors import MemoryVectors
from tests.fakes import ConceptBackend

NOW = datetime(2025, 3, 1, tzinfo=UTC)
CONCEPTS = [["dog", "puppy", "hound"], ["tea", "chai", "matcha"]]


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SqliteDatabase]:
    async with SqliteDatabase(tmp_path / "m.db") as database:
        yield database


def memory(mid: str, content: str, *, tenant: str = "t", user: str | None = "u",
           **fields: object) -> Memory:
    return Memory(id=mid, tenant=tenant, user_id=user, content=content, created_at=NOW,
                  updated_at=NOW, last_seen_at=NOW, **fields)  # type: ignore[arg-type]


def vectors_of(embedder: CachedEmbedder, ledger: SqliteLedger) -> MemoryVectors:
    return MemoryVectors(embedder, ledger=ledger, clock=lambda: NOW)


async def test_memories_without_a_vector_are_embedded_once(db: SqliteDatabase) -> None:
    """Personal and shared memories of every tenant stored without a vector get one of
    the embedder (with its model id); tokens are booked as learning per owner, never as
    usage; a second run has nothing to do; retired memories are left alone."""
    store, ledger = SqliteMemoryStore(db), SqliteLedger(db)
    for m in (memory("a", "Owns a puppy called Rex"), memory("b", "Drinks chai daily"),
              memory("c", "Office dog policy", user=None, scope="shared"),
              memory("d", "Likes matcha", tenant="t2", user="v"),
              memory("e", "Old fact", superseded_at=NOW, superseded_by="a")):
        await store.add(m)
    backend = ConceptBackend(CONCEPTS, tokens_per_text=2)
    embedder = CachedEmbedder(backend, dimension=backend.size)
    report = await reindex(store, vectors_of(embedder, ledger), page=2)
    assert (report.model, report.embedded, report.skipped, report.failed) == (
        "fake-concepts", 4, 0, 0)
    for tenant, user, mid in (("t", "u", "a"), ("t", "u", "b"), ("t", None, "c"),
                              ("t2", "v", "d")):
        stored = await store.get(tenant, user, mid)
        assert stored is not None
        assert stored.embedding is not None
        assert stored.embedding_model == "fake-concepts"
    retired = await store.get("t", "u", "e")
    assert retired is not None
    assert retired.embedding is None
    assert await ledger.learning_totals("t", "u") == Totals(1, 4, 0)
    assert await ledger.learning_totals("t2") == Totals(1, 2, 0)
    assert await ledger.usage_totals("t") == Totals(0, 0, 0)
    calls = len(backend.calls)
    assert (await reindex(store, vectors_of(embedder, ledger))).embedded == 0
    assert len(backend.calls) == calls
    hits = await store.search(SearchQuery(tenant="t", user="u", terms=(),
                                          embedding=await embedder.embed_query("my hound"),
                                          embedding_model=embedder.model, limit=1,
                                          include_shared=False))
    assert [c.memory.id for c in hits] == ["a"]


async def test_a_model_change_re_embeds_instead_of_mixing(db: SqliteDatabase) -> None:
    """Vectors of another model (or of no recorded model) are replaced by the configured
    model's; the model id follows."""
    store, ledger = SqliteMemoryStore(db), SqliteLedger(db)
    await store.add(memory("a", "Owns a puppy", embedding=(1.0,) * 18,
                           embedding_model="old-model"))
    await store.add(memory("b", "Drinks chai", embedding=(0.5,) * 18))
    backend = ConceptBackend(CONCEPTS)
    embedder = CachedEmbedder(backend, dimension=backend.size)
    assert (await reindex(store, vectors_of(embedder, ledger))).embedded == 2
    for mid, text in (("a", "Owns a puppy"), ("b", "Drinks chai")):
        stored = await store.get("t", "u", mid)
        assert stored is not None
        assert stored.embedding_model == "fake-concepts"
        assert stored.embedding == pytest.approx(await embedder.embed_query(text))


async def test_a_failing_embedder_stops_the_run_and_loses_nothing(db: SqliteDatabase) -> None:
    """When the embedder fails the run stops and says how many failed; the memories are
    kept as they were, for the next run."""
    store, ledger = SqliteMemoryStore(db), SqliteLedger(db)
    await store.add(memory("a", "Owns a puppy"))
    broken = CachedEmbedder(ConceptBackend(CONCEPTS, fail=ConnectionError("refused")))
    report = await reindex(store, vectors_of(broken, ledger))
    assert (report.embedded, report.failed) == (0, 1)
    stored = await store.get("t", "u", "a")
    assert stored is not None
    assert stored.embedding is None
    assert stored.content == "Owns a puppy"
