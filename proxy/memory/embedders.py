"""``memory.embedder`` → an :class:`~proxy.memory.embed.Embedder` (or none).

Provider modules are imported here only for the provider configured, so that with
``provider: none`` (the default) neither torch, sentence-transformers, model2vec nor
litellm is imported at all.
"""

from __future__ import annotations

from proxy.memory.embed import CachedEmbedder, EmbeddingBackend
from proxy.settings import EmbedderSettings


def build_embedder(settings: EmbedderSettings) -> CachedEmbedder | None:
    """The configured embedder, not yet started (``await embedder.start()`` loads the model
    and checks the dimension), or ``None`` for ``provider: none``.

    Raises :class:`~proxy.settings.ConfigError` when the local model cannot be found.
    """
    backend: EmbeddingBackend
    if settings.provider == "none":
        return None
    if settings.provider == "local":
        from proxy.memory.embed_local import LocalEmbeddings

        backend = LocalEmbeddings(settings.model)
    elif settings.provider == "static":
        from proxy.memory.embed_static import StaticEmbeddings

        backend = StaticEmbeddings(settings.model, settings.cache_dir)
    else:
        from proxy.upstream.litellm_adapter import LiteLLMEmbeddings

        backend = LiteLLMEmbeddings(
            model=settings.model, api_base=settings.api_base,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            api_version=settings.api_version, timeout=settings.timeout_seconds,
        )
    return CachedEmbedder(backend, dimension=settings.dimension,
                          batch_size=settings.batch_size, cache_size=settings.cache_size)
