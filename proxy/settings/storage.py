"""``storage``: where memories (and, with Redis, the learning queue) live."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from proxy.settings.base import ENV_REFERENCE, Section, resolve_env_reference

REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")
# Vector dimensions RediSearch accepts for FLOAT32 HNSW fields (1..32768).
MAX_VECTOR_DIM = 32_768


class StorageSettings(Section):
    """Where memories live.

    - ``backend: sqlite`` (default): one local file, ``path``; no server.
    - ``backend: redis``: Redis 8 / Redis Stack with the Query Engine at ``url``
      (``redis://``, ``rediss://`` or ``unix://``; a secret, so usually
      ``os.environ/NAME``). Keys start with ``key_prefix``; ``vector_dim`` is the
      embedder's dimension (``None``: no vector index). The learning queue lives there
      too (Redis Streams, :mod:`proxy.backends.redis.queue`): gateways and workers
      sharing the Redis share the queue. ``path`` is not used.
      ``redis_max_connections`` sizes the process's connection pool: a chat holds one
      connection at a time, so it is the number of chats one process serves at once
      without waiting for a connection (the learning worker and usage flushes share it).
      A command that finds the pool full waits up to half of ``memory.recall_timeout_ms``
      for a free connection (:mod:`proxy.backends.redis.client`).
    """

    backend: Literal["sqlite", "redis"] = "sqlite"
    path: Path = Path("data/memory-proxy.db")
    url: SecretStr | None = None
    key_prefix: str = Field(default="mp", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    vector_dim: int | None = Field(default=None, ge=1, le=MAX_VECTOR_DIM)
    # Seconds between keyword-index upkeep runs of the gateway (SQLite: FTS5 segment merge;
    # Redis: nothing — the Query Engine compacts its own index). The first run is at start.
    index_maintenance_seconds: float = Field(default=3600.0, gt=0)
    # Erased text leaves the database files within this long (docs/design.md#erasure):
    # SQLite runs at most one keyword-index merge (FTS5 'optimize') per period, Redis at
    # most one AOF rewrite (BGREWRITEAOF). At most an hour.
    erasure_purge_seconds: float = Field(default=600.0, gt=0, le=3600)
    # Redis connections per process. 64: the concurrent chats one process on 2 cores
    # serves (its throughput is bound by the CPU well before that), plus the learning
    # worker's and the usage flushes' few.
    redis_max_connections: int = Field(default=64, ge=2, le=10_000)

    @field_validator("url", mode="before")
    @classmethod
    def _url_from_env(cls, value: Any) -> Any:
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if not isinstance(value, str) or not value.startswith(ENV_REFERENCE):
            return value
        resolved = resolve_env_reference(value, setting="storage.url")
        if resolved is None:
            raise ValueError(f"storage.url: environment variable "
                             f"{value.removeprefix(ENV_REFERENCE)} is not set")
        return resolved

    @field_validator("url")
    @classmethod
    def _url_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        url = value.get_secret_value()
        if not url.startswith(REDIS_URL_SCHEMES):
            raise ValueError("storage.url must start with " + ", ".join(REDIS_URL_SCHEMES)
                             + " (e.g. redis://localhost:6379/0)")
        if parse_qs(urlsplit(url).query).get("protocol", ["2"])[-1] != "2":
            raise ValueError("storage.url: the Redis store speaks RESP2 (RedisVL parses "
                             "RESP2 search replies); remove the protocol parameter")
        return value

    @model_validator(mode="after")
    def _backend_needs(self) -> StorageSettings:
        if self.backend == "redis" and self.url is None:
            raise ValueError("storage.backend is redis but storage.url is not set "
                             "(e.g. url: os.environ/REDIS_URL)")
        if self.backend == "sqlite" and self.url is not None:
            raise ValueError("storage.url is set but storage.backend is sqlite; set "
                             "storage.backend: redis or remove storage.url")
        return self
