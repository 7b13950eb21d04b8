"""Backfill: give every active memory a vector of the configured embedder.

Memories written while no embedder was configured, while it was down, or by another
model (``Memory.embedding_model`` differs, or was not recorded) are found with
:meth:`~proxy.memory.store.MemoryStore.stale_vectors`, embedded in batches through
:class:`~proxy.memory.vectors.MemoryVectors` (tokens booked in the learning ledger, purpose
``embed``, per tenant and user — never the user's usage) and written back with
:meth:`~proxy.memory.store.MemoryStore.set_vectors`, which skips a memory whose content
changed meanwhile. Until then the vector search leaves the other model's vectors out
(``SearchQuery.embedding_model``): spaces are never mixed.

Runs from ``memory-proxy reindex`` and, when an embedder is configured, in the background
of ``serve`` (``memory.embedder.reindex_on_start``), where it yields the CPU between
batches. Idempotent: a second run finds nothing to do.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

import structlog

from proxy.memory.records import Memory
from proxy.memory.store import MemoryStore, VectorUpdate
from proxy.memory.vectors import MemoryVectors

log = structlog.get_logger("proxy.memory")
PAGE = 256  # memories looked at per store call


@dataclass(frozen=True, slots=True)
class ReindexReport:
    """What a run did: ``embedded`` memories got a vector, ``skipped`` changed meanwhile,
    ``failed`` could not be embedded (the run stopped at the first failing batch)."""

    model: str
    embedded: int = 0
    skipped: int = 0
    failed: int = 0


async def reindex(store: MemoryStore, vectors: MemoryVectors, *, page: int = PAGE,
                  pause_seconds: float = 0.0) -> ReindexReport:
    """Embed every active memory that lacks a vector of ``vectors.embedder.model``.
    ``pause_seconds`` between batches leaves the CPU to requests (background runs).
    Raises :class:`~proxy.memory.store.StoreUnavailableError` when the store fails."""
    model = vectors.embedder.model
    embedded = skipped = 0
    cursor = ""
    while True:
        stale, cursor = await store.stale_vectors(model, limit=page, cursor=cursor)
        owners: dict[tuple[str, str | None], list[Memory]] = defaultdict(list)
        for memory in stale:
            if memory.content.strip():
                owners[(memory.tenant, memory.user_id)].append(memory)
        for (tenant, user), memories in owners.items():
            found = await vectors.embed([m.content for m in memories], tenant=tenant,
                                        user=user, source="reindex")
            if found is None:  # logged and counted by MemoryVectors
                report = ReindexReport(model, embedded, skipped, failed=len(memories))
                log.warning("memory_reindex_stopped", model=model, embedded=embedded)
                return report
            updates = [VectorUpdate(tenant=m.tenant, user_id=m.user_id, memory_id=m.id,
                                    content=m.content, embedding=found[m.content],
                                    model=model)
                       for m in memories if m.content in found]
            written = await store.set_vectors(updates)
            embedded += written
            skipped += len(updates) - written
            await asyncio.sleep(pause_seconds)
        if not cursor:
            break
    if embedded or skipped:
        log.info("memory_reindexed", model=model, embedded=embedded, skipped=skipped)
    return ReindexReport(model, embedded, skipped)
