"""The RedisVL search index over memory hashes: schema, versioning, migration, queries.

**Schema** (one index over every key starting with ``<key_prefix>:m:``; fields are
described in :mod:`proxy.backends.redis.codec`):

- TAG (case-sensitive digests / flags): ``ix_tenant``, ``ix_user`` (``"shared"`` for no
  user), ``ix_ns``, ``ix_id`` (sortable: listing is newest id first), ``category``,
  ``ix_chan`` (source channel), ``ix_active``, ``ix_retired``, ``enabled``, ``ix_about``;
  TAG ``scope`` and ``source`` (fixed vocabularies);
- TEXT ``ix_terms`` (``NOSTEM``): pre-segmented terms (:func:`proxy.memory.text.index_terms`,
  jieba's words plus character bigrams and characters for CJK) turned into exactly the
  terms SQLite's ``porter unicode61 remove_diacritics 2`` tokenizer indexes
  (:func:`~proxy.backends.redis.codec.stemmed_terms`: Latin diacritics folded, Porter
  stems), at write and at query time. RediSearch does no
  stemming of its own (it would index word and stem both, double-crediting stemmed
  words) and keeps its default LANGUAGE english: never ``chinese``, whose tokenizer would
  segment the already-segmented words again, differently from jieba. ``STOPWORDS 0``:
  every term is indexed, as in SQLite; queries drop stopwords themselves
  (:func:`~proxy.memory.text.query_terms`);
- NUMERIC ``hits`` and ``ix_last_seen`` (sortable: the resident layer orders by them),
  ``score``, ``ix_created`` (epoch seconds);
- VECTOR ``emb_<dim>``: HNSW, COSINE, FLOAT32, only when a dimension is configured.

**Keyword scorer**: ``BM25STD`` — RediSearch's Okapi BM25, its default scorer in Redis 8
(Redis 8.4 deprecates the older ``BM25`` name, whose RediSearch 2.x scorer normalises
differently). SQLite FTS5's ``bm25()`` is Okapi BM25 too; with the same terms and a query
shaped so that only text terms score (:func:`keyword_query`) both backends rank alike.
The constants differ slightly (RediSearch: b = 0.5 and IDF ln(1 + (N − n + ½)/(n + ½)),
per its EXPLAINSCORE; FTS5: b = 0.75, IDF ln((N − n + ½)/(n + ½))), so scores differ in
scale and near-ties may swap; ``bench/store_latency.py`` reports how often the two top 5
agree on the same data.

**Versioning and migration.** The index is named ``<prefix>_mem_v<SCHEMA_VERSION>_d<dim>``
(``_dnone`` without vectors). On start, :meth:`MemoryIndex.ensure`:

1. creates the configured index if it does not exist — over the *same* key prefix, so
   RediSearch backfills it from the existing hashes in the background; no document is
   copied or rewritten. Vectors need no rewrite either: each embedding sits in a field
   named after its own dimension, so the new ``emb_4`` index picks up exactly the
   memories with 4-dimensional embeddings, and memories without (or with other) vectors
   stay keyword-searchable;
2. if it exists, checks that its fields are the expected ones (a schema change without a
   version bump is refused rather than served wrongly);
3. waits (up to :data:`INDEX_BUILD_WAIT_SECONDS`) for the backfill. If it is not done,
   queries keep going to the previous index of the same schema version, which holds every
   memory (keyword search stays complete; vector search is empty until the new index,
   with vectors of the new dimension, is ready), and :meth:`MemoryIndex.maintain`
   re-checks on use;
4. once the new index is built, serves it and drops the other ``<prefix>_mem_v*_d*``
   indexes with ``FT.DROPINDEX`` *without* ``DD``: index structures go, hashes stay.

So data is never deleted by a migration; the cost of a dimension change is one background
re-index. Before step 1, a change of the keyword terms rule
(:data:`~proxy.memory.text.TERMS_VERSION`) rewrites the ``ix_terms`` of the memories whose
terms it changes (:func:`~proxy.backends.redis.memories.reterm_documents`), once per key
prefix. A future document layout change bumps ``DOC_VERSION`` in the codec and must
rewrite documents before step 4. All processes sharing a key prefix must agree on the
vector dimension: each start drops the other dimension's index.
"""

from __future__ import annotations

import asyncio
import re
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.commands.search import reducers
from redis.commands.search.aggregation import AggregateRequest, Desc
from redis.exceptions import ResponseError
from redisvl.exceptions import RedisSearchError
from redisvl.index import AsyncSearchIndex
from redisvl.query import FilterQuery, VectorQuery
from redisvl.query.filter import FilterExpression, Tag
from redisvl.schema import IndexSchema
from redisvl.utils.token_escaper import TokenEscaper

from proxy.backends.redis.codec import embedding_field
from proxy.backends.redis.keys import SHARED_USER, KeyLayout, channel_token
from proxy.backends.redis.memories import reterm_documents
from proxy.errors import MemoryProxyError
from proxy.memory.text import stemmed_terms

SCHEMA_VERSION = 1
KEYWORD_SCORER = "BM25STD"
# How long start-up waits for a new index to be built before serving the previous one.
# Measured on 2 cores: 100k memories without vectors index in ~4.5 s; with 384-dimensional
# HNSW vectors at ~400 memories/s, i.e. ~4 minutes for 100k.
INDEX_BUILD_WAIT_SECONDS = 5.0
BUILD_CHECK_SECONDS = 2.0  # then re-checked this often, on use, until it is built
_POLL_SECONDS = 0.05
MATCH_SCAN_PAGE = 1_000  # rows per FT.SEARCH page when a text filter is applied in Python
_ASCII_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# HNSW build parameters: RediSearch's defaults (M 16, EF_CONSTRUCTION 200).
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 200

log = structlog.get_logger("proxy.memory.redis")


class IndexMismatchError(MemoryProxyError):
    """An index with the configured name exists but has other fields."""

    log_traceback = True


def index_name(prefix: str, vector_dim: int | None) -> str:
    """``<prefix>_mem_v<SCHEMA_VERSION>_d<dim>``, ``_dnone`` without vectors."""
    return f"{prefix}_mem_v{SCHEMA_VERSION}_d{vector_dim if vector_dim else 'none'}"


def _tag(name: str, *, sortable: bool = False, case_sensitive: bool = True) -> dict[str, Any]:
    return {"name": name, "type": "tag",
            "attrs": {"case_sensitive": case_sensitive, "sortable": sortable}}


def index_schema(layout: KeyLayout, vector_dim: int | None) -> IndexSchema:
    """The RedisVL schema of the memory index (see module docstring)."""
    fields: list[dict[str, Any]] = [
        _tag("ix_tenant"), _tag("ix_user"), _tag("ix_ns"), _tag("ix_id", sortable=True),
        _tag("category"), _tag("ix_chan"), _tag("ix_active"), _tag("ix_retired"),
        _tag("enabled"), _tag("ix_about"), _tag("scope"), _tag("source"),
        {"name": "ix_terms", "type": "text", "attrs": {"no_stem": True}},
        {"name": "hits", "type": "numeric", "attrs": {"sortable": True}},
        {"name": "ix_last_seen", "type": "numeric", "attrs": {"sortable": True}},
        {"name": "score", "type": "numeric"},
        {"name": "ix_created", "type": "numeric"},
    ]
    if vector_dim:
        fields.append({"name": embedding_field(vector_dim), "type": "vector", "attrs": {
            "dims": vector_dim, "algorithm": "hnsw", "distance_metric": "cosine",
            "datatype": "float32", "m": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION,
        }})
    return IndexSchema.from_dict({
        "index": {"name": index_name(layout.prefix, vector_dim),
                  "prefix": layout.memory_prefix, "storage_type": "hash", "stopwords": []},
        "fields": fields,
    })


# filters (pure) ------------------------------------------------------------------------

def tag_is(field: str, value: str | Sequence[str]) -> FilterExpression:
    """``@field:{value}`` (any of several values); RedisVL escapes the values."""
    return Tag(field) == (value if isinstance(value, str) else list(value))


def namespace_filter(tokens: Sequence[str]) -> FilterExpression:
    return tag_is("ix_ns", tokens)


def active_filter() -> FilterExpression:
    return tag_is("ix_active", "1")


def channel_filter(channels: tuple[str | None, ...] | None) -> FilterExpression | None:
    """Personal memories visible in a channel: all (``None``); in a group only those
    learned there; shared and system memories everywhere (docs/design.md#group-chats; the SQLite
    store's ``_channel_clause``)."""
    if channels is None:
        return None
    shared = Tag("ix_user") == SHARED_USER
    named = [channel_token(c) for c in channels if c is not None]
    if not named:
        return shared
    return shared | (Tag("ix_chan") == named)


_ESCAPE = TokenEscaper()


def keyword_query(terms: Sequence[str], where: FilterExpression) -> str:
    """A RediSearch query whose BM25 score is the sum over ``terms`` as in SQLite FTS5:
    ``(@ix_terms:t1 (where)=>{$weight: 0.0}) | (@ix_terms:t2 (where)=>{$weight: 0.0}) | …``.

    Two RediSearch behaviours make the obvious ``@ix_terms:(t1|t2) where`` rank
    differently: TAG clauses add their own BM25 term (its IDF is the namespace's share of
    the index, scaled by document length), and a union nested in an intersection stops
    at its first matching child, so a memory matching several terms scores as if it
    matched one. Here every filter has weight 0 and the union is the root: each matching
    term adds its part. Terms are stemmed as the index is (:func:`stemmed_terms`); a
    query term repeated after stemming counts twice, as in FTS5.
    """
    condition = f"({where})=>{{$weight: 0.0}}"
    stems = stemmed_terms(" ".join(terms)).split()
    return " | ".join(f"(@ix_terms:{_ESCAPE.escape(t)} {condition})" for t in stems)


def all_of(*parts: FilterExpression | None) -> FilterExpression:
    present = [p for p in parts if p is not None]
    out = present[0]
    for part in present[1:]:
        out = out & part
    return out


# the index -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Hit:
    """A document key found by a query, with its score (BM25, or cosine similarity)."""

    key: str
    score: float


class MemoryIndex:
    """The search index of one key prefix and vector dimension (RedisVL inside).

    Queries go to the *serving* index: the configured one, or — while the configured one
    is still being built after a migration — the previous index of the same schema
    version, which already holds every memory (vector search then finds nothing until
    the new index is ready, as its vectors are of another dimension).
    """

    def __init__(self, client: Redis, layout: KeyLayout, vector_dim: int | None, *,
                 build_wait_seconds: float = INDEX_BUILD_WAIT_SECONDS) -> None:
        self.layout = layout
        self.vector_dim = vector_dim
        self.name = index_name(layout.prefix, vector_dim)
        self._client = client
        self._schema = index_schema(layout, vector_dim)
        self._target = AsyncSearchIndex(self._schema, redis_client=client, owns_client=False)
        self._serving = self._target
        self._stale: list[str] = []
        self._next_check = 0.0
        self._build_wait = build_wait_seconds
        self._ours = re.compile(
            rf"^{re.escape(layout.prefix)}_mem_v(?P<v>\d+)_d(?P<d>\d+|none)$")
        self._ready = False
        self._ready_lock = asyncio.Lock()

    @property
    def serving(self) -> str:
        """Name of the index queries use now."""
        name: str = self._serving.schema.index.name
        return name

    # lifecycle ---------------------------------------------------------------------------
    async def ensure(self) -> None:
        """Bring stored terms to today's rule (:func:`~proxy.backends.redis.memories.
        reterm_documents`), create or verify the index, then retire older versions once it
        is built (module docstring). Raises :class:`IndexMismatchError`, ``redis`` or ``redisvl``
        errors."""
        await reterm_documents(self._client, self.layout)
        existing = await self.names()
        self._stale = [n for n in existing if self._ours.match(n) and n != self.name]
        if self.name in existing:
            await self._check_fields()
        else:
            try:
                await self._target.create(overwrite=False)
            except RedisSearchError as exc:  # another process created it just now
                if "exists" not in str(exc).lower():
                    raise
            log.info("redis_index_created", index=self.name, previous=self._stale)
        deadline = time.monotonic() + self._build_wait
        while not await self._built():
            if time.monotonic() >= deadline:
                self._serve_previous()
                return
            await asyncio.sleep(_POLL_SECONDS)
        await self._retire()

    async def ready(self) -> None:
        """:meth:`ensure` once (the first caller; the others wait for it), then
        :meth:`maintain` on each later call: the store calls this before every index read,
        so the index is created lazily and a gateway started while Redis was down
        recovers when it is back."""
        if self._ready:
            await self.maintain()
            return
        async with self._ready_lock:
            if not self._ready:
                await self.ensure()
                self._ready = True

    async def maintain(self) -> None:
        """While a migration is pending, check (at most every
        :data:`BUILD_CHECK_SECONDS`) whether the new index is built; then serve it and
        drop the old ones."""
        if not self._stale or time.monotonic() < self._next_check:
            return
        self._next_check = time.monotonic() + BUILD_CHECK_SECONDS
        if await self._built():
            await self._retire()

    def _serve_previous(self) -> None:
        for name in self._stale:
            match = self._ours.match(name)
            if match is None or int(match["v"]) != SCHEMA_VERSION:
                continue
            dim = None if match["d"] == "none" else int(match["d"])
            self._serving = AsyncSearchIndex(index_schema(self.layout, dim),
                                             redis_client=self._client, owns_client=False)
            break
        log.warning("redis_index_still_building", index=self.name, serving=self.serving,
                    waited_s=self._build_wait)

    async def _built(self) -> bool:
        info: dict[str, Any] = await self._target.info()
        return int(info.get("indexing", 0)) == 0 and \
            float(info.get("percent_indexed", 1)) >= 1

    async def _retire(self) -> None:
        self._serving = self._target
        for name in self._stale:
            try:
                await self._client.execute_command(  # type: ignore[no-untyped-call]
                    "FT.DROPINDEX", name)  # no DD: the hashes stay
            except ResponseError as exc:  # dropped by another process meanwhile
                if "unknown index" not in str(exc).lower():
                    raise
            log.info("redis_index_dropped", index=name, replaced_by=self.name)
        self._stale = []

    async def names(self) -> list[str]:
        raw = await self._client.execute_command("FT._LIST")  # type: ignore[no-untyped-call]
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in raw)

    async def _check_fields(self) -> None:
        info: dict[str, Any] = await self._target.info()
        attributes = info.get("attributes", [])
        found = {str(a[a.index("identifier") + 1]) for a in attributes if "identifier" in a}
        expected = {f.name for f in self._schema.fields.values()}
        if found != expected:
            raise IndexMismatchError(
                f"index {self.name} exists with fields {sorted(found)}, expected "
                f"{sorted(expected)}: the schema changed without a SCHEMA_VERSION bump"
            )

    # queries ---------------------------------------------------------------------------
    async def keyword(self, terms: Sequence[str], where: FilterExpression,
                      limit: int) -> list[Hit]:
        """Documents matching any of ``terms`` in ``ix_terms``, best BM25 first
        (see :func:`keyword_query` for how the query is shaped)."""
        query = FilterQuery(keyword_query(terms, where), return_fields=["ix_id"],
                            num_results=limit)
        query.scorer(KEYWORD_SCORER).with_scores().verbatim()
        rows = await self._serving.query(query)
        return [Hit(str(r["id"]), float(r["score"])) for r in rows]

    async def nearest(self, vector: Sequence[float], where: FilterExpression,
                      limit: int) -> list[Hit]:
        """KNN over ``emb_<dim>`` within ``where``, nearest first; score = cosine
        similarity (1 − RediSearch's cosine distance)."""
        assert self.vector_dim is not None
        if self._serving is not self._target:
            return []  # the previous index holds no vectors of this dimension
        query = VectorQuery(list(vector), embedding_field(self.vector_dim),
                            filter_expression=where, num_results=limit,
                            return_fields=["ix_id"])
        rows = await self._target.query(query)
        return [Hit(str(r["id"]), 1.0 - float(r["vector_distance"])) for r in rows]

    async def find(self, where: FilterExpression, *, offset: int, limit: int,
                   fields: Sequence[str] = ("ix_id",),
                   oldest_first: bool = False) -> list[dict[str, Any]]:
        """Documents in ``where``, newest id first (ids are ULIDs: time order) unless
        ``oldest_first``; each row has ``id`` (the key) and ``fields`` (as strings)."""
        query = FilterQuery(where, return_fields=list(fields), num_results=limit,
                            sort_by=("ix_id", "ASC" if oldest_first else "DESC"))
        query.paging(offset, limit)
        rows: list[dict[str, Any]] = await self._serving.query(query)
        return rows

    async def matching(self, where: FilterExpression, *, terms: Sequence[str],
                       after: str | None) -> list[str]:
        """Keys in ``where``, newest id first, with ids below ``after`` (when given) whose
        ``norm`` or ``title`` contains each of ``terms`` (lower case) as SQLite's ``LIKE``
        would: read in pages of :data:`MATCH_SCAN_PAGE` and filtered here (a user holds
        at most the quota's few hundred memories, plus retired ones)."""
        keys: list[str] = []
        offset = 0
        while True:
            rows = await self.find(where, offset=offset, limit=MATCH_SCAN_PAGE,
                                   fields=("ix_id", "norm", "title"))
            for row in rows:
                if after and str(row.get("ix_id", "")) >= after:
                    continue
                norm, title = str(row.get("norm", "")), str(row.get("title", ""))
                if all(_like(norm, t) or _like(title, t) for t in terms):
                    keys.append(row["id"])
            if len(rows) < MATCH_SCAN_PAGE:
                return keys
            offset += MATCH_SCAN_PAGE

    async def top_by_evidence(self, where: FilterExpression, limit: int) -> list[str]:
        """Keys in ``where`` ordered by hits, then last_seen_at, descending."""
        request = (AggregateRequest(str(where)).load("@__key")
                   # redis-py annotates sort_by(*str) but takes Asc/Desc, as documented
                   .sort_by(Desc("@hits"), Desc("@ix_last_seen"),  # type: ignore[arg-type]
                            max=limit).dialect(2))
        result = await self._serving.aggregate(request)
        return [_row(r)["__key"] for r in result.rows]

    async def state_counts(self, where: FilterExpression) -> list[tuple[str, bool, bool, int]]:
        """``(category, enabled, retired, count)`` groups of the documents in ``where``."""
        request = (AggregateRequest(str(where))
                   .group_by(["@category", "@enabled", "@ix_retired"],
                             reducers.count().alias("n")).dialect(2))
        result = await self._serving.aggregate(request)
        out = []
        for raw in result.rows:
            row = _row(raw)
            out.append((row["category"], row["enabled"] == "1", row["ix_retired"] == "1",
                        int(row["n"])))
        return out


    async def scope_counts(self, where: FilterExpression
                           ) -> list[tuple[str, str, bool, bool, int]]:
        """``(scope, category, enabled, retired, count)`` groups of the documents in
        ``where`` (tenant statistics)."""
        request = (AggregateRequest(str(where))
                   .group_by(["@scope", "@category", "@enabled", "@ix_retired"],
                             reducers.count().alias("n")).dialect(2))
        result = await self._serving.aggregate(request)
        out = []
        for raw in result.rows:
            row = _row(raw)
            out.append((row["scope"], row["category"], row["enabled"] == "1",
                        row["ix_retired"] == "1", int(row["n"])))
        return out


def _like(haystack: str, needle: str) -> bool:
    """SQLite ``haystack LIKE '%needle%'``: substring, case-insensitive for ASCII only."""
    return needle.translate(_ASCII_FOLD) in haystack.translate(_ASCII_FOLD)


def _row(raw: Sequence[Any]) -> dict[str, str]:
    """An FT.AGGREGATE row ``[name, value, name, value, …]`` as a dict of strings."""
    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    return {text(raw[i]): text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
