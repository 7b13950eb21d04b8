"""Ranking of recall candidates (pure).

Input: one :class:`QueryHits` per query the retriever ran (the main query, sub-queries),
each with the candidates its keyword and vector searches found and its query vector.
Every candidate is scored against every query, so a memory found by one method or one
query still gets the other's evidence.

1. **Relevance** per query ``h`` (``fusion: convex``, the default)::

       r_h = α · dense + (1 − α) · keyword                       α = vector_share (0.7)
       keyword = BM25 / best BM25 of h's keyword hits            (0 when h did not find it)
       dense   = cos(q_h − μ, e − μ)                             μ = mean vector of the pool
                 (a candidate returned without its vector: the store's own cosine)

   A convex combination of normalised scores rather than rank fusion, because it keeps
   how much better one hit is than the next (Bruch, Gai & Ingber, "An Analysis of Fusion
   Functions for Hybrid Retrieval", TOIS 2023). Subtracting the pool's mean vector removes
   what all candidates share — with memories of one person, their name and the "X likes Y"
   frame dominate raw sentence embeddings (cf. Mu & Viswanath, "All-but-the-Top", ICLR
   2018). Without a query vector ``r_h = keyword``. ``fusion: rrf`` uses reciprocal rank
   fusion instead (``Σ 1/(k + rank)`` over h's keyword and vector lists, k = 60; Cormack,
   Clarke & Büttcher, SIGIR 2009).
2. **Feedback** (a second, implicit query; ``feedback`` β > 0): Rocchio's pseudo-relevance
   feedback — ``q'_h = (q_h − μ) + β · mean(e − μ of h's top feedback_docs)`` — rescoring
   the dense part, which pulls in facts phrased like the best hits but unlike the question
   (Rocchio 1971; Lavrenko & Croft 2001 for the keyword analogue).
3. **Across queries**: ``relevance = max_h weight_h · r_h`` (CombMAX, Fox & Shaw 1994), then
   divided by the best candidate's, so the best is 1.0.
4. **Final score**::

       final = w_rel · relevance + w_when · when + w_ctx · context
             + w_q · score + w_e · evidence + w_r · recency
       when     = time_match(created_at / last_seen_at, dates named in the query)
       context  = best relevance of another candidate from the same source conversation
       evidence = 1 − 1 / (1 + ln(hits))            # 0 at one mention, → 1 with repetition
       recency  = 0.5 ^ (days since last_seen_at / half_life_days)

   ``when`` (:mod:`proxy.memory.when`) answers "what did I say on 3 June". ``context`` is
   temporal contiguity: facts learned in one conversation cue each other (Kahana, "Associative
   retrieval processes in free recall", Memory & Cognition 1996), which finds the fact that
   answers a question in words the question does not use. Evidence and recency break ties
   between similarly relevant memories (LangMem's "similarity + importance + strength";
   docs/design.md#recall). Weights are settings (``memory.ranking``); the defaults were tuned on
   LoCoMo (``bench/retrieval_locomo.py`` says which).
5. **Diversity** — a candidate whose normalised text equals, contains or is contained in
   one already chosen, or shares ≥ 80 % of its terms with it, is skipped, so near-duplicates
   never fill the block twice.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt

from proxy.memory.records import Memory
from proxy.memory.store import Candidate
from proxy.memory.text import content_terms, normalize
from proxy.memory.when import Period, time_match

RRF_K = 60  # Cormack et al. 2009
NEAR_DUPLICATE_JACCARD = 0.8
_EPSILON = 1e-9
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)  # the epoch of naive timestamps
_MICROSECOND = timedelta(microseconds=1)

Fusion = Literal["convex", "rrf"]
Matrix = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RankWeights:
    """Weights and knobs of the ranking (``memory.ranking``; see the module docstring)."""

    relevance: float = 0.7
    quality: float = 0.05
    evidence: float = 0.05
    recency: float = 0.05
    when: float = 0.2
    context: float = 0.2
    half_life_days: float = 90.0
    fusion: Fusion = "convex"
    vector_share: float = 0.7
    feedback: float = 0.3
    feedback_docs: int = 2
    rrf_k: int = RRF_K


@dataclass(frozen=True, slots=True)
class QueryHits:
    """What one query found: its candidates (keyword and/or vector), its query vector
    (``None`` when recall is keyword-only) and its weight among the queries."""

    candidates: Sequence[Candidate]
    vector: Sequence[float] | None = None
    weight: float = 1.0


@dataclass(slots=True)
class Ranked:
    """One ranked memory: its fused ``relevance`` (0–1), ``final`` score, and the parts
    of that score an injection record explains it by (docs/design.md#injection-records):
    whether a keyword / vector search found it, its date match ``when`` (0–1) and its
    conversation ``context`` (0–1). Not frozen, never changed once built (as
    :class:`~proxy.memory.store.Candidate`: built on every request)."""

    memory: Memory
    relevance: float
    final: float
    keyword: bool = False
    vector: bool = False
    when: float = 0.0
    context: float = 0.0


@lru_cache(maxsize=1024)
def evidence_strength(hits: int) -> float:
    """0 for one mention, ~0.41 for two, ~0.62 for five, → 1 as hits grow (memoised:
    hit counts are small integers)."""
    return 0.0 if hits <= 1 else 1.0 - 1.0 / (1.0 + math.log(hits))


def recency(last_seen: datetime, now: datetime, half_life_days: float) -> float:
    days = max(0.0, (now - last_seen).total_seconds() / 86400)
    return math.pow(0.5, days / half_life_days) if half_life_days > 0 else 1.0


def _pool(hits: Sequence[QueryHits]) -> dict[str, Memory]:
    pool: dict[str, Memory] = {}
    for query in hits:
        for c in query.candidates:
            pool.setdefault(c.memory.id, c.memory)
    return pool


def _gather(hits: Sequence[QueryHits]
            ) -> tuple[list[Memory], dict[str, int], set[str], set[str]]:
    """The pool (first memory object per id, in order of appearance), each id's position
    in it, and the ids a keyword / a vector search found, in one pass over the
    candidates."""
    pool: list[Memory] = []
    position: dict[str, int] = {}
    by_keyword: set[str] = set()
    by_vector: set[str] = set()
    for query in hits:
        for c in query.candidates:
            memory_id = c.memory.id
            if memory_id not in position:
                position[memory_id] = len(pool)
                pool.append(c.memory)
            if c.keyword_rank is not None:
                by_keyword.add(memory_id)
            if c.vector_rank is not None:
                by_vector.add(memory_id)
    return pool, position, by_keyword, by_vector


def _unit_rows(matrix: Matrix) -> Matrix:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    out: Matrix = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > _EPSILON)
    return out


def _unit(vector: Matrix) -> Matrix:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > _EPSILON else np.zeros_like(vector)


class _VectorRows:
    """float64 rows of memory vectors by memory id, reused while the memory carries the
    very same vector tuple (``is``): a store that hands out the same decoded memory while
    its row is unchanged (the SQLite store) skips the conversion from its second request
    on — ~6 µs a 256-d vector (bench/gateway gw-static); one that decodes afresh each time
    (Redis) only leaves a marker per memory, never a copy. Bounded: cleared when full."""

    def __init__(self, capacity: int = 4096) -> None:
        # memory id → (the vector tuple last seen, its row once seen twice, else None)
        self._rows: dict[str, tuple[Sequence[float], Matrix | None]] = {}
        self._capacity = capacity

    def matrix(self, memories: Sequence[Memory], dimension: int) -> Matrix:
        """The vectors of ``memories`` (each of ``dimension`` floats) as one matrix."""
        rows: list[Matrix | None] = []
        missing: list[int] = []
        again: list[bool] = []
        for index, memory in enumerate(memories):
            entry = self._rows.get(memory.id)
            seen = entry is not None and entry[0] is memory.embedding
            if seen and entry is not None and entry[1] is not None:
                rows.append(entry[1])
                continue
            rows.append(None)
            missing.append(index)
            again.append(seen)
        if not missing:
            stacked: Matrix = np.stack(rows)  # type: ignore[arg-type]
            return stacked
        # fromiter over the flattened tuples: ~40 % less CPU than asarray of the
        # tuples (0.39 vs 0.63 ms for 60 × 256, bench/retrieval_locomo.py's pool).
        fresh = np.fromiter(
            itertools.chain.from_iterable(memories[i].embedding or () for i in missing),
            dtype=np.float64, count=len(missing) * dimension,
        ).reshape(len(missing), dimension)
        if len(self._rows) + len(missing) > self._capacity:
            self._rows.clear()
        for row, index, seen in zip(fresh, missing, again, strict=True):
            memory = memories[index]
            kept = row.copy() if seen else None
            self._rows[memory.id] = (memory.embedding or (), kept)
            rows[index] = row
        if len(missing) == len(memories):
            return fresh
        out: Matrix = np.stack(rows)  # type: ignore[arg-type]
        return out


_VECTOR_ROWS = _VectorRows()


class _Dense:
    """Centred unit vectors of the pool's memories that carry an embedding of the query's
    length; ``score(q)`` is the centred cosine of each pool memory (0 without a vector)."""

    def __init__(self, memories: Sequence[Memory], dimension: int) -> None:
        self.rows = [i for i, m in enumerate(memories)
                     if m.embedding is not None and len(m.embedding) == dimension]
        self.size = len(memories)
        if self.rows:
            raw = _VECTOR_ROWS.matrix([memories[i] for i in self.rows], dimension)
            self.mean = raw.mean(axis=0) if len(self.rows) > 1 else np.zeros(dimension)
            self.matrix = _unit_rows(raw - self.mean)
        else:
            self.mean = np.zeros(dimension)
            self.matrix = np.zeros((0, dimension))

    def centred(self, vector: Sequence[float]) -> Matrix:
        return _unit(np.asarray(vector, dtype=np.float64) - self.mean)

    def score(self, query: Matrix, fallback: dict[int, float]) -> Matrix:
        """Centred cosine per pool memory; a memory without a usable vector gets the
        store's own cosine from ``fallback`` (by pool index) when there is one, else 0."""
        out = np.zeros(self.size)
        for index, value in fallback.items():
            out[index] = value
        if self.rows:
            out[self.rows] = self.matrix @ query
        return out

    def feedback(self, query: Matrix, order: Sequence[int], *, beta: float,
                 docs: int) -> Matrix:
        position = {row: k for k, row in enumerate(self.rows)}
        top = [position[i] for i in order if i in position][:docs]
        if not top or beta <= 0:
            return query
        moved: Matrix = query + beta * self.matrix[top].mean(axis=0)
        return _unit(moved)


def _keyword(query: QueryHits, index: dict[str, int], size: int) -> Matrix:
    out = [0.0] * size
    found = [(index[c.memory.id], c.keyword_score) for c in query.candidates
             if c.keyword_score is not None and c.keyword_rank is not None]
    best = max([score for _, score in found], default=0.0)
    if best > 0:
        for position, score in found:
            out[position] = (score if score > 0.0 else 0.0) / best
    return np.array(out, dtype=np.float64)


def _rrf(query: QueryHits, index: dict[str, int], size: int, k: int) -> Matrix:
    out = np.zeros(size)
    for c in query.candidates:
        for rank_ in (c.keyword_rank, c.vector_rank):
            if rank_ is not None:
                out[index[c.memory.id]] += 1.0 / (k + rank_)
    return out


def fused_relevance(hits: Sequence[QueryHits], weights: RankWeights) -> dict[str, float]:
    """Relevance in [0, 1] per memory id of the pool (steps 1–3 of the module docstring)."""
    memories = list(_pool(hits).values())
    index = {m.id: i for i, m in enumerate(memories)}
    return dict(zip(index, _relevance(hits, memories, index, weights), strict=True))


def _relevance(hits: Sequence[QueryHits], memories: list[Memory], index: dict[str, int],
               weights: RankWeights) -> list[float]:
    """:func:`fused_relevance` of the pool ``memories`` (as :func:`_pool` gives them;
    ``index``: each one's position by id), one value per memory in that order."""
    size = len(memories)
    combined = np.zeros(size)
    dense: _Dense | None = None
    for query in hits:
        if weights.fusion == "rrf":
            relevance = _rrf(query, index, size, weights.rrf_k)
        else:
            keyword = _keyword(query, index, size)
            relevance = keyword
            if query.vector is not None and len(query.vector) > 0:
                if dense is None or dense.matrix.shape[1] != len(query.vector):
                    dense = _Dense(memories, len(query.vector))
                alpha = weights.vector_share
                store_cosine = {index[c.memory.id]: c.vector_score for c in query.candidates
                                if c.vector_score is not None}
                q = dense.centred(query.vector)
                relevance = alpha * dense.score(q, store_cosine) + (1 - alpha) * keyword
                if weights.feedback > 0 and weights.feedback_docs > 0:
                    order = [int(i) for i in np.argsort(-relevance, kind="stable")]
                    q = dense.feedback(q, order, beta=weights.feedback,
                                       docs=weights.feedback_docs)
                    relevance = alpha * dense.score(q, store_cosine) + (1 - alpha) * keyword
        combined = np.maximum(combined, query.weight * relevance)
    best = float(combined.max()) if size else 0.0
    scale = best if best > _EPSILON else 1.0
    # max(0.0, value) / scale per value (NaN and −0.0 → 0.0, as max gives them)
    out: list[float] = (np.where(combined > 0.0, combined, 0.0) / scale).tolist()
    return out


def _context(memories: Sequence[Memory], relevance: Sequence[float]) -> dict[str, float]:
    """Best relevance of another pool memory from the same source conversation, by id
    (``relevance``: one value per memory of the pool ``memories``, in its order)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for position, memory in enumerate(memories):
        if memory.source_conversation_id:
            groups[memory.source_conversation_id].append(position)
    out: dict[str, float] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        ordered = sorted(members, key=lambda i: -relevance[i])
        first, second = relevance[ordered[0]], relevance[ordered[1]]
        for position in members:
            out[memories[position].id] = second if position == ordered[0] else first
    return out


def rank(
    hits: Sequence[QueryHits], *, now: datetime, weights: RankWeights, limit: int,
    periods: Sequence[Period] = (), distinct_only: bool = True,
) -> list[Ranked]:
    """The best ``limit`` memories by final score, near-duplicates removed, best first.
    ``periods``: dates the query names (:func:`proxy.memory.when.mentioned_periods`);
    ``distinct_only=False`` keeps near-duplicates (a search lists every match).

    Only the final score is computed for every candidate; a :class:`Ranked` is built
    for the memories returned alone, and the near-duplicate check stops at ``limit``."""
    memories, index, by_keyword, by_vector = _gather(hits)
    if limit <= 0 or not memories:
        return []
    relevance = _relevance(hits, memories, index, weights)
    context = _context(memories, relevance) if weights.context > 0 else {}
    w_rel, w_when, w_ctx, w_q, w_e, w_r = (weights.relevance, weights.when, weights.context,
                                           weights.quality, weights.evidence, weights.recency)
    half_life, now_us, micros, strength = weights.half_life_days, _micros(now), _micros, \
        evidence_strength
    # (−final, id, position, when, context): sorted as rank's order (−final, id); ids are
    # unique in the pool, so the position is never compared.
    scored: list[tuple[float, str, int, float, float]] = []
    for position, m in enumerate(memories):
        when = time_match((m.created_at, m.last_seen_at), periods) if periods else 0.0
        near = context.get(m.id, 0.0)
        # recency(): (now − last_seen).total_seconds() is this quotient, exactly
        days = (now_us - micros(m.last_seen_at)) / 1_000_000 / 86400
        if not days > 0.0:  # max(0.0, days), without the call
            days = 0.0
        quality = m.score if m.score < 1.0 else 1.0  # max(0.0, min(1.0, score)), exactly
        if not quality > 0.0:
            quality = 0.0
        final = (
            w_rel * relevance[position]
            + w_when * when
            + w_ctx * near
            + w_q * quality
            + w_e * strength(m.hits)
            + w_r * (math.pow(0.5, days / half_life) if half_life > 0 else 1.0)
        )
        scored.append((-final, m.id, position, when, near))
    scored.sort()
    if distinct_only:
        chosen = [scored[i] for i in _distinct((memories[s[2]] for s in scored), limit=limit)]
    else:
        chosen = scored[:limit]
    return [Ranked(memories[position], relevance[position], -negative, memory_id in by_keyword,
                   memory_id in by_vector, when, near)
            for negative, memory_id, position, when, near in chosen]


@lru_cache(maxsize=8192)
def _micros(moment: datetime) -> int:
    """Microseconds of ``moment`` since the Unix epoch (naive: as naive UTC), so that
    ``(_micros(a) − _micros(b)) / 1e6`` is exactly ``(a − b).total_seconds()`` for two
    aware or two naive datetimes; memoised, a memory's ``last_seen_at`` recurs."""
    epoch = _EPOCH if moment.tzinfo is not None else _NAIVE_EPOCH
    return (moment - epoch) // _MICROSECOND


def diverse(ranked: Sequence[Ranked], *, limit: int) -> list[Ranked]:
    """Greedy pick in order, skipping near-duplicates of what is already picked."""
    keep = distinct([r.memory for r in ranked], limit=limit)
    return [ranked[i] for i in keep]


@lru_cache(maxsize=4096)
def dedup_key(content: str) -> tuple[str, frozenset[str]]:
    """Normalised text and content terms of a memory (memoised: the same user's memories
    come back request after request; bench/gateway: ~4 % of the gateway's time)."""
    return normalize(content), frozenset(content_terms(content))


def distinct(
    memories: Sequence[Memory], *, limit: int, chosen: Sequence[Memory] = ()
) -> list[int]:
    """Indices of ``memories`` picked greedily in order, at most ``limit``, skipping any that
    is a near-duplicate of one in ``chosen`` or of one picked before it."""
    return _distinct(iter(memories), limit=limit, chosen=chosen)


def _distinct(memories: Iterator[Memory], *, limit: int,
              chosen: Sequence[Memory] = ()) -> list[int]:
    """:func:`distinct` over an iterator, read no further than the ``limit``-th pick."""
    picked: list[int] = []
    if limit <= 0:
        return picked
    kept = [m.content for m in chosen]
    for index, memory in enumerate(memories):
        content = memory.content
        if any(near_duplicate(content, other) for other in kept):
            continue
        picked.append(index)
        if len(picked) >= limit:
            break
        kept.append(content)
    return picked


@lru_cache(maxsize=16_384)
def near_duplicate(a: str, b: str) -> bool:
    """Whether memory texts ``a`` and ``b`` are near-duplicates (step 5 of the module
    docstring). Memoised per pair: a user's resident memories are checked against their
    recalled ones on every request (~150 bytes an entry, ~2.5 MB when full)."""
    return _near(*dedup_key(a), *dedup_key(b))


def _near(a: str, a_terms: frozenset[str], b: str, b_terms: frozenset[str]) -> bool:
    """Whether two normalised texts (and their content terms) are near-duplicates: equal,
    one inside the other, or a Jaccard similarity of their terms ≥
    :data:`NEAR_DUPLICATE_JACCARD`. The similarity is at most the ratio of the smaller
    term count to the larger, so pairs whose sizes differ too much skip the intersection
    (the same answer: division rounds monotonically)."""
    if not a or not b:
        return a == b
    if a == b or a in b or b in a:
        return True
    small, large = len(a_terms), len(b_terms)
    if small > large:
        small, large = large, small
    if not large or small / large < NEAR_DUPLICATE_JACCARD:
        return False
    shared = len(a_terms & b_terms)
    return shared / (small + large - shared) >= NEAR_DUPLICATE_JACCARD
