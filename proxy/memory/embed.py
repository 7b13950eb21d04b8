"""Text embeddings behind one interface: batched, cached, dimension-checked.

An :class:`Embedder` turns text into unit-length (L2-normalised) vectors of a fixed
``dimension``. ``embed_query`` / ``embed_queries`` run on the hot path, inside the recall
deadline; ``embed_documents`` runs when memories are written and reports the provider
tokens it spent, which the caller books in the learning ledger (purpose ``embed``,
docs/design.md#accounting).

A provider plugs in as an :class:`EmbeddingBackend` — one batch of texts in, raw vectors
and a token count out: ``local`` (sentence-transformers on a bundled model,
:mod:`proxy.memory.embed_local`) or ``litellm`` (any provider litellm speaks,
:class:`proxy.upstream.litellm_adapter.LiteLLMEmbeddings`). :class:`CachedEmbedder` adds
what every provider needs:

- **batching** — documents go to the backend ``batch_size`` texts at a time;
- **cache** — a bounded LRU keyed by the SHA-256 of the text (``cache_size`` entries,
  0 = off); cached texts cost no tokens and no time;
- **checks** — one vector per text, each of length ``dimension`` (mismatch →
  :class:`EmbedderError`), finite and non-zero, then L2-normalised so that a dot product
  is the cosine similarity.

Errors: any failure leaves as :class:`EmbedderError` (foreign exceptions are chained), so
callers degrade without knowing the provider: recall goes keyword-only, a memory is stored
without a vector. :func:`probe_dimension` fails startup with :class:`ConfigError` when the
configured ``memory.embedder.dimension`` differs from what the model returns.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import structlog

from proxy.errors import MemoryProxyError
from proxy.settings import ConfigError

log = structlog.get_logger("proxy.embed")

Vector = tuple[float, ...]
PROBE_TEXT = "dimension probe"


class EmbedderError(MemoryProxyError):
    """The embedder failed or returned unusable vectors; callers fall back."""

    log_traceback = True


@dataclass(frozen=True, slots=True)
class Embeddings:
    """Vectors in input order, and the provider tokens this call spent (0 when every text
    came from the cache or the provider reports none)."""

    vectors: tuple[Vector, ...]
    tokens: int = 0


class Embedder(Protocol):
    """What the rest of the gateway uses. Vectors are unit length, ``dimension`` long."""

    model: str
    dimension: int

    async def embed_query(self, text: str) -> Vector:
        """One query vector (hot path). Raises :class:`EmbedderError`."""
        ...

    async def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """Query vectors in one batch (hot path: served before pending document batches)
        and the provider tokens spent (booked as the request's ``recall_tokens``). Raises
        :class:`EmbedderError`."""
        ...

    async def embed_documents(self, texts: Sequence[str]) -> Embeddings:
        """One vector per text, in order, and the tokens spent. Raises
        :class:`EmbedderError`."""
        ...


@dataclass(frozen=True, slots=True)
class RawEmbeddings:
    """A backend's answer: one row per input text (any length, not yet normalised)."""

    rows: Sequence[Sequence[float]]
    tokens: int = 0


class EmbeddingBackend(Protocol):
    """One provider. ``start`` loads or connects and returns the model's dimension when it
    knows it without a call (``None`` otherwise); ``embed`` embeds one batch — ``urgent``
    batches (queries on the hot path) go before waiting document batches where the
    provider queues work itself (the local model)."""

    model: str

    async def start(self) -> int | None: ...

    async def embed(self, texts: Sequence[str], *, urgent: bool = False) -> RawEmbeddings: ...

    async def aclose(self) -> None: ...


def text_key(text: str) -> bytes:
    """Cache key of a text: its SHA-256 digest (32 bytes; the text itself is not kept)."""
    return hashlib.sha256(text.encode("utf-8")).digest()


class EmbeddingCache:
    """A bounded least-recently-used map from text hash to vector. ``maxsize`` 0 = off."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: OrderedDict[bytes, Vector] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, text: str) -> Vector | None:
        key = text_key(text)
        vector = self._items.get(key)
        if vector is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return vector

    def put(self, text: str, vector: Vector) -> None:
        if self.maxsize <= 0:
            return
        key = text_key(text)
        self._items[key] = vector
        self._items.move_to_end(key)
        while len(self._items) > self.maxsize:
            self._items.popitem(last=False)


def normalized(row: Sequence[float], *, dimension: int) -> Vector:
    """``row`` scaled to unit length. Raises :class:`EmbedderError` when its length is not
    ``dimension`` (0 = any), or it holds non-finite values, or it is all zeros."""
    if dimension and len(row) != dimension:
        raise EmbedderError(f"the embedding model returned {len(row)} dimensions, expected "
                            f"{dimension} (memory.embedder.dimension)")
    vector = np.asarray(row, dtype=np.float64)
    norm = float(np.linalg.norm(vector))
    if not math.isfinite(norm) or norm == 0.0:
        raise EmbedderError("the embedding model returned a zero or non-finite vector")
    return tuple((vector / norm).tolist())


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity in [-1, 1]; 0.0 when either is empty, zero or lengths differ."""
    if len(a) != len(b) or not a:
        return 0.0
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    denominator = float(np.linalg.norm(va) * np.linalg.norm(vb))
    return float(va @ vb) / denominator if denominator > 0 else 0.0


class CachedEmbedder:
    """:class:`Embedder` over an :class:`EmbeddingBackend` (see the module docstring).

    ``dimension`` is the configured one, else what :meth:`start` learns from the backend
    or a probe; while it is 0 (provider unreachable at startup and no dimension configured)
    the first good batch sets it.
    """

    def __init__(self, backend: EmbeddingBackend, *, dimension: int | None = None,
                 batch_size: int = 32, cache_size: int = 4096) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._backend = backend
        self.model = backend.model
        self.dimension = dimension or 0
        self._configured = dimension
        self.batch_size = batch_size
        self.cache = EmbeddingCache(cache_size)

    async def start(self) -> None:
        """Load the backend and settle ``dimension`` (see :func:`probe_dimension`)."""
        known = await self._backend.start()
        self.dimension = 0  # the probe must see the model's own length, not fail the check
        self.dimension = await probe_dimension(self, configured=self._configured, known=known)

    async def aclose(self) -> None:
        await self._backend.aclose()

    async def embed_query(self, text: str) -> Vector:
        return (await self._embed([text], urgent=True)).vectors[0]

    async def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        return await self._embed(texts, urgent=True)

    async def embed_documents(self, texts: Sequence[str]) -> Embeddings:
        return await self._embed(texts, urgent=False)

    async def _embed(self, texts: Sequence[str], *, urgent: bool) -> Embeddings:
        if any(not t.strip() for t in texts):
            raise ValueError("cannot embed an empty text")
        found: dict[str, Vector] = {}
        missing: list[str] = []
        for text in dict.fromkeys(texts):
            vector = self.cache.get(text)
            if vector is None:
                missing.append(text)
            else:
                found[text] = vector
        tokens = 0
        for start in range(0, len(missing), self.batch_size):
            batch = missing[start:start + self.batch_size]
            raw = await self._call(batch, urgent=urgent)
            if len(raw.rows) != len(batch):
                raise EmbedderError(f"the embedding model returned {len(raw.rows)} vectors "
                                    f"for {len(batch)} texts")
            if not self.dimension and raw.rows:
                self.dimension = len(raw.rows[0])
            for text, row in zip(batch, raw.rows, strict=True):
                vector = normalized(row, dimension=self.dimension)
                found[text] = vector
                self.cache.put(text, vector)
            tokens += max(0, raw.tokens)
        return Embeddings(vectors=tuple(found[t] for t in texts), tokens=tokens)

    async def _call(self, batch: list[str], *, urgent: bool) -> RawEmbeddings:
        try:
            return await self._backend.embed(batch, urgent=urgent)
        except EmbedderError:
            raise
        except Exception as exc:  # translated at the boundary; cancellation passes
            raise EmbedderError(f"embedding with {self.model} failed: "
                                f"{type(exc).__name__}: {exc}") from exc


async def probe_dimension(embedder: Embedder, *, configured: int | None,
                          known: int | None) -> int:
    """The dimension to use: the model's own (``known``, else one probe embedding)
    checked against ``configured``.

    Raises :class:`ConfigError` naming ``memory.embedder.dimension`` on a mismatch. A probe
    that fails (provider unreachable) is logged and the configured value (or 0, unknown)
    is used, so an embedding outage at startup does not stop chat.
    """
    actual = known
    if actual is None:
        try:
            raw = await embedder.embed_documents([PROBE_TEXT])
        except EmbedderError as exc:
            log.warning("embedder_probe_failed", model=embedder.model, error=str(exc))
            return configured or 0
        actual = len(raw.vectors[0])
    if configured is not None and configured != actual:
        raise ConfigError(
            f"memory.embedder.dimension is {configured} but model '{embedder.model}' returns "
            f"{actual}-dimensional vectors: set memory.embedder.dimension to {actual} or "
            "choose the model you meant"
        )
    return actual
