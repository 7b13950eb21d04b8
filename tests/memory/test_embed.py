"""The embedder wrapper: batching, the text-hash LRU cache, dimension checks, failures."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import pytest

from proxy.memory.embed import (
    CachedEmbedder,
    EmbedderError,
    EmbeddingCache,
    RawEmbeddings,
    cosine,
    normalized,
)
from proxy.memory.embed_local import PriorityWorker
from proxy.settings import ConfigError
from tests.fakes import ConceptBackend

CONCEPTS = [["dog", "puppy", "canine"], ["tea", "chai"]]


class RowsBackend:
    """A backend that answers with fixed rows (to feed the wrapper bad output)."""

    model = "rows"

    def __init__(self, rows: list[list[float]], known: int | None = None) -> None:
        self.rows = rows
        self.known = known

    async def start(self) -> int | None:
        return self.known

    async def aclose(self) -> None:
        return None

    async def embed(self, texts: Sequence[str], *, urgent: bool = False) -> RawEmbeddings:
        return RawEmbeddings(rows=self.rows[: len(texts)] if len(self.rows) > 1 else self.rows,
                             tokens=1)


async def test_vectors_are_unit_length_and_in_input_order() -> None:
    """Each text gets its own normalised vector, in the order the texts were given."""
    backend = ConceptBackend(CONCEPTS)
    embedder = CachedEmbedder(backend)
    result = await embedder.embed_documents(["chai please", "my puppy", "chai please"])
    assert len(result.vectors) == 3
    for vector in result.vectors:
        assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-9)
    assert result.vectors[0] == result.vectors[2]
    assert cosine(result.vectors[1], (await embedder.embed_query("a canine"))) > 0.9
    assert cosine(result.vectors[0], result.vectors[1]) < 0.2


async def test_documents_go_to_the_model_in_batches() -> None:
    """Texts are sent ``batch_size`` at a time, duplicates once."""
    backend = ConceptBackend(CONCEPTS)
    embedder = CachedEmbedder(backend, batch_size=2)
    await embedder.embed_documents(["a", "b", "c", "a", "d", "e"])
    assert [len(call) for call in backend.calls] == [2, 2, 1]


async def test_queries_are_urgent_and_documents_are_not() -> None:
    """Hot-path queries ask the model for priority; writes do not."""
    backend = ConceptBackend(CONCEPTS)
    embedder = CachedEmbedder(backend)
    await embedder.embed_documents(["my dog"])
    await embedder.embed_queries(["green tea", "a puppy"])
    await embedder.embed_query("chai")
    assert backend.urgent == [False, True, True]


async def test_cached_texts_cost_no_call_and_no_tokens() -> None:
    """A text seen before is served from the cache: no model call, zero tokens."""
    backend = ConceptBackend(CONCEPTS, tokens_per_text=5)
    embedder = CachedEmbedder(backend, cache_size=10)
    first = await embedder.embed_documents(["my dog", "green tea"])
    assert first.tokens == 10
    again = await embedder.embed_documents(["green tea", "my dog"])
    assert again.tokens == 0
    assert len(backend.calls) == 1
    assert again.vectors == (first.vectors[1], first.vectors[0])


async def test_cache_off_calls_the_model_every_time() -> None:
    """``cache_size`` 0 disables the cache."""
    backend = ConceptBackend(CONCEPTS)
    embedder = CachedEmbedder(backend, cache_size=0)
    await embedder.embed_query("my dog")
    await embedder.embed_query("my dog")
    assert len(backend.calls) == 2


def test_cache_evicts_the_least_recently_used_text() -> None:
    """The cache holds at most ``maxsize`` texts and drops the one unused the longest."""
    cache = EmbeddingCache(2)
    cache.put("a", (1.0,))
    cache.put("b", (2.0,))
    assert cache.get("a") == (1.0,)  # "a" is now the most recent
    cache.put("c", (3.0,))
    assert cache.get("b") is None
    assert cache.get("a") == (1.0,)
    assert cache.get("c") == (3.0,)
    assert len(cache) == 2


async def test_a_vector_of_the_wrong_length_is_an_error() -> None:
    """A model answering with another dimension than configured raises EmbedderError."""
    embedder = CachedEmbedder(RowsBackend([[1.0, 0.0, 0.0]]), dimension=4)
    with pytest.raises(EmbedderError, match=r"3 dimensions, expected 4"):
        await embedder.embed_query("x")


@pytest.mark.parametrize(("rows", "message"), [
    ([[0.0, 0.0]], "zero"),
    ([[float("nan"), 1.0]], "non-finite"),
    ([], "0 vectors for 1 texts"),
])
async def test_unusable_model_output_is_an_error(rows: list[list[float]], message: str) -> None:
    """Zero, non-finite or missing vectors raise EmbedderError instead of being stored."""
    embedder = CachedEmbedder(RowsBackend(rows))
    with pytest.raises(EmbedderError, match=message):
        await embedder.embed_query("x")


async def test_a_failing_model_raises_embedder_error_with_the_cause() -> None:
    """Any exception of the provider leaves as EmbedderError, chained to the original."""
    embedder = CachedEmbedder(ConceptBackend(CONCEPTS, fail=RuntimeError("connection reset")))
    with pytest.raises(EmbedderError, match="connection reset") as caught:
        await embedder.embed_documents(["x"])
    assert isinstance(caught.value.__cause__, RuntimeError)


async def test_blank_text_is_refused() -> None:
    """Embedding an empty or blank text is a programming error, not a model call."""
    backend = ConceptBackend(CONCEPTS)
    with pytest.raises(ValueError, match="empty"):
        await CachedEmbedder(backend).embed_documents(["ok", "  "])
    assert backend.calls == []


async def test_startup_rejects_a_configured_dimension_the_model_does_not_have() -> None:
    """A configured dimension that differs from the model's fails startup, naming the
    setting and the model's real dimension."""
    backend = ConceptBackend(CONCEPTS)  # 18 dimensions, learned by a probe call
    embedder = CachedEmbedder(backend, dimension=384)
    with pytest.raises(ConfigError, match=r"memory\.embedder\.dimension is 384.* returns 18"):
        await embedder.start()


async def test_startup_checks_a_model_that_knows_its_dimension_without_a_call() -> None:
    """A backend that reports its dimension (a local model) is checked without a probe."""
    backend = ConceptBackend(CONCEPTS, dimension=18)
    embedder = CachedEmbedder(backend, dimension=18)
    await embedder.start()
    assert embedder.dimension == 18
    assert backend.calls == []
    with pytest.raises(ConfigError, match="dimension"):
        await CachedEmbedder(ConceptBackend(CONCEPTS, dimension=18), dimension=17).start()


async def test_startup_learns_the_dimension_when_none_is_configured() -> None:
    """Without a configured dimension, the probe's vector length is adopted."""
    embedder = CachedEmbedder(ConceptBackend(CONCEPTS))
    await embedder.start()
    assert embedder.dimension == 18


async def test_an_unreachable_provider_at_startup_does_not_stop_the_gateway() -> None:
    """A probe that fails is logged; the configured dimension stays and is still enforced."""
    backend = ConceptBackend(CONCEPTS, fail=RuntimeError("down"))
    embedder = CachedEmbedder(backend, dimension=18)
    await embedder.start()
    assert embedder.dimension == 18
    backend.fail = None
    assert len(await embedder.embed_query("dog")) == 18


@pytest.mark.parametrize(("a", "b", "expected"), [
    ((1.0, 0.0), (1.0, 0.0), 1.0),
    ((1.0, 0.0), (0.0, 2.0), 0.0),
    ((1.0, 1.0), (-1.0, -1.0), -1.0),
    ((1.0, 0.0), (1.0, 0.0, 0.0), 0.0),  # lengths differ
    ((0.0, 0.0), (1.0, 0.0), 0.0),  # zero vector
    ((), (), 0.0),
])
def test_cosine(a: tuple[float, ...], b: tuple[float, ...], expected: float) -> None:
    """Cosine similarity, 0.0 for vectors that cannot be compared."""
    assert math.isclose(cosine(a, b), expected, abs_tol=1e-12)


def test_normalized_scales_to_unit_length() -> None:
    """``normalized`` keeps the direction and makes the length 1."""
    assert normalized([3.0, 4.0], dimension=2) == pytest.approx((0.6, 0.8))


def test_urgent_jobs_jump_the_queue_and_cancelled_ones_are_skipped() -> None:
    """The local model's worker runs queued queries before queued documents, and drops a
    job whose caller gave up before it started."""
    worker = PriorityWorker("test-embedder")
    gate = threading.Event()
    ran: list[str] = []
    blocker = worker.submit(gate.wait)
    document = worker.submit(lambda: ran.append("document"))
    abandoned = worker.submit(lambda: ran.append("abandoned"))
    query = worker.submit(lambda: ran.append("query"), urgent=True)
    assert abandoned.cancel()
    gate.set()
    for future in (blocker, document, query):
        future.result(timeout=5)
    worker.shutdown()
    assert ran == ["query", "document"]
