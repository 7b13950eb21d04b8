"""The generations of the recall index on Redis, and the corpus an index is built from.

A generation is one counter per namespace (``keys.generation``) that every write of the
namespace's memories moves inside its own MULTI, logging the memories it changed
(:mod:`proxy.backends.redis.changes`); a process's recall index is current while the
counters it was built with are unchanged, and one at older counters is brought up to date
by reading only the memories the log names (docs/design.md#recall-index). Nothing deletes
a counter, so it never returns to a value seen before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import replace

import numpy as np
from redis.asyncio import Redis

from proxy.backends.redis.changes import changed_ids
from proxy.backends.redis.index import MemoryIndex, active_filter, all_of, namespace_filter
from proxy.backends.redis.keys import KeyLayout, user_token
from proxy.backends.redis.memories import MemoryHashes
from proxy.memory.store import Bm25, RecallCorpus

# RediSearch's BM25STD: k1 1.2 and b 0.5 (single-precision constants), IDF
# ln(1 + (N − n + ½)/(n + ½)); a document's length is its ix_terms tokens.
REDIS_BM25 = Bm25(k1=float(np.float32(1.2)), b=0.5, idf_form="plus_one", extra_length=0)
CORPUS_PAGE = 1_000  # index rows per page of a recall corpus read
# Prefetched values waiting for their request's other read (a request that never makes it —
# its recall ended early — leaves one; the oldest go first).
PREFETCH_KEPT = 4_096


class Generations:
    """Read the generation counters of namespaces and their change logs. Raises
    ``RedisError``."""

    def __init__(self, client: Redis, keys: KeyLayout) -> None:
        self._redis = client
        self._keys = keys

    async def read(self, namespaces: Sequence[str]) -> tuple[int, ...]:
        """The counters of ``namespaces`` in order (0 for one never written), one round
        trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for ns in namespaces:
                pipe.get(self._keys.generation(ns))
            values = await pipe.execute()
        return tuple(int(v) if v is not None else 0 for v in values)

    async def read_with(self, key: str, namespaces: Sequence[str]
                        ) -> tuple[bytes | None, tuple[int, ...]]:
        """The STRING at ``key`` and the counters of ``namespaces``, one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(key)
            for ns in namespaces:
                pipe.get(self._keys.generation(ns))
            raw, *values = await pipe.execute()
        return raw, tuple(int(v) if v is not None else 0 for v in values)

    async def changes(self, namespaces: Sequence[str], since: Sequence[int]
                      ) -> tuple[tuple[int, ...], list[set[str]] | None]:
        """The counters of ``namespaces`` now and, per namespace, the ids of the memories
        changed after its counter ``since`` (``None``: the logs cannot tell, read
        everything) — one round trip, the counters read first."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for ns in namespaces:
                pipe.get(self._keys.generation(ns))
            for ns, was in zip(namespaces, since, strict=True):
                pipe.zrangebyscore(self._keys.changes(ns), f"({was}", "+inf",
                                   withscores=True)
            values = await pipe.execute()
        count = len(namespaces)
        now = tuple(int(v) if v is not None else 0 for v in values[:count])
        out: list[set[str]] = []
        for was, at, entries in zip(since, now, values[count:], strict=True):
            ids = changed_ids(entries, since=was, now=at)
            if ids is None:
                return now, None
            out.append(ids)
        return now, out


class Prefetched:
    """A request's first two reads — its profile and its recall generations — in one round
    trip: whichever comes first in the request's read turn fetches both and keeps the
    other's value for that turn (taken once). Both were read after the request began, so a
    write that finished before it is seen (docs/design.md#recall-index). Used from the
    event loop only, inside the turn; raises ``RedisError``."""

    def __init__(self, generations: Generations, keys: KeyLayout,
                 kept: int = PREFETCH_KEPT) -> None:
        self._generations = generations
        self._keys = keys
        self._held: OrderedDict[tuple[Hashable, str, str, str], object] = OrderedDict()
        self._kept = kept

    async def profile(self, turn: Hashable, tenant: str, user: str,
                      namespaces: Sequence[str]) -> bytes | None:
        """The raw profile of (tenant, user): kept for ``turn``, else read now."""
        key = (turn, "profile", tenant, user)
        if key in self._held:
            raw = self._held.pop(key)
            return raw if isinstance(raw, bytes) else None
        raw, values = await self._generations.read_with(
            self._keys.profile(user_token(tenant, user)), namespaces)
        self._keep((turn, "generations", tenant, user), values)
        return raw

    async def generations(self, turn: Hashable, tenant: str, user: str,
                          namespaces: Sequence[str]) -> tuple[int, ...]:
        """The recall generations of (tenant, user): kept for ``turn``, else read now."""
        key = (turn, "generations", tenant, user)
        held = self._held.pop(key, None)
        if isinstance(held, tuple):
            return held
        raw, values = await self._generations.read_with(
            self._keys.profile(user_token(tenant, user)), namespaces)
        self._keep((turn, "profile", tenant, user), raw)
        return values

    def _keep(self, key: tuple[Hashable, str, str, str], value: object) -> None:
        self._held[key] = value
        while len(self._held) > self._kept:
            self._held.popitem(last=False)


async def recall_corpus(generations: Generations, index: MemoryIndex,
                        hashes: MemoryHashes, namespaces: Sequence[str]) -> RecallCorpus:
    """The active memories of ``namespaces`` stamped with their generations, read first:
    the memories read after them are at least that new, so an index stamped with them is
    rebuilt on the next write's generation. Raises ``RedisError``."""
    stamp = await generations.read(namespaces)
    where = all_of(namespace_filter(list(namespaces)), active_filter())
    keys: list[str] = []
    await index.ready()
    while True:
        rows = await index.find(where, offset=len(keys), limit=CORPUS_PAGE, oldest_first=True)
        keys += [r["id"] for r in rows]
        if len(rows) < CORPUS_PAGE:
            break
    memories = await hashes.load(keys)
    return RecallCorpus(stamp, tuple(m for m in memories if m.active), REDIS_BM25,
                        vector_dim=index.vector_dim)


async def refreshed_corpus(generations: Generations, keys: KeyLayout, hashes: MemoryHashes,
                           namespaces: Sequence[str], since: RecallCorpus
                           ) -> RecallCorpus | None:
    """``since`` (a corpus of the same ``namespaces``) brought to their generations now by
    reading only the memories their change logs name after ``since``'s generations: two
    round trips (one when nothing changed). The memories are in the order a whole read
    gives (by id); ``None`` when the logs cannot tell what changed (read everything).
    Raises ``RedisError``."""
    if len(since.generations) != len(namespaces):
        return None
    stamp, changed = await generations.changes(namespaces, since.generations)
    if changed is None:
        return None
    if not any(changed):
        return replace(since, generations=stamp)
    names = [(ns, i) for ns, ids in zip(namespaces, changed, strict=True) for i in sorted(ids)]
    fresh = await hashes.fetch([keys.memory(ns, i) for ns, i in names])
    gone = {i for _, i in names}
    kept = [m for m in since.memories if m.id not in gone]
    kept += [m for m in fresh if m is not None and m.active]
    kept.sort(key=lambda m: m.id)
    return replace(since, generations=stamp, memories=tuple(kept))
