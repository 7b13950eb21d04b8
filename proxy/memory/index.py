"""The in-process recall index: one per (tenant, user), reused while the store's
generations of its owners are unchanged (docs/design.md#recall-index).

A :class:`UserIndex` holds what chat recall searches — the user's active memories plus the
tenant's shared and the system ones (:class:`~proxy.memory.store.RecallCorpus`) — as

- **keyword postings** with the corpus's own BM25 statistics (document count, lengths,
  document frequency per term), over exactly the terms the backends index
  (:func:`proxy.memory.text.index_terms` of title, content and tags, as
  :func:`proxy.memory.text.stemmed_terms`); the scorer's constants are the store's
  (:class:`~proxy.memory.store.Bm25`), so on a corpus that is the store's whole keyword
  index the index ranks exactly as the store's own search;
- a **float32 vector matrix** per dimension with the rows' norms: brute-force cosine, as
  the SQLite store computes it.

:meth:`UserIndex.search` answers a :class:`~proxy.memory.store.SearchQuery` with the
candidates :meth:`~proxy.memory.store.MemoryStore.search` would return (same ranks and
scores; channel and model filters applied), without a store read or a thread hop.

:class:`RecallIndexes` keeps the indexes of recent users, least recently used first out
beyond ``memory.recall_index_bytes`` (:data:`DEFAULT_INDEX_BYTES`); an entry is used only
while the generations the store reports for its owners are the ones it was built at.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from proxy.memory.records import Memory
from proxy.memory.store import Candidate, RecallCorpus, SearchQuery
from proxy.memory.text import has_cjk, index_terms, stemmed_terms
from proxy.memory.titles import indexed_text

# Bytes of all indexes of one process. Measured (tracemalloc, bench/gateway's 500
# memories of ~53 characters; the memories' decoded objects included): ~0.6 MB a user with
# keyword terms only, ~5.2 MB with 256-d vectors, ~7.4 MB with 384-d ones (the vectors'
# Python float tuples, which ranking reads, are most of it) — so 256 MiB keeps ~400
# keyword-only or ~35–50 users with vectors warm; the others are rebuilt on their return.
DEFAULT_INDEX_BYTES = 256 << 20
# Estimated Python overhead per memory object and per posting list (bytes), for the bound.
_MEMORY_OVERHEAD = 900
_POSTING_OVERHEAD = 180

Scores = npt.NDArray[np.float64]
Key = tuple[str, str]


def memory_terms(memory: Memory) -> list[str]:
    """The keyword terms the stores index for ``memory``
    (:func:`~proxy.memory.titles.indexed_text`: title, content, tags)."""
    text = indexed_text(memory.title, memory.content, memory.tags)
    return stemmed_terms(index_terms(text)).split()


@lru_cache(maxsize=4096)
def query_stems(terms: tuple[str, ...]) -> tuple[str, ...]:
    """The index terms a query's ``terms`` look up (:func:`~proxy.memory.text.
    stemmed_terms`), memoised: a conversation's queries come back turn after turn."""
    return tuple(stemmed_terms(" ".join(terms)).split())


@dataclass(frozen=True, slots=True)
class _Vectors:
    """The float32 vectors of one dimension: corpus rows, matrix, norms."""

    rows: npt.NDArray[np.intp]
    matrix: npt.NDArray[np.float32]
    norms: npt.NDArray[np.float32]


class UserIndex:
    """The recall index of one (tenant, user) at ``generations`` (see module docstring).
    Built from a :class:`~proxy.memory.store.RecallCorpus` (CPU: ~10 ms for 500 memories,
    the term extraction; run it off the loop). ``previous``: an index this one replaces;
    the terms of the memories both corpora hold (the same objects) are taken from it."""

    def __init__(self, corpus: RecallCorpus, previous: UserIndex | None = None) -> None:
        self.corpus = corpus  # what the next refresh starts from (store.recall_corpus)
        self.generations = corpus.generations
        self.memories: list[Memory] = [m for m in corpus.memories if m.active]
        self.bm25 = corpus.bm25
        size = len(self.memories)
        self.personal = np.array([m.user_id is not None for m in self.memories], dtype=bool)
        self.channels = [m.source_channel for m in self.memories]
        # Whether a memory holds CJK (ranking's near-duplicate check then needs jieba).
        self.cjk = any(has_cjk(m.content) for m in self.memories)
        counts: dict[str, dict[int, int]] = {}
        lengths = np.zeros(size, dtype=np.float64)
        known = {} if previous is None else previous.terms
        self.terms: dict[str, tuple[Memory, list[str]]] = {}
        for row, memory in enumerate(self.memories):
            held = known.get(memory.id)
            terms = held[1] if held is not None and held[0] is memory else \
                memory_terms(memory)
            self.terms[memory.id] = (memory, terms)
            lengths[row] = len(terms) + corpus.bm25.extra_length
            for term in terms:
                posting = counts.setdefault(term, {})
                posting[row] = posting.get(row, 0) + 1
        self.postings = self._weights(counts, lengths, corpus)
        self.vectors = self._vectors(corpus.vector_dim)
        self._models: dict[tuple[int, str], npt.NDArray[np.bool_]] = {}
        # The user's own memories about themselves, most evidence then most recent first.
        self._resident = sorted(
            (r for r, m in enumerate(self.memories) if m.user_id is not None and m.about_user),
            key=lambda r: (-self.memories[r].hits, -self.memories[r].last_seen_at.timestamp()))
        self.nbytes = self._estimate()

    def _weights(self, counts: dict[str, dict[int, int]], lengths: Scores,
                 corpus: RecallCorpus) -> dict[str, tuple[npt.NDArray[np.intp], Scores]]:
        """Per term: its rows and each row's BM25 part (idf × saturated tf), as the
        store's scorer computes it (:class:`~proxy.memory.store.Bm25`), over the store's
        statistics when it gives them, else the corpus's own."""
        size = len(lengths)
        if not size:
            return {}
        bm25, stats = corpus.bm25, corpus.statistics
        documents = stats.documents if stats and stats.documents else size
        total = float(stats.total_length) if stats and stats.documents else \
            float(lengths.sum())
        average = total / documents
        norm = bm25.k1 * (1.0 - bm25.b + bm25.b * lengths / (average or 1.0))
        out: dict[str, tuple[npt.NDArray[np.intp], Scores]] = {}
        for term, posting in counts.items():
            rows = np.fromiter(posting.keys(), dtype=np.intp, count=len(posting))
            tf = np.fromiter(posting.values(), dtype=np.float64, count=len(posting))
            matching = stats.frequencies.get(term, len(posting)) if stats else len(posting)
            out[term] = (rows, bm25.idf(documents, matching) * tf * (bm25.k1 + 1.0)
                         / (tf + norm[rows]))
        return out

    def _vectors(self, dimension: int | None) -> dict[int, _Vectors]:
        by_dim: dict[int, list[int]] = {}
        for row, memory in enumerate(self.memories):
            if memory.embedding:
                length = len(memory.embedding)
                if dimension is None or length == dimension:
                    by_dim.setdefault(length, []).append(row)
        out: dict[int, _Vectors] = {}
        for length, rows in by_dim.items():
            matrix = np.array([self.memories[r].embedding for r in rows], dtype=np.float32)
            out[length] = _Vectors(np.asarray(rows, dtype=np.intp), matrix,
                                   np.linalg.norm(matrix, axis=1))
        return out

    def _estimate(self) -> int:
        """Approximate bytes held (arrays exactly; Python objects estimated)."""
        total = sum(rows.nbytes + weights.nbytes + _POSTING_OVERHEAD + len(term) * 2
                    for term, (rows, weights) in self.postings.items())
        total += sum(v.matrix.nbytes + v.norms.nbytes + v.rows.nbytes
                     for v in self.vectors.values())
        for memory in self.memories:
            total += _MEMORY_OVERHEAD + sys.getsizeof(memory.content) + \
                sys.getsizeof(memory.title) + 8 * len(self.terms[memory.id][1])
            if memory.embedding:  # the tuple and its float objects
                total += 32 * len(memory.embedding) + 56
        return total

    def _visible(self, channels: tuple[str | None, ...] | None) -> npt.NDArray[np.bool_]:
        """Rows visible in ``channels`` (the stores' channel rule,
        docs/design.md#group-chats): every row in private (``None``); in a group the
        shared and system rows and the personal ones learned in that group."""
        if channels is None:
            return np.ones(len(self.memories), dtype=bool)
        named = {c for c in channels if c is not None}
        learned_here = np.array([c in named for c in self.channels], dtype=bool) \
            if named else np.zeros(len(self.memories), dtype=bool)
        out: npt.NDArray[np.bool_] = ~self.personal | learned_here
        return out

    def keyword(self, terms: Sequence[str], *, limit: int,
                channels: tuple[str | None, ...] | None) -> list[tuple[int, float]]:
        """``(row, BM25)`` of the best ``limit`` rows matching any of ``terms``, best
        first (ties: corpus order). A query term that stems like another counts twice,
        as in both stores."""
        size = len(self.memories)
        if not terms or not size or limit <= 0:
            return []
        scores = np.zeros(size)
        matched = np.zeros(size, dtype=bool)
        for stem in query_stems(tuple(terms)):
            found = self.postings.get(stem)
            if found is not None:
                scores[found[0]] += found[1]
                matched[found[0]] = True
        if channels is not None:
            matched &= self._visible(channels)
        rows = np.flatnonzero(matched)
        if not len(rows):
            return []
        order = rows[np.argsort(-scores[rows], kind="stable")[:limit]]
        return list(zip(order.tolist(), scores[order].tolist(), strict=True))

    def _of_model(self, dimension: int, found: _Vectors, model: str
                  ) -> npt.NDArray[np.bool_]:
        """Rows of ``found`` with a vector of ``model`` or of no recorded model
        (computed once per dimension and model)."""
        key = (dimension, model)
        mask = self._models.get(key)
        if mask is None:
            mask = np.array([self.memories[r].embedding_model in (None, model)
                             for r in found.rows], dtype=bool)
            self._models[key] = mask
        return mask

    def nearest(self, vector: Sequence[float], *, limit: int, model: str | None,
                channels: tuple[str | None, ...] | None) -> list[tuple[int, float]]:
        """``(row, cosine)`` of the ``limit`` rows nearest ``vector`` among those with a
        vector of its length and of ``model`` (or of no recorded model), best first."""
        found = self.vectors.get(len(vector))
        if found is None or limit <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32)
        keep = np.ones(len(found.rows), dtype=bool)
        if model is not None:
            keep &= self._of_model(len(vector), found, model)
        if channels is not None:
            keep &= self._visible(channels)[found.rows]
        norms = found.norms * (np.linalg.norm(query) or 1.0)
        sims = (found.matrix @ query) / np.where(norms == 0, 1.0, norms)
        candidates = np.flatnonzero(keep)
        order = candidates[np.argsort(-sims[candidates], kind="stable")[:limit]]
        return list(zip(found.rows[order].tolist(), sims[order].tolist(), strict=True))

    def resident(self, *, limit: int, channels: tuple[str | None, ...] | None
                 ) -> list[Memory]:
        """What :meth:`~proxy.memory.store.MemoryStore.resident` returns: the user's top
        ``limit`` active memories about themselves visible in ``channels``, by hits then
        ``last_seen_at``, descending (ties: corpus order)."""
        if limit <= 0:
            return []
        if channels is None:
            return [self.memories[r] for r in self._resident[:limit]]
        visible = self._visible(channels)
        return [self.memories[r] for r in self._resident if visible[r]][:limit]

    def search(self, query: SearchQuery) -> list[Candidate]:
        """What :meth:`~proxy.memory.store.MemoryStore.search` returns for ``query``
        (``include_shared`` queries only: the corpus holds shared memories)."""
        memories = self.memories
        keyword = self.keyword(query.terms, limit=query.limit, channels=query.channels)
        if query.embedding is None:  # rows are distinct: no merge
            return [Candidate(memories[row], rank, score)
                    for rank, (row, score) in enumerate(keyword, start=1)]
        found: dict[int, Candidate] = {
            row: Candidate(memories[row], rank, score)
            for rank, (row, score) in enumerate(keyword, start=1)}
        hits = self.nearest(query.embedding, limit=query.limit,
                            model=query.embedding_model, channels=query.channels)
        for rank, (row, cosine) in enumerate(hits, start=1):
            previous = found.get(row)
            found[row] = Candidate(
                self.memories[row],
                keyword_rank=previous.keyword_rank if previous else None,
                keyword_score=previous.keyword_score if previous else None,
                vector_rank=rank, vector_score=cosine)
        return list(found.values())


class RecallIndexes:
    """The :class:`UserIndex` of recent users, bounded by ``capacity_bytes`` (least
    recently used first out; an index larger than the bound is not kept). Used from the
    event loop only."""

    def __init__(self, capacity_bytes: int = DEFAULT_INDEX_BYTES) -> None:
        self._entries: OrderedDict[Key, UserIndex] = OrderedDict()
        self.nbytes = 0
        self.capacity = capacity_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key, generations: tuple[int, ...]) -> UserIndex | None:
        """The index of ``key`` if it was built at ``generations``, else ``None``."""
        found = self._entries.get(key)
        if found is None or found.generations != generations:
            return None
        self._entries.move_to_end(key)
        return found

    def peek(self, key: Key) -> UserIndex | None:
        """The index of ``key`` at whatever generations it was built (to refresh it)."""
        return self._entries.get(key)

    def put(self, key: Key, index: UserIndex) -> None:
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.nbytes -= previous.nbytes
        if index.nbytes > self.capacity:
            return
        self._entries[key] = index
        self.nbytes += index.nbytes
        while self.nbytes > self.capacity:
            _, dropped = self._entries.popitem(last=False)
            self.nbytes -= dropped.nbytes
