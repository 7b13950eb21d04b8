"""Embedding memories as they are written (learning and the management API).

:class:`MemoryVectors` wraps an :class:`~proxy.memory.embed.Embedder` with what writers
need: the tokens a call spent go to the learning ledger (purpose ``embed``, never the user's
usage — docs/design.md#accounting), and a failing embedder never loses a memory — the
failure is logged (``memory_embed_failed``), counted (``memory_proxy_learning_events_total``
``{event="embed_failed"}``) and the memory is stored without a vector.
:func:`vector_similarity` turns the vectors into consolidation's ``similarity`` hook
(cosine, for the ≥ ``dedup_similarity`` merge, docs/design.md#evidence).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

import structlog

from proxy.ledger import LearningUsage, Ledger
from proxy.memory.embed import Embedder, Vector, cosine
from proxy.memory.records import Memory
from proxy.metrics import Metrics

log = structlog.get_logger("proxy.memory")
WRITE_TIMEOUT_SECONDS = 30.0  # a write waits this long for its vectors, then goes without


def vector_similarity(vectors: Mapping[str, Vector]) -> Callable[[Memory, str], float]:
    """``similarity(memory, text)``: cosine of the memory's stored vector and ``text``'s
    vector from ``vectors``; 0.0 when either is missing (then only the text rules apply)."""

    def similarity(memory: Memory, text: str) -> float:
        vector = vectors.get(text)
        if vector is None or memory.embedding is None:
            return 0.0
        return cosine(memory.embedding, vector)

    return similarity


class MemoryVectors:
    def __init__(self, embedder: Embedder, *, ledger: Ledger, clock: Callable[[], datetime],
                 metrics: Metrics | None = None,
                 timeout_seconds: float = WRITE_TIMEOUT_SECONDS) -> None:
        self.embedder = embedder
        self._ledger = ledger
        self._clock = clock
        self._metrics = metrics
        self._timeout = timeout_seconds

    async def embed(self, texts: Iterable[str], *, tenant: str, user: str | None,
                    source: str, job_id: str | None = None) -> dict[str, Vector] | None:
        """text → vector for the distinct non-blank ``texts``; ``None`` when the embedder
        failed or took longer than the timeout (logged and counted). ``source`` labels the
        count (``learn``, ``manual``)."""
        unique = [t for t in dict.fromkeys(texts) if t.strip()]
        if not unique:
            return {}
        try:
            async with asyncio.timeout(self._timeout):
                result = await self.embedder.embed_documents(unique)
        except Exception as exc:  # fail-open (TimeoutError included): kept without a vector
            log.warning("memory_embed_failed", model=self.embedder.model, source=source,
                        error=f"{type(exc).__name__}: {exc}"[:300])
            if self._metrics is not None:
                self._metrics.learning_events.labels(event="embed_failed", label=source).inc()
            return None
        if result.tokens > 0:
            await self._ledger.record_learning([LearningUsage(
                at=self._clock(), tenant=tenant, user_id=user, model=self.embedder.model,
                purpose="embed", prompt_tokens=result.tokens, completion_tokens=0,
                job_id=job_id,
            )])
            if self._metrics is not None:
                self._metrics.tokens.labels("learning", "embed").inc(result.tokens)
        return dict(zip(unique, result.vectors, strict=True))

    async def attach(self, memories: Sequence[Memory], *, known: Mapping[str, Vector],
                     previous: Mapping[str, Memory], tenant: str, user: str | None,
                     source: str, job_id: str | None = None) -> tuple[Memory, ...]:
        """``memories`` with a vector (and the embedder's model id) for each active one
        whose vector is missing, of another model, or whose content changed since
        ``previous`` (by id); vectors come from ``known`` or one more call. Memories the
        embedder could not serve are returned unchanged."""
        model = self.embedder.model

        def stale(m: Memory) -> bool:
            before = previous.get(m.id)
            return m.active and (m.embedding is None or m.embedding_model != model or
                                 (before is not None and before.content != m.content))

        missing = [m.content for m in memories if stale(m) and m.content not in known]
        vectors = dict(known)
        if missing:
            vectors.update(await self.embed(missing, tenant=tenant, user=user, source=source,
                                            job_id=job_id) or {})
        return tuple(
            m.with_changes(embedding=vectors[m.content], embedding_model=model)
            if stale(m) and m.content in vectors else m
            for m in memories
        )
