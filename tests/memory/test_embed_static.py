"""Static (model2vec) embeddings: loaded from a directory or from the distillation cache,
never distilled twice for the same source, never inside a request."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from proxy.memory.embed_static import StaticEmbeddings, distilled_dir, is_static_dir
from proxy.memory.embedders import build_embedder
from proxy.settings import ConfigError, EmbedderSettings
from tests.fakes import tiny_static_model

DIM = 8


@pytest.fixture(scope="module")
def tiny_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model2vec model (random 8-d token vectors over MiniLM's word pieces)."""
    folder = tiny_static_model(tmp_path_factory.mktemp("models") / "tiny-m2v", DIM)
    assert is_static_dir(folder)
    return folder


async def test_a_model2vec_directory_is_loaded_as_is(tiny_static: Path) -> None:
    """``model`` naming a model2vec directory loads it: unit vectors of its dimension, a
    query embeds like the same text as a document, and the model id names it."""
    embedder = build_embedder(EmbedderSettings(provider="static", model=str(tiny_static),
                                               cache_size=0))
    assert embedder is not None
    await embedder.start()
    try:
        assert embedder.dimension == DIM
        assert embedder.model == "static/tiny-m2v"
        query = await embedder.embed_query("my dog likes the park")
        documents = await embedder.embed_documents(["my dog likes the park", "tax forms"])
        assert documents.tokens == 0
        assert query == pytest.approx(documents.vectors[0], abs=1e-6)
        assert math.isclose(sum(v * v for v in query), 1.0, rel_tol=1e-6)
        assert documents.vectors[0] != pytest.approx(documents.vectors[1], abs=1e-3)
    finally:
        await embedder.aclose()


async def test_a_large_batch_embeds_like_the_same_texts_one_by_one(
        tiny_static: Path) -> None:
    """An import-sized batch (encoded in a worker thread) gives each text the vector it
    gets alone (encoded on the loop), in order."""
    embedder = build_embedder(EmbedderSettings(provider="static", model=str(tiny_static),
                                               cache_size=0))
    assert embedder is not None
    await embedder.start()
    try:
        texts = [f"fact number {i} about the park" if i % 2 else f"tax form {i}"
                 for i in range(100)]
        batch = await embedder.embed_documents(texts)
        assert len(batch.vectors) == len(texts)
        for index in (0, 1, 57, 99):
            alone = await embedder.embed_documents([texts[index]])
            assert batch.vectors[index] == pytest.approx(alone.vectors[0], abs=1e-6)
        assert batch.vectors[0] != pytest.approx(batch.vectors[1], abs=1e-3)
    finally:
        await embedder.aclose()


async def test_a_distilled_model_in_the_cache_is_reused(tiny_static: Path,
                                                        tmp_path: Path) -> None:
    """The bundled model's static version found in ``cache_dir`` is loaded, not distilled
    again (a distillation would make 256-d vectors; the cached one is 8-d)."""
    target = distilled_dir("", tmp_path)
    assert target.parent == tmp_path
    assert not is_static_dir(target)
    shutil.copytree(tiny_static, target)
    backend = StaticEmbeddings("all-MiniLM-L6-v2", tmp_path)
    assert backend.model == f"static/{target.name}"
    assert await backend.start() == DIM
    raw = await backend.embed(["hello"])
    assert len(raw.rows) == 1
    assert len(raw.rows[0]) == DIM


def test_the_cache_key_follows_the_source_weights(tmp_path: Path) -> None:
    """Another source model (different weight bytes) gets another cache directory, so a
    changed model distils again instead of reusing vectors of the old one."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "modules.json").write_text("[]")
    (source / "model.safetensors").write_bytes(b"one")
    first = distilled_dir(str(source), tmp_path / "cache")
    assert distilled_dir(str(source), tmp_path / "cache") == first
    (source / "model.safetensors").write_bytes(b"two")
    second = distilled_dir(str(source), tmp_path / "cache")
    assert second != first
    assert second.name.startswith("src-")


def test_a_missing_source_model_is_a_config_error(tmp_path: Path) -> None:
    """A ``model`` that is neither the bundled one nor a model directory fails startup
    with a ConfigError naming the setting (nothing is downloaded)."""
    with pytest.raises(ConfigError, match=r"memory\.embedder\.model"):
        StaticEmbeddings(str(tmp_path / "nowhere"), tmp_path)


async def test_embedding_before_start_is_an_embedder_error(tiny_static: Path,
                                                           tmp_path: Path) -> None:
    """A backend not started refuses to embed with EmbedderError (callers degrade)."""
    from proxy.memory.embed import EmbedderError

    backend = StaticEmbeddings(str(tiny_static), tmp_path)
    with pytest.raises(EmbedderError):
        await backend.embed(["hello"])
