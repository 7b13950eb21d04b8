"""Fixtures shared by the memory tests: the store contract over both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.store import MemoryStore

# Vector width of the contract tests' hand-made embeddings.
DIM = 4


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    """A fresh store on SQLite, then on a real Redis (vectors of :data:`DIM`)."""
    if request.param == "sqlite":
        async with SqliteDatabase(tmp_path / "memory.db") as db:
            yield SqliteMemoryStore(db)
        return
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.store import RedisMemoryStore

    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    async with connect(url) as client:
        redis_store = RedisMemoryStore(client, key_prefix=prefix, vector_dim=DIM)
        await redis_store.prepare()
        yield redis_store
