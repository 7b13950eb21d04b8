"""The generations of the recall index on Redis, and the corpus an index is built from.

A generation is one counter per namespace (``keys.generation``) that every write of the
namespace's memories INCRs inside its own MULTI (``apply``, ``memories``, ``erasure``);
a process's recall index is current while the counters it was built with are unchanged
(docs/design.md#recall-index). Nothing deletes a counter, so it never returns to a value
seen before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from redis.asyncio import Redis

from proxy.backends.redis.index import MemoryIndex, active_filter, all_of, namespace_filter
from proxy.backends.redis.keys import KeyLayout
from proxy.backends.redis.memories import MemoryHashes
from proxy.memory.store import Bm25, RecallCorpus

# RediSearch's BM25STD: k1 1.2 and b 0.5 (single-precision constants), IDF
# ln(1 + (N − n + ½)/(n + ½)); a document's length is its ix_terms tokens.
REDIS_BM25 = Bm25(k1=float(np.float32(1.2)), b=0.5, idf_form="plus_one", extra_length=0)
CORPUS_PAGE = 1_000  # index rows per page of a recall corpus read


class Generations:
    """Read and move the generation counters of namespaces. Raises ``RedisError``."""

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

    async def bump(self, *namespaces: str) -> None:
        """INCR each of ``namespaces`` in one MULTI."""
        async with self._redis.pipeline(transaction=True) as pipe:
            for ns in namespaces:
                pipe.incr(self._keys.generation(ns))
            await pipe.execute()


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
