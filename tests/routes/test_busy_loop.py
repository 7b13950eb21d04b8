"""A busy gateway keeps memory on: while other work holds the event loop, a chat whose store
answers at once still gets its memory, because the recall deadline counts only the time the
loop was free (docs/design.md#recall-deadline) — on each backend. The control: the same chat
with the deadline on the wall clock loses its memory to a timeout."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes import (
    FakeUpstream,
    Gateway,
    backend_overrides,
    busy_loop,
    concept_embedder,
    make_settings,
    running_gateway,
)

RECALL_TIMEOUT_MS = 40  # shorter than one turn of the busy loop (a recall yields at least once)
BUSY_SECONDS = 0.05  # each turn of the hog holds the gateway's event loop this long


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path,
                  upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    settings = make_settings(tmp_path, memory={"recall_timeout_ms": RECALL_TIMEOUT_MS,
                                               "recall_hard_timeout_ms": 10_000},
                             **backend_overrides(request, tmp_path))
    async with running_gateway(settings, upstream) as gw:
        async with gw.client() as client:
            added = await client.post("/v1/memories", headers={"X-User-Id": "alice"},
                                      json={"content": "Drinks oolong tea every morning"})
            assert added.status_code == 201, added.text
            # Warm: the recall index and settings caches are built before the loop is busy.
            await chat(client)
        yield gw


async def chat(client: httpx.AsyncClient,
               question: str = "Which tea do I drink?") -> httpx.Response:
    reply = await client.post("/v1/chat/completions", headers={"X-User-Id": "alice"}, json={
        "model": "m", "messages": [{"role": "user", "content": question}]})
    assert reply.status_code == 200, reply.text
    return reply


async def busy_chats(gateway: Gateway, count: int,
                     question: str = "Which tea do I drink?") -> list[str]:
    """``count`` chats, one after another, while a task holds the loop at every turn it
    gets; each reply's ``X-Memory-Status`` / ``X-Memory-Reason``."""
    async with busy_loop(BUSY_SECONDS), gateway.client() as client:
        replies = [await chat(client, question) for _ in range(count)]
    return [f"{r.headers['x-memory-status']}/{r.headers.get('x-memory-reason', '')}"
            for r in replies]


async def test_a_busy_loop_keeps_the_memory_of_a_store_that_answers(
        gateway: Gateway) -> None:
    assert await busy_chats(gateway, 5) == ["injected/"] * 5


async def test_on_the_wall_clock_the_same_busy_loop_times_the_memory_out(
        gateway: Gateway) -> None:
    lag = gateway.res.memory.loop_lag
    assert lag is not None
    await lag.stop()  # no meter: the deadline falls back to the wall clock
    outcomes = await busy_chats(gateway, 5)
    assert "degraded/timeout" in outcomes


class AfterTurns:
    """An embedder whose query embeddings take a few turns of the event loop (a model in a
    worker thread, an embedding server); everything else is ``inner``'s."""

    def __init__(self, inner: Any, turns: int = 4) -> None:
        self._inner = inner
        self._turns = turns

    async def embed_queries(self, texts: list[str]) -> Any:
        for _ in range(self._turns):
            await asyncio.sleep(0)
        return await self._inner.embed_queries(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_busy_loop_keeps_the_query_embedding_within_its_budget(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    """The embedding's share of the deadline counts loop-free time too: a paraphrase that
    only the vectors find is still found, and the reply is not marked keyword-only."""
    settings = make_settings(tmp_path, memory={"recall_timeout_ms": RECALL_TIMEOUT_MS,
                                               "recall_hard_timeout_ms": 10_000})
    embedder = AfterTurns(concept_embedder([["dog", "puppy", "hound"]]))
    async with running_gateway(settings, upstream, embedder=embedder) as gw:
        async with gw.client() as client:
            added = await client.post("/v1/memories", headers={"X-User-Id": "alice"},
                                      json={"content": "Owns a puppy called Rex"})
            assert added.status_code == 201, added.text
            await chat(client, "What about my hound?")
        assert await busy_chats(gw, 3, "What about my hound?") == ["injected/"] * 3
        assert "Owns a puppy called Rex" in str(upstream.last_chat["messages"])
