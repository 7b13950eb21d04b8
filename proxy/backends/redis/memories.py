"""Memory hashes on Redis, read and written by key: fetch and decode, queue an upsert into
a caller's transaction, and keep stored vectors in step with the embedder (the scan and
the writes of ``memory-proxy reindex``).

Errors are the caller's to translate (the store turns every ``redis`` failure into
:class:`~proxy.memory.store.StoreUnavailableError`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson
import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.changes import ChangeLog
from proxy.backends.redis.client import multi, transact
from proxy.backends.redis.codec import (
    EMBEDDING_FIELD_PREFIX,
    VECTOR_MODEL_FIELD,
    embedding_field,
    memory_from_hash,
    memory_to_hash,
    terms_field,
)
from proxy.backends.redis.keys import KeyLayout, namespace_token
from proxy.memory.records import Memory
from proxy.memory.store import VectorUpdate
from proxy.memory.text import TERMS_VERSION, load_segmenter_for

log = structlog.get_logger("proxy.memory.redis")

# access_count += n only if the memory still exists: a bare HINCRBY on a memory deleted
# meanwhile would create a stray hash that no registry lists.
_RECORD_ACCESS_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'access_count', ARGV[1])
  redis.call('HSET', KEYS[1], 'last_access_at', ARGV[2])
  return 1
end
return 0
"""


def as_text(value: bytes | str) -> str:
    """A value as redis-py returns it (bytes on this client), decoded."""
    return value.decode() if isinstance(value, bytes) else value


def opt_text(value: bytes | str | None) -> str | None:
    """:func:`as_text`, ``None`` kept."""
    return None if value is None else as_text(value)


async def terms_ready(memories: Sequence[Memory]) -> None:
    """Indexing segments CJK text: load the dictionary off the event loop first."""
    await load_segmenter_for(*(f"{m.title}\n{m.content}\n{' '.join(m.tags)}"
                               for m in memories))


class MemoryHashes:
    """The memory hashes under one key layout."""

    def __init__(self, client: Redis, layout: KeyLayout) -> None:
        self._redis = client
        self._keys = layout
        self._touch = client.register_script(_RECORD_ACCESS_LUA)
        self.changes = ChangeLog(client, layout)

    async def fetch(self, keys: Sequence[str]) -> list[Memory | None]:
        """The memories at ``keys``, aligned with them; ``None`` where a key was deleted
        meanwhile (or holds no readable memory — logged)."""
        if not keys:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(key)
            raw: list[dict[bytes | str, bytes | str]] = await pipe.execute()
        out: list[Memory | None] = []
        for key, data in zip(keys, raw, strict=True):
            memory = None
            if data:
                try:
                    memory = memory_from_hash(data)
                except (ValueError, KeyError) as exc:
                    log.warning("redis_memory_unreadable", key=key, error=str(exc))
            out.append(memory)
        return out

    async def load(self, keys: Sequence[str]) -> list[Memory]:
        """The readable memories at ``keys``, in their order, missing ones left out."""
        return [m for m in await self.fetch(keys) if m is not None]

    def queue_upsert(self, pipe: Pipeline, memory: Memory, *, log: bool = True) -> None:
        """Queue on ``pipe`` the write of ``memory`` as a whole record, registered in its
        namespace's id set, with its generation move (``log``; ``False``: the caller
        queues one for all its memories, :attr:`changes`)."""
        ns = namespace_token(memory.tenant, memory.user_id)
        key = self._keys.memory(ns, memory.id)
        pipe.delete(key)  # replaces the whole record: no stale optional or vector field
        pipe.hset(key, mapping=memory_to_hash(memory))  # type: ignore[arg-type]
        pipe.sadd(self._keys.ids(ns), memory.id)
        if log:
            self.changes.queue(pipe, ns, [memory.id])

    async def record_access(self, counts: Sequence[tuple[str, int]], stamp: str) -> None:
        """Add each ``(key, n)``'s ``n`` to the memory's ``access_count`` and set its
        ``last_access_at`` to ``stamp``, skipping memories deleted meanwhile."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, n in counts:
                await self._touch(keys=[key], args=[n, stamp], client=pipe)
            await pipe.execute()

    # vectors kept consistent with the embedder (memory-proxy reindex) -------------------
    async def stale_vectors(self, model: str, *, limit: int,
                            cursor: str) -> tuple[list[Memory], str]:
        """One ``SCAN`` step (about ``limit`` keys from ``cursor``) over every memory hash:
        the active memories among them without a vector of ``model``, by id, and the
        cursor of the next step (``""`` at the end)."""
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in self._keys.prefix)
        following, keys = await self._redis.scan(
            int(cursor) if cursor.isdigit() else 0, match=f"{pattern}:m:*",
            count=max(1, limit), _type="HASH")
        memories = await self.load([as_text(k) for k in keys])
        stale = [m for m in memories if m.active and (
            m.embedding is None or m.embedding_model != model)]
        return sorted(stale, key=lambda m: m.id), "" if int(following) == 0 else str(following)

    async def set_vector(self, u: VectorUpdate) -> int:
        """Store ``u``'s vector (dropping vectors of other dimensions) if the memory still
        holds the content it was computed from; 1 when written, else 0."""
        key = self._keys.memory(namespace_token(u.tenant, u.user_id), u.memory_id)
        field = embedding_field(len(u.embedding))
        vector = np.asarray(u.embedding, np.float32).tobytes()

        async def body(pipe: Pipeline) -> int:
            current = await pipe.hmget(key, ["content"])
            if current[0] is None or as_text(current[0]) != u.content:
                return 0
            names = [as_text(n) for n in await pipe.hkeys(key)]
            multi(pipe)
            others = [n for n in names if n.startswith(EMBEDDING_FIELD_PREFIX)
                      and n != field]
            if others:
                pipe.hdel(key, *others)
            pipe.hset(key, mapping={field: vector, VECTOR_MODEL_FIELD: u.model})
            self.changes.queue(pipe, namespace_token(u.tenant, u.user_id), [u.memory_id])
            await pipe.execute()
            return 1

        return await transact(self._redis, [key], body)


# ix_terms := ARGV[2] only while it still is ARGV[1]: a memory rewritten meanwhile (by this
# code: already the new terms; or retired: no terms) is left as its writer left it.
_RETERM_LUA = """
if redis.call('HGET', KEYS[1], 'ix_terms') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'ix_terms', ARGV[2])
  return 1
end
return 0
"""
RETERM_SCAN_COUNT = 500  # keys per SCAN step of the re-terming pass


def terms_version_key(layout: KeyLayout) -> str:
    """The string key holding the terms rule (:data:`~proxy.memory.text.TERMS_VERSION`)
    that every memory's ``ix_terms`` was last written with; absent before the first pass."""
    return f"{layout.prefix}:terms_version"


async def reterm_documents(client: Redis, layout: KeyLayout) -> int:
    """Bring every active memory's ``ix_terms`` to today's terms rule, once per key prefix:
    when :func:`terms_version_key` holds an older rule (or none), one ``SCAN`` pass over the
    memory hashes recomputes every active memory's terms (:func:`terms_field`), writes
    those that changed with a compare-and-set, then records the rule. RediSearch
    re-indexes each rewritten hash by itself. A start that dies mid-pass leaves the marker
    old, so the next start runs the pass again. Returns how many hashes were rewritten."""
    marker = terms_version_key(layout)
    if as_text(await client.get(marker) or b"") == str(TERMS_VERSION):
        return 0
    script = client.register_script(_RETERM_LUA)
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in layout.prefix)
    cursor, changed = 0, 0
    while True:
        cursor, keys = await client.scan(cursor, match=f"{pattern}:m:*",
                                         count=RETERM_SCAN_COUNT, _type="HASH")
        async with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, ["title", "content", "tags", "ix_terms"])
            found = await pipe.execute() if keys else []
        for key, (raw_title, raw_content, tags, old) in zip(keys, found, strict=True):
            if old is None or raw_title is None or raw_content is None:
                continue
            title, content = as_text(raw_title), as_text(raw_content)
            names = orjson.loads(tags) if tags else []
            await load_segmenter_for(title, content, *names)
            new = terms_field(title, content, names)
            if new != as_text(old):
                changed += int(await script(keys=[key], args=[old, new]))
        if int(cursor) == 0:
            break
    await client.set(marker, str(TERMS_VERSION))
    if changed:
        log.info("redis_memories_retermed", count=changed, terms_version=TERMS_VERSION)
    return changed
