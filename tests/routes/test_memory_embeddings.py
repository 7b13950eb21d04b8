"""Embeddings through a running gateway: chat with a broken or slow embedder, and manual
memories written with (or, when the embedder fails, without) a vector."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from proxy.memory.embed import CachedEmbedder
from proxy.settings import Settings
from tests.fakes import ConceptBackend, Gateway, concept_embedder, make_settings, running_gateway

CONCEPTS = [["dog", "puppy", "hound"], ["allergic", "allergy", "intolerant"]]


async def remember(gw: Gateway, content: str, user: str = "u1") -> dict[str, Any]:
    async with gw.client() as client:
        response = await client.post("/v1/memories", json={"content": content},
                                     headers={"X-User-Id": user})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def ask(gw: Gateway, text: str, user: str = "u1") -> Any:
    async with gw.client() as client:
        response = await client.post("/v1/chat/completions", headers={"X-User-Id": user},
                                     json={"model": "m",
                                           "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200, response.text
    return response


def embed_ledger(settings: Settings) -> list[tuple[str, str, int]]:
    with sqlite3.connect(settings.storage.path) as conn:
        return conn.execute("SELECT purpose, model, prompt_tokens FROM learning_ledger "
                            "WHERE purpose = 'embed'").fetchall()


async def test_manual_memory_gets_a_vector_and_paraphrases_recall_it(tmp_path: Path) -> None:
    """POST /v1/memories stores a vector (tokens in the learning ledger); a question sharing
    no keyword with it recalls it, and the headers report a normal injection."""
    settings = make_settings(tmp_path)
    async with running_gateway(settings, embedder=concept_embedder(CONCEPTS)) as gw:
        created = await remember(gw, "Owns a puppy called Rex")
        assert created["has_embedding"] is True
        await remember(gw, "Plays chess on Sundays")
        response = await ask(gw, "What about my hound?")
        assert response.headers["x-memory-status"] == "injected"
        assert "x-memory-reason" not in response.headers
        assert "Owns a puppy called Rex" in str(gw.upstream.last_chat["messages"])
    assert embed_ledger(settings) == [("embed", "fake-concepts", 3), ("embed", "fake-concepts", 3)]


async def test_a_failing_embedder_never_loses_a_manual_memory(tmp_path: Path) -> None:
    """With the embedder down, POST /v1/memories still answers 201 and stores the memory
    without a vector; the failure is counted."""
    broken = CachedEmbedder(ConceptBackend(CONCEPTS, fail=ConnectionError("refused")))
    async with running_gateway(make_settings(tmp_path), embedder=broken) as gw:
        created = await remember(gw, "Allergic to peanuts")
        assert created["has_embedding"] is False
        async with gw.client() as client:
            listed = (await client.get("/v1/memories", headers={"X-User-Id": "u1"})).json()
            metrics = (await client.get("/metrics")).text
        assert [m["content"] for m in listed["data"]] == ["Allergic to peanuts"]
        assert 'event="embed_failed",label="manual"} 1.0' in metrics


async def test_chat_succeeds_keyword_only_when_the_embedder_fails(tmp_path: Path) -> None:
    """A failing query embedding costs only vector recall: the keyword match is injected,
    the reply arrives, and the headers say ``degraded`` / ``embedder_unavailable``."""
    backend = ConceptBackend(CONCEPTS)
    async with running_gateway(make_settings(tmp_path),
                               embedder=CachedEmbedder(backend)) as gw:
        await remember(gw, "Allergic to peanuts")
        backend.fail = TimeoutError("provider timed out")
        response = await ask(gw, "Which peanuts snack is safe for me?")
        assert response.json()["choices"][0]["message"]["content"] == "Hello there!"
        assert response.headers["x-memory-status"] == "degraded"
        assert response.headers["x-memory-reason"] == "embedder_unavailable"
        assert response.headers["x-memory-injected"] == "1"
        assert "Allergic to peanuts" in str(gw.upstream.last_chat["messages"])


async def test_chat_does_not_wait_for_a_slow_embedder(tmp_path: Path) -> None:
    """A query embedding slower than the recall deadline is abandoned: the request goes on
    well within a second with keyword recall, and says ``embedder_timeout``."""
    backend = ConceptBackend(CONCEPTS)
    settings = make_settings(tmp_path, memory={"recall_timeout_ms": 150})
    async with running_gateway(settings, embedder=CachedEmbedder(backend)) as gw:
        await remember(gw, "Allergic to peanuts")
        backend.delay = 10.0
        started = time.perf_counter()
        response = await ask(gw, "Which peanuts snack is safe for me?")
        assert time.perf_counter() - started < 1.0
        assert response.headers["x-memory-status"] == "degraded"
        assert response.headers["x-memory-reason"] == "embedder_timeout"
        assert "Allergic to peanuts" in str(gw.upstream.last_chat["messages"])


async def test_without_an_embedder_recall_is_keyword_only_and_not_degraded(
    gateway: Gateway,
) -> None:
    """``provider: none`` (the default) is a normal state, not a degradation."""
    created = await remember(gateway, "Allergic to peanuts")
    assert created["has_embedding"] is False
    response = await ask(gateway, "Any peanuts in this?")
    assert response.headers["x-memory-status"] == "injected"
    assert "x-memory-reason" not in response.headers


async def test_an_edited_memory_is_embedded_again(tmp_path: Path) -> None:
    """PATCH with new content stores the new content's vector, so a paraphrase of the new
    text (no shared keyword) recalls it; an edit of the title alone keeps the vector."""
    backend = ConceptBackend(CONCEPTS)
    async with running_gateway(make_settings(tmp_path),
                               embedder=CachedEmbedder(backend, dimension=backend.size)) as gw:
        created = await remember(gw, "Plays chess on Sundays")
        async with gw.client(headers={"X-User-Id": "u1"}) as client:
            edited = await client.patch(f"/v1/memories/{created['id']}",
                                        json={"content": "Owns a puppy called Rex"})
            assert edited.json()["has_embedding"] is True
            stored = await gw.res.store.get("default", "u1", created["id"])
            assert stored is not None
            assert stored.embedding is not None
            assert stored.embedding[0] > 0.5  # the dog concept's axis, not chess's
            calls = len(backend.calls)
            await client.patch(f"/v1/memories/{created['id']}", json={"title": "Pet"})
            assert len(backend.calls) == calls
            again = await gw.res.store.get("default", "u1", created["id"])
            assert again is not None
            assert again.embedding == stored.embedding
        response = await ask(gw, "What about my hound?")
        assert "Owns a puppy called Rex" in str(gw.upstream.last_chat["messages"])
        assert response.headers["x-memory-status"] == "injected"
