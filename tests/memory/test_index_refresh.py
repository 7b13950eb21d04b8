"""A recall index behind the store's generations: on a store that reads only what changed
(Redis) it is brought up to date before the recall searches — concurrent recalls share
one refresh, and a refresh that fails fails those recalls (memory degrades) without
poisoning the next one; on SQLite the recalls search the store while one rebuild runs.
Either way the rebuild starts from the index it replaces and every recall sees the write."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.memory.index import RecallIndexes
from proxy.memory.recall import RankWeights
from proxy.memory.retrieve import Retriever, SubQuery
from proxy.memory.store import MemoryStore, RecallCorpus, StoreUnavailableError
from tests.memory.test_index import NOW, mem


class Counted:
    """The real store, with its corpus reads counted (and failing while ``down``)."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.reads: list[RecallCorpus | None] = []
        self.down = False

    async def recall_corpus(self, tenant: str, user: str, *,
                            since: RecallCorpus | None = None) -> RecallCorpus:
        self.reads.append(since)
        if self.down:
            raise StoreUnavailableError("corpus read failed")
        await asyncio.sleep(0.01)  # long enough for every waiting recall to join it
        return await self._store.recall_corpus(tenant, user, since=since)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def recall(retriever: Retriever, text: str) -> list[str]:
    result = await retriever.recall(tenant="t1", user="u1", queries=[SubQuery(text)],
                                    limit=10, now=NOW)
    return sorted(r.memory.content for r in result.ranked)


async def test_recalls_behind_a_write_share_one_refresh(store: MemoryStore) -> None:
    """Eight concurrent recalls after a write all see it; one corpus read follows, which
    starts from the index being replaced."""
    await store.add(mem("Drinks green tea"))
    counted = Counted(store)
    retriever = Retriever(store=counted, embedder=None,  # type: ignore[arg-type]
                          weights=RankWeights(), candidate_pool=30, indexes=RecallIndexes())
    await recall(retriever, "tea")
    first = await retriever.index("t1", "u1")
    assert counted.reads == [None]
    await store.add(mem("Drinks oolong tea"))
    found = await asyncio.gather(*(recall(retriever, "tea") for _ in range(8)))
    assert found == [["Drinks green tea", "Drinks oolong tea"]] * 8
    await retriever.index("t1", "u1")  # SQLite's background rebuild lands
    assert counted.reads == [None, first.corpus]


async def test_a_failed_refresh_fails_its_recalls_and_the_next_one_retries(
        store: MemoryStore) -> None:
    """While the corpus read fails, a recall behind a write raises the store's error on
    Redis (the caller degrades memory) and answers from the store's search on SQLite —
    never from the index behind the write; once it works again the next recall sees it."""
    await store.add(mem("Drinks green tea"))
    counted = Counted(store)
    retriever = Retriever(store=counted, embedder=None,  # type: ignore[arg-type]
                          weights=RankWeights(), candidate_pool=30, indexes=RecallIndexes())
    await recall(retriever, "tea")
    await retriever.index("t1", "u1")
    await store.add(mem("Drinks oolong tea"))
    counted.down = True
    both = ["Drinks green tea", "Drinks oolong tea"]
    if store.incremental_corpus:
        with pytest.raises(StoreUnavailableError):
            await recall(retriever, "tea")
    else:
        assert await recall(retriever, "tea") == both
    counted.down = False
    assert await recall(retriever, "tea") == both
