"""Learning with an embedder: vectors for learned memories, similarity dedup, failures."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.learning.answers import CandidateFact
from proxy.learning.consolidate import BatchContext, consolidate
from proxy.memory.embed import CachedEmbedder, cosine
from proxy.memory.records import Memory
from proxy.memory.store import ListQuery
from proxy.memory.vectors import vector_similarity
from tests.fakes import ConceptBackend, FakeUpstream, Gateway, make_settings, running_gateway

CONCEPTS = [["dog", "puppy", "hound"], ["tea", "chai"], ["cat", "kitten"]]
NOW = datetime(2024, 6, 1, tzinfo=UTC)


def fact(content: str, subject: str = "user") -> dict[str, Any]:
    return {"title": content[:30], "content": content, "category": "user_preference",
            "subcategory": "", "tags": [], "subject": subject, "duplicate_of": None,
            "supersedes": []}


async def say(gw: Gateway, text: str, conversation: str) -> None:
    async with gw.client() as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": text}]},
            headers={"X-User-Id": "u1", "X-Conversation-Id": conversation})
    assert response.status_code == 200, response.text


async def memories(gw: Gateway) -> list[Memory]:
    return await gw.res.store.list_memories(ListQuery(tenant="default", user="u1"))


def settings_for(tmp_path: Path, **learning: Any) -> Any:
    return make_settings(tmp_path, learning={"enabled": True, "batch_messages": 1, **learning})


async def test_learned_memories_get_vectors_and_tokens_go_to_the_learning_ledger(
    tmp_path: Path, upstream: FakeUpstream,
) -> None:
    """A learned fact is stored with its vector; the embedding tokens are booked in the
    learning ledger (purpose ``embed``, with the job id), not in the user's usage."""
    settings = settings_for(tmp_path)
    backend = ConceptBackend(CONCEPTS, tokens_per_text=4)
    upstream.extract = lambda body: {"memories": [fact("Drinks chai every morning")],
                                     "profile": None}
    async with running_gateway(settings, upstream, embedder=CachedEmbedder(backend)) as gw:
        await say(gw, "I drink chai every morning.", "c1")
        await gw.settle()
        (learned,) = await memories(gw)
        assert learned.embedding is not None
        assert cosine(learned.embedding, await backend_vector(backend, "tea")) > 0.8
    with sqlite3.connect(settings.storage.path) as conn:
        rows = conn.execute("SELECT model, prompt_tokens, job_id FROM learning_ledger "
                            "WHERE purpose = 'embed'").fetchall()
    assert [(model, tokens) for model, tokens, _ in rows] == [("fake-concepts", 4)]
    assert rows[0][2] is not None


async def test_a_paraphrase_of_a_stored_fact_merges_as_evidence(
    tmp_path: Path, upstream: FakeUpstream,
) -> None:
    """"Has a hound" after "Owns a puppy" shares no keyword but is ≥ 0.85 similar: one
    memory with hits 2. Found by vector search alone (no keyword-related memories here)."""
    settings = settings_for(tmp_path, related_memories=0)
    said = iter([[fact("Owns a puppy")], [fact("Has a hound")], [fact("Owns a kitten")]])
    upstream.extract = lambda body: {"memories": next(said), "profile": None}
    async with running_gateway(settings, upstream,
                               embedder=CachedEmbedder(ConceptBackend(CONCEPTS))) as gw:
        await say(gw, "I own a puppy.", "c1")
        await gw.settle()
        await say(gw, "I have a hound.", "c2")
        await gw.settle()
        assert [(m.content, m.hits) for m in await memories(gw)] == [("Owns a puppy", 2)]
        await say(gw, "I own a kitten.", "c3")
        await gw.settle()
        assert sorted((m.content, m.hits) for m in await memories(gw)) == [
            ("Owns a kitten", 1), ("Owns a puppy", 2)]


async def test_a_failing_embedder_never_loses_a_learned_memory(
    tmp_path: Path, upstream: FakeUpstream,
) -> None:
    """With the embedder down, learning still stores the fact (without a vector), finishes
    the job and counts the failure; dedup falls back to the text rules."""
    backend = ConceptBackend(CONCEPTS, fail=ConnectionError("refused"))
    upstream.extract = lambda body: {"memories": [fact("Owns a puppy")], "profile": None}
    async with running_gateway(settings_for(tmp_path), upstream,
                               embedder=CachedEmbedder(backend)) as gw:
        await say(gw, "I own a puppy.", "c1")
        await gw.settle()
        await say(gw, "I own a puppy, did I say?", "c2")
        await gw.settle()
        assert [(m.content, m.hits, m.embedding) for m in await memories(gw)] == [
            ("Owns a puppy", 2, None)]
        assert gw.res.queue is not None
        assert (await gw.res.queue.depth()).dead == 0
        metric = gw.res.metrics.learning_events.labels(event="embed_failed", label="learn")
        assert metric._value.get() >= 2


async def backend_vector(backend: ConceptBackend, text: str) -> tuple[float, ...]:
    return await CachedEmbedder(backend).embed_query(text)


def candidate(content: str, subject: str = "user") -> CandidateFact:
    return CandidateFact(title=content[:30], content=content, category="user_preference",
                         subcategory="", tags=(), subject=subject, supersedes=(),
                         duplicate_of=None, source_turns=())


def stored(content: str, vector: tuple[float, ...], subject: str = "user") -> Memory:
    return Memory(id="m1", tenant="t", user_id="u", content=content, embedding=vector,
                  subject=subject, created_at=NOW, updated_at=NOW, last_seen_at=NOW)


def context(existing: list[Memory], vectors: dict[str, tuple[float, ...]]) -> BatchContext:
    return BatchContext(tenant="t", user="u", batch_key="b1", conversation="c1",
                        channel="private", now=NOW, batch_started=NOW, score=0.9,
                        existing=existing, similarity=vector_similarity(vectors))


def test_similarity_at_the_threshold_merges_and_below_creates() -> None:
    """Cosine ≥ dedup_similarity (0.85, docs/design.md#evidence) merges as evidence; 0.84
    does not."""
    memory = stored("Owns a puppy", (1.0, 0.0))
    for cos, merged in ((0.85, True), (0.95, True), (0.84, False)):
        vector = (cos, (1 - cos * cos) ** 0.5)
        changes = consolidate(context([memory], {"Has a hound": vector}),
                              [candidate("Has a hound")], profile=None, profile_update=None,
                              user_messages=1)
        hits = {m.content: m.hits for m in changes.upserts}
        assert hits == ({"Owns a puppy": 2} if merged else {"Has a hound": 1}), cos


def test_similar_facts_about_different_people_stay_apart() -> None:
    """A near-identical vector about another subject is relationship knowledge, not a
    repeat of the user's own fact."""
    memory = stored("Owns a puppy", (1.0, 0.0))
    changes = consolidate(context([memory], {"Owns a puppy too": (1.0, 0.0)}),
                          [candidate("Owns a puppy too", subject="Anna")], profile=None,
                          profile_update=None, user_messages=1)
    assert [(m.content, m.subject) for m in changes.upserts] == [("Owns a puppy too", "Anna")]


def test_no_vector_means_no_similarity() -> None:
    """Without a vector for the fact (embedder failed) similarity is 0, never a merge."""
    similarity = vector_similarity({})
    assert similarity(stored("Owns a puppy", (1.0, 0.0)), "Has a hound") == 0.0
    assert vector_similarity({"x": (1.0, 0.0)})(
        Memory(id="m", tenant="t", user_id="u", content="y"), "x") == 0.0
