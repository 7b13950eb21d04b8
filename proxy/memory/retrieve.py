"""Hybrid recall: plan the queries, search keyword and vector, rank
(docs/design.md#recall).

:func:`plan_queries` (pure) turns the conversation into a main query — the latest user
turn plus ``context_turns`` earlier ones — and, without any model call, up to
``max_subqueries`` sub-queries: the latest turn on its own when context was added (so an
earlier turn on another topic cannot drown the question) and each sentence of a latest
turn that asks several things. :class:`Retriever` runs them:

1. the query embeddings (one batch) start first — handed to the embedder before the
   keyword searches take the event loop — and the keyword searches run meanwhile;
2. the embeddings get ``embed_budget`` seconds — past it, or when the embedder fails,
   recall goes on keyword-only and says why (``degraded``), so a slow or broken embedder
   costs recall quality, never the request;
3. a vector search per embedded query;
4. :func:`proxy.memory.recall.rank` scores the union of candidates against every query.

With ``indexes`` (:class:`~proxy.memory.index.RecallIndexes`), steps 1 and 3 search the
user's in-process index instead of the store: one generation read per recall
(:meth:`~proxy.memory.store.MemoryStore.recall_generations`); the candidates are those the
store's searches return, so the ranking is the same. On a store that reads only what
changed (``incremental_corpus``: Redis), an index at older generations (a write since) is
brought up to date first, one refresh per user at a time, shared by the recalls waiting;
otherwise, and when the user has no index (first recall, or evicted), this recall searches
the store as before and the index is (re)built in the background from the one it replaces,
outside every deadline (docs/design.md#recall-index).

Store errors propagate (:class:`~proxy.memory.store.StoreUnavailableError`) for the caller
to degrade memory as a whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog

from proxy.logs import LogThrottle
from proxy.loop_lag import LoopLag, loop_free_deadline
from proxy.memory.embed import Embedder, EmbedderError, Embeddings, Vector
from proxy.memory.index import RecallIndexes, UserIndex
from proxy.memory.recall import QueryHits, Ranked, RankWeights, rank
from proxy.memory.records import Memory
from proxy.memory.store import Candidate, MemoryStore, SearchQuery
from proxy.memory.text import load_segmenter_for, query_terms, segmenter_loaded
from proxy.memory.when import Period
from proxy.request import Message, message_text

log = structlog.get_logger("proxy.memory")
# Per-request warnings below are counted by the metrics; the log gets one line per 10 s.
THROTTLE = LogThrottle(10.0)

_SENTENCE_END = re.compile(r"(?<=[.!?;。！？；])\s+|(?<=[。！？；])|\n+")
MIN_SUBQUERY_TERMS = 2  # a sentence with fewer content terms is too vague to search alone
MAX_SUBQUERY_CHARS = 1000
# Characters of a query that are embedded: the end, where the latest turn is. MiniLM reads
# 256 word pieces (~1,000 characters) from the start and drops the rest; remote models
# reject inputs past their limit.
MAX_EMBED_CHARS = 1000


@dataclass(frozen=True, slots=True)
class SubQuery:
    """One query text and its weight among the queries of a request (main = 1.0)."""

    text: str
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Recall:
    """Ranked memories, and why vectors were left out when they were
    (``embedder_unavailable`` | ``embedder_timeout``)."""

    ranked: list[Ranked]
    degraded: str | None = None
    tokens: int = 0  # provider tokens the query embeddings spent (remote embedders)
    # The resident memories asked for (``resident=`` of :meth:`Retriever.recall`), from
    # the recall index; ``None`` when not asked or no index was current (ask the store).
    resident: list[Memory] | None = None


def sentences(text: str) -> list[str]:
    """``text`` split after sentence punctuation (Latin and CJK) and at line breaks."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def plan_queries(
    messages: Sequence[Message], *, context_turns: int, max_subqueries: int,
    subquery_weight: float,
) -> list[SubQuery]:
    """The main query and its sub-queries (see the module docstring); empty when the
    conversation has no user text."""
    turns = [message_text(m) for m in messages if m.get("role") == "user"]
    turns = [t for t in turns if t.strip()]
    if not turns:
        return []
    latest = turns[-1]
    main = "\n".join(turns[-(context_turns + 1):])
    plan = [SubQuery(main, 1.0)]
    if max_subqueries <= 0:
        return plan
    options = [latest] if main != latest else []
    parts = sentences(latest)
    if len(parts) > 1:
        options.extend(parts)
    seen = {main.strip()}
    for option in options:
        text = option.strip()[:MAX_SUBQUERY_CHARS]
        if text in seen or len(query_terms(text)) < MIN_SUBQUERY_TERMS:
            continue
        seen.add(text)
        plan.append(SubQuery(text, subquery_weight))
        if len(plan) > max_subqueries:
            break
    return plan


def _merge(keyword: Sequence[Candidate], vector: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per memory with the ranks and scores of both searches."""
    found = {c.memory.id: c for c in keyword}
    for c in vector:
        previous = found.get(c.memory.id)
        found[c.memory.id] = c if previous is None else Candidate(
            previous.memory, keyword_rank=previous.keyword_rank,
            keyword_score=previous.keyword_score, vector_rank=c.vector_rank,
            vector_score=c.vector_score,
        )
    return list(found.values())


def _comparable(candidates: list[Candidate], model: str | None) -> list[Candidate]:
    """``candidates`` without the vectors of another model than ``model`` (ranking
    compares memory vectors with the query's; vectors of no recorded model are kept)."""
    if model is None:
        return candidates
    return [c if c.memory.embedding_model in (None, model) else Candidate(
        c.memory.with_changes(embedding=None, embedding_model=None),
        keyword_rank=c.keyword_rank, keyword_score=c.keyword_score,
        vector_rank=c.vector_rank, vector_score=c.vector_score) for c in candidates]


def _settle_embedding(embedding: asyncio.Task[Embeddings] | None) -> None:
    """End a query-embedding task a recall no longer waits for: cancelled while running,
    its exception retrieved once done (an early store error leaves no "never retrieved"
    noise)."""
    if embedding is None:
        return
    if not embedding.done():
        embedding.cancel()
    elif not embedding.cancelled():
        embedding.exception()


async def _let_start() -> None:
    """One turn of the event loop, so that a query-embedding task just created hands its
    batch to the embedder's worker thread (local model) or sends it (remote) before this
    recall's keyword searches, index reads and ranking hold the loop: the embedding then
    runs beside them instead of after them (step 1 of the module docstring)."""
    await asyncio.sleep(0)

# Wall time the query embedding may take beyond its budget while the event loop is busy
# (its budget counts only the time the loop was free): recall's own hard bound
# (memory.recall_hard_timeout_ms) ends it first on the chat path.
EMBED_HARD_EXTRA_SECONDS = 1.0


class Retriever:
    """Runs a query plan against a store (and an embedder, when there is one)."""

    def __init__(self, *, store: MemoryStore, embedder: Embedder | None,
                 weights: RankWeights, candidate_pool: int,
                 indexes: RecallIndexes | None = None,
                 loop_lag: LoopLag | None = None) -> None:
        """``indexes``: search in-process recall indexes kept there (see the module
        docstring); ``None``: every search is a store read. ``loop_lag``: the event
        loop's lag, which the embedding budget does not count (as recall's deadline,
        docs/design.md#recall-deadline)."""
        self._loop_lag = loop_lag
        self._store = store
        self._embedder = embedder
        self.weights = weights
        self._pool = candidate_pool
        self._indexes = indexes
        self._building: dict[tuple[str, str], asyncio.Task[UserIndex]] = {}

    def _free_clock(self) -> float:
        """Loop time minus the loop's lag so far: seconds of it measure the time the loop
        was free (the loop's time while no lag is measured)."""
        now = asyncio.get_running_loop().time()
        lag = self._loop_lag
        return now - lag.total(now) if lag is not None and lag.running else now

    async def index(self, tenant: str, user: str) -> UserIndex:
        """The user's recall index at the store's current generations: kept, else built
        now from one corpus read (the term extraction in a worker thread). Raises what
        the store raises."""
        assert self._indexes is not None
        pending = self._building.get((tenant, user))
        if pending is not None:  # a background build: let it land first
            with contextlib.suppress(Exception):
                await asyncio.shield(pending)
        generations = await self._store.recall_generations(tenant, user)
        found = self._indexes.get((tenant, user), generations)
        return found if found is not None else await self._build(tenant, user)

    async def _build(self, tenant: str, user: str) -> UserIndex:
        """Build the user's index, from the one it replaces when there is one (the
        store reads only what changed since, where it can tell)."""
        assert self._indexes is not None
        previous = self._indexes.peek((tenant, user))
        corpus = await self._store.recall_corpus(
            tenant, user, since=None if previous is None else previous.corpus)
        built = await asyncio.to_thread(UserIndex, corpus, previous)
        self._indexes.put((tenant, user), built)
        return built

    async def _current(self, tenant: str, user: str) -> UserIndex | None:
        """The user's index at the store's generations (one small read): kept, or — on
        a store that reads only what changed (``incremental_corpus``) — the kept one at
        older generations brought up to date now (one refresh per user at a time, shared
        by the recalls that need it); else ``None``."""
        if self._indexes is None:
            return None
        key = (tenant, user)
        generations = await self._store.recall_generations(tenant, user)
        found = self._indexes.get(key, generations)
        if found is not None or self._indexes.peek(key) is None or \
                not self._store.incremental_corpus:
            return found
        for _ in range(2):  # a refresh begun before this read may predate a write it saw
            task = self._building.get(key)
            if task is None or task.done():
                task = self._launch(key)
            built = await asyncio.shield(task)
            if all(b >= g for b, g in zip(built.generations, generations, strict=True)):
                return built
        return None

    def _launch(self, key: tuple[str, str]) -> asyncio.Task[UserIndex]:
        """Start the build of ``key``'s index, registered as its one build."""
        task = asyncio.create_task(self._build(*key))
        self._building[key] = task
        task.add_done_callback(lambda done: self._built(key, done))
        return task

    def _start_build(self, tenant: str, user: str) -> None:
        """Build the user's index in the background (one build per user at a time),
        started once the recall that found none has answered: its corpus read and term
        extraction never delay that recall."""
        key = (tenant, user)
        if self._indexes is None or key in self._building:
            return
        self._launch(key)

    def _built(self, key: tuple[str, str], task: asyncio.Task[UserIndex]) -> None:
        if self._building.get(key) is task:
            self._building.pop(key)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:  # recall goes on through the store meanwhile
            held = THROTTLE.allow("memory_recall_index_failed")
            if held is not None:
                log.warning("memory_recall_index_failed", error=str(error),
                            since_last_line=held)


    async def recall(
        self, *, tenant: str, user: str, queries: Sequence[SubQuery], limit: int,
        now: datetime, channels: tuple[str | None, ...] | None = None,
        periods: Sequence[Period] = (), embed_budget: float | None = None,
        resident: int = 0,
    ) -> Recall:
        """Ranked memories for ``queries``. ``embed_budget``: seconds to wait for the
        query embeddings (``None`` = no limit beyond the caller's); ``resident``: also
        the user's top resident memories (:meth:`~proxy.memory.store.MemoryStore.
        resident`) when the recall index is current."""
        if not queries or limit <= 0:
            return Recall([])
        started = self._free_clock()

        model = None if self._embedder is None else self._embedder.model

        def search(terms: tuple[str, ...], vector: Vector | None = None) -> SearchQuery:
            return SearchQuery(tenant=tenant, user=user, terms=terms, limit=self._pool,
                               embedding=vector, channels=channels,
                               embedding_model=None if vector is None else model)

        embedding: asyncio.Task[Embeddings] | None = None
        if self._embedder is not None:
            embedding = asyncio.create_task(self._embedder.embed_queries(
                [q.text[-MAX_EMBED_CHARS:] for q in queries]))
        try:
            if embedding is not None:
                await _let_start()
            await load_segmenter_for(*(q.text for q in queries))
            index = await self._current(tenant, user)
            terms = [tuple(query_terms(q.text)) for q in queries]
            if index is not None:  # in process: no task per search
                keyword = [index.search(search(t)) for t in terms if t]
            else:
                keyword = await asyncio.gather(*(
                    self._store.search(search(t)) for t in terms if t
                ))
            by_query = iter(keyword)
            keyword_hits = [list(next(by_query)) if t else [] for t in terms]
            embedded, degraded = await self._vectors(embedding, embed_budget, started)
            vectors = None if embedded is None else embedded.vectors
            if vectors is not None and len(vectors) != len(queries):
                vectors, degraded = None, "embedder_unavailable"
        finally:
            _settle_embedding(embedding)
        vector_hits: list[list[Candidate]] = [[] for _ in queries]
        if vectors is not None:
            found = [index.search(search((), v)) for v in vectors] if index is not None \
                else await asyncio.gather(*(self._store.search(search((), v))
                                            for v in vectors))
            vector_hits = [list(f) for f in found]
        # Ranking tokenises the candidates (near-duplicate check): their CJK, if any, needs
        # the dictionary loaded off the loop first (an index knows whether it holds any).
        if not segmenter_loaded() and (index is None or index.cjk):
            await load_segmenter_for(*(c.memory.content
                                       for found in (*keyword_hits, *vector_hits)
                                       for c in found))
        hits = [
            QueryHits(_comparable(_merge(kw, vec), model),
                      vector=None if vectors is None else vectors[i], weight=q.weight)
            for i, (q, kw, vec) in enumerate(zip(queries, keyword_hits, vector_hits,
                                                 strict=True))
        ]
        ranked = rank(hits, now=now, weights=self.weights, limit=limit, periods=periods)
        if index is None:
            self._start_build(tenant, user)
        return Recall(ranked, degraded, tokens=0 if embedded is None else embedded.tokens,
                      resident=None if index is None or resident <= 0 else
                      index.resident(limit=resident, channels=channels))

    async def hits(
        self, *, tenant: str, user: str, text: str, include_shared: bool,
        keyword_limit: int, embed_budget: float | None = None,
    ) -> tuple[QueryHits, str | None]:
        """What one query ``text`` finds the way recall finds it — keyword (BM25, at most
        ``keyword_limit``) and, with an embedder, vector candidates (the candidate pool),
        with its query vector — for a caller that ranks them itself with
        :func:`~proxy.memory.recall.rank` (the memory search of the API, MCP and console:
        :mod:`proxy.memory.search`), and why vectors were left out (``degraded``, as for
        :meth:`recall`). Any channel; store errors propagate."""
        started = self._free_clock()
        model = None if self._embedder is None else self._embedder.model
        embedding: asyncio.Task[Embeddings] | None = None
        if self._embedder is not None:
            embedding = asyncio.create_task(
                self._embedder.embed_queries([text[-MAX_EMBED_CHARS:]]))
        try:
            if embedding is not None:
                await _let_start()
            await load_segmenter_for(text)
            terms = tuple(query_terms(text))
            keyword = [] if not terms else await self._store.search(SearchQuery(
                tenant=tenant, user=user, terms=terms, limit=keyword_limit,
                include_shared=include_shared))
            embedded, degraded = await self._vectors(embedding, embed_budget, started)
        finally:
            _settle_embedding(embedding)
        vector = None if embedded is None or len(embedded.vectors) != 1 \
            else embedded.vectors[0]
        found: list[Candidate] = []
        if vector is not None:
            found = await self._store.search(SearchQuery(
                tenant=tenant, user=user, terms=(), limit=self._pool, embedding=vector,
                include_shared=include_shared, embedding_model=model))
        await load_segmenter_for(*(c.memory.content for c in (*keyword, *found)))
        return QueryHits(_comparable(_merge(keyword, found), model), vector=vector), degraded

    async def _vectors(
        self, embedding: asyncio.Task[Embeddings] | None, budget: float | None,
        started: float,
    ) -> tuple[Embeddings | None, str | None]:
        if embedding is None or self._embedder is None:
            return None, None
        remaining = None if budget is None else \
            max(0.0, started + budget - self._free_clock())
        try:
            async with loop_free_deadline(
                    remaining, lag=self._loop_lag,
                    hard_seconds=remaining + EMBED_HARD_EXTRA_SECONDS) \
                    if remaining is not None else contextlib.nullcontext():
                result = await embedding
        except TimeoutError:
            held = THROTTLE.allow("memory_embedder_timeout")
            if held is not None:
                log.warning("memory_embedder_timeout", model=self._embedder.model,
                            budget_ms=round((budget or 0) * 1000), since_last_line=held)
            return None, "embedder_timeout"
        except EmbedderError as exc:
            held = THROTTLE.allow("memory_embedder_unavailable")
            if held is not None:
                log.warning("memory_embedder_unavailable", model=self._embedder.model,
                            error=str(exc), since_last_line=held)
            return None, "embedder_unavailable"
        except Exception:  # any embedder bug degrades recall, never the request
            log.exception("memory_embedder_failed", model=self._embedder.model)
            return None, "embedder_unavailable"
        return result, None
