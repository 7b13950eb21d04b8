"""The RedisVL search index over memory hashes: schema, versioning, migration, queries.

**Schema** (one index over every key starting with ``<key_prefix>:m:``; fields are
described in :mod:`proxy.memory.redis_codec`):

- TAG (case-sensitive digests / flags): ``ix_tenant``, ``ix_user`` (``"shared"`` for no
  user), ``ix_ns``, ``ix_id`` (sortable: listing is newest id first), ``category``,
  ``ix_chan`` (source channel), ``ix_active``, ``ix_retired``, ``enabled``, ``ix_about``;
  TAG ``scope`` and ``source`` (fixed vocabularies);
- TEXT ``ix_terms``: pre-segmented terms (:func:`proxy.memory.text.index_terms`). The
  index keeps RediSearch's default LANGUAGE english: never ``chinese``, whose own
  tokenizer would segment the already-segmented words a second time, differently from
  jieba. English Snowball stemming matches what the SQLite backend's ``porter`` tokenizer
  does to Latin words and leaves CJK words as they are. ``STOPWORDS 0``: every term is
  indexed, as in SQLite; queries drop stopwords themselves (:func:`query_terms`);
- NUMERIC ``hits`` and ``ix_last_seen`` (sortable: the resident layer orders by them),
  ``score``, ``ix_created`` (epoch seconds);
- VECTOR ``emb_<dim>``: HNSW, COSINE, FLOAT32, only when a dimension is configured.

**Keyword scorer**: ``BM25STD`` — RediSearch's standard Okapi BM25 (k1 = 1.2, b = 0.75),
the formula SQLite FTS5's ``bm25()`` implements, so both backends rank alike. (The older
``BM25`` scorer normalises differently.)

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
3. waits (up to :data:`INDEX_BUILD_WAIT_SECONDS`) for the backfill to finish;
4. only then drops the other ``<prefix>_mem_v*_d*`` indexes with ``FT.DROPINDEX`` *without*
   ``DD``: index structures go, hashes stay. If the backfill is still running, the old
   indexes are kept and dropped by a later start.

So data is never deleted by a migration; the cost of a dimension change is one background
re-index. A future document layout change bumps ``DOC_VERSION`` in the codec and must
rewrite documents before step 4. All processes sharing a key prefix must agree on the
vector dimension: each start drops the other dimension's index.
"""

from __future__ import annotations

import asyncio
import re
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
from redisvl.query import FilterQuery, TextQuery, VectorQuery
from redisvl.query.filter import FilterExpression, Tag
from redisvl.schema import IndexSchema

from proxy.memory.redis_codec import embedding_field
from proxy.memory.redis_keys import SHARED_USER, KeyLayout, channel_token

SCHEMA_VERSION = 1
KEYWORD_SCORER = "BM25STD"
INDEX_BUILD_WAIT_SECONDS = 120.0
_POLL_SECONDS = 0.05
# HNSW build parameters: RediSearch's defaults (M 16, EF_CONSTRUCTION 200).
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 200

log = structlog.get_logger("proxy.memory.redis")


class IndexMismatchError(Exception):
    """An index with the configured name exists but has other fields."""


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
        {"name": "ix_terms", "type": "text"},
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
    learned there; shared and system memories everywhere (SPEC §3.10; the SQLite
    store's ``_channel_clause``)."""
    if channels is None:
        return None
    shared = Tag("ix_user") == SHARED_USER
    named = [channel_token(c) for c in channels if c is not None]
    if not named:
        return shared
    return shared | (Tag("ix_chan") == named)


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
    """The search index of one key prefix and vector dimension (RedisVL inside)."""

    def __init__(self, client: Redis, layout: KeyLayout, vector_dim: int | None) -> None:
        self.layout = layout
        self.vector_dim = vector_dim
        self.name = index_name(layout.prefix, vector_dim)
        self._client = client
        self._schema = index_schema(layout, vector_dim)
        self._index = AsyncSearchIndex(self._schema, redis_client=client, owns_client=False)
        self._ours = re.compile(rf"^{re.escape(layout.prefix)}_mem_v\d+_d(?:\d+|none)$")

    # lifecycle ---------------------------------------------------------------------------
    async def ensure(self) -> None:
        """Create or verify the index and retire older versions (module docstring).
        Raises :class:`IndexMismatchError`, ``redis`` or ``redisvl`` errors."""
        existing = await self.names()
        stale = [n for n in existing if self._ours.match(n) and n != self.name]
        if self.name in existing:
            await self._check_fields()
        else:
            try:
                await self._index.create(overwrite=False)
            except RedisSearchError as exc:  # another process created it just now
                if "exists" not in str(exc).lower():
                    raise
            log.info("redis_index_created", index=self.name, previous=stale)
        if not await self._wait_built():
            log.warning("redis_index_still_building", index=self.name, kept=stale,
                        waited_s=INDEX_BUILD_WAIT_SECONDS)
            return
        for name in stale:
            try:
                await self._client.execute_command(  # type: ignore[no-untyped-call]
                    "FT.DROPINDEX", name)  # no DD: the hashes stay
            except ResponseError as exc:  # dropped by another process meanwhile
                if "unknown index" not in str(exc).lower():
                    raise
            log.info("redis_index_dropped", index=name, replaced_by=self.name)

    async def names(self) -> list[str]:
        raw = await self._client.execute_command("FT._LIST")  # type: ignore[no-untyped-call]
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in raw)

    async def info(self) -> dict[str, Any]:
        info: dict[str, Any] = await self._index.info()
        return info

    async def _check_fields(self) -> None:
        attributes = (await self.info()).get("attributes", [])
        found = {str(a[a.index("identifier") + 1]) for a in attributes if "identifier" in a}
        expected = {f.name for f in self._schema.fields.values()}
        if found != expected:
            raise IndexMismatchError(
                f"index {self.name} exists with fields {sorted(found)}, expected "
                f"{sorted(expected)}: the schema changed without a SCHEMA_VERSION bump"
            )

    async def _wait_built(self) -> bool:
        deadline = time.monotonic() + INDEX_BUILD_WAIT_SECONDS
        while True:
            info = await self.info()
            if int(info.get("indexing", 0)) == 0 and float(info.get("percent_indexed", 1)) >= 1:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_SECONDS)

    # queries ---------------------------------------------------------------------------
    async def keyword(self, terms: Sequence[str], where: FilterExpression,
                      limit: int) -> list[Hit]:
        """Documents matching any of ``terms`` in ``ix_terms``, best BM25 first."""
        query = TextQuery(" ".join(terms), "ix_terms", text_scorer=KEYWORD_SCORER,
                          filter_expression=where, num_results=limit,
                          return_fields=["ix_id"], stopwords=None)
        rows = await self._index.query(query)
        return [Hit(str(r["id"]), float(r["score"])) for r in rows]

    async def nearest(self, vector: Sequence[float], where: FilterExpression,
                      limit: int) -> list[Hit]:
        """KNN over ``emb_<dim>`` within ``where``, nearest first; score = cosine
        similarity (1 − RediSearch's cosine distance)."""
        assert self.vector_dim is not None
        query = VectorQuery(list(vector), embedding_field(self.vector_dim),
                            filter_expression=where, num_results=limit,
                            return_fields=["ix_id"])
        rows = await self._index.query(query)
        return [Hit(str(r["id"]), 1.0 - float(r["vector_distance"])) for r in rows]

    async def find(self, where: FilterExpression, *, offset: int, limit: int,
                   fields: Sequence[str] = ("ix_id",)) -> list[dict[str, Any]]:
        """Documents in ``where``, newest id first; each row has ``id`` (the key) and
        ``fields`` (as strings)."""
        query = FilterQuery(where, return_fields=list(fields), num_results=limit,
                            sort_by=("ix_id", "DESC"))
        query.paging(offset, limit)
        rows: list[dict[str, Any]] = await self._index.query(query)
        return rows

    async def top_by_evidence(self, where: FilterExpression, limit: int) -> list[str]:
        """Keys in ``where`` ordered by hits, then last_seen_at, descending."""
        request = (AggregateRequest(str(where)).load("@__key")
                   # redis-py annotates sort_by(*str) but takes Asc/Desc, as documented
                   .sort_by(Desc("@hits"), Desc("@ix_last_seen"),  # type: ignore[arg-type]
                            max=limit).dialect(2))
        result = await self._index.aggregate(request)
        return [_row(r)["__key"] for r in result.rows]

    async def state_counts(self, where: FilterExpression) -> list[tuple[str, bool, bool, int]]:
        """``(category, enabled, retired, count)`` groups of the documents in ``where``."""
        request = (AggregateRequest(str(where))
                   .group_by(["@category", "@enabled", "@ix_retired"],
                             reducers.count().alias("n")).dialect(2))
        result = await self._index.aggregate(request)
        out = []
        for raw in result.rows:
            row = _row(raw)
            out.append((row["category"], row["enabled"] == "1", row["ix_retired"] == "1",
                        int(row["n"])))
        return out


def _row(raw: Sequence[Any]) -> dict[str, str]:
    """An FT.AGGREGATE row ``[name, value, name, value, …]`` as a dict of strings."""
    def text(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    return {text(raw[i]): text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
