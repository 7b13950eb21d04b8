"""Recall reads of the SQLite store: FTS5 keyword search, brute-force vector search, the
resident layer, and the caches that let a recall skip re-reading and re-decoding rows.

Keyword recall is FTS5 BM25 over pre-segmented terms (:mod:`proxy.memory.text`); each row
also carries namespace tokens, so the index itself filters by user (``ns:u…``) instead of
scanning other users' rows. Only active memories are in the keyword index. Vector recall
(when memories carry embeddings) is brute-force cosine in numpy over the user's active
memories — at the default per-user quota (``quotas.max_memory_per_user``, 500) that is
well under a millisecond.

:class:`Recall` builds each read as a function of a connection, run by the store on the
reader thread: a recall's searches, resident and profile reads share one thread hop
(:meth:`~proxy.backends.sqlite.database.SqliteDatabase.read` batches them). The caches are
used from the reader thread only, and each entry is validated against the per-owner
counters of ``memory_generations`` read in the same snapshot, so a write of any connection
or process is seen on the next read.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.backends.sqlite.codec import (
    ACTIVE,
    COLUMNS,
    memory_from_row,
    np,
    shared_token,
    user_token,
)
from proxy.memory.index import memory_terms
from proxy.memory.records import Memory
from proxy.memory.store import Bm25, Candidate, KeywordStatistics, RecallCorpus, SearchQuery
from proxy.settings import GLOBAL_NAMESPACE

# Vector matrices kept per owner and query shape (bytes of float32): at the default
# per-user quota (500 memories) of 256-d static vectors one matrix is 0.5 MB, so ~128 users.
VECTOR_CACHE_BYTES = 64 << 20
# Decoded memories kept by owner (rows in all): the quota is 500 a user, so ~40 users.
ROW_CACHE_ROWS = 20_000

# FTS5's bm25() (k1 1.2, b 0.75, its IDF) over rows whose length also counts the one
# namespace token of the ``ns`` column.
FTS5_BM25 = Bm25(k1=1.2, b=0.75, idf_form="fts5", extra_length=1)

# (tenant, owner) pairs: owner = the user id, "" for shared and system memories.
Owners = tuple[tuple[str, str], ...]
# Per owner, in order: (generation, accessed) of migration 10, (0, 0) before any write.
States = tuple[tuple[int, int], ...]


# Terms per query of the document-frequency read (SQLite's default variable limit: 32 766).
_VOCAB_CHUNK = 500


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """SQLite's varint at ``data[at:]`` (big-endian 7-bit groups, a full 9th byte) and the
    offset after it."""
    value = 0
    for k in range(8):
        byte = data[at + k]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + k + 1
    return (value << 8) | data[at + 8], at + 9


def keyword_statistics(conn: sqlite3.Connection, terms: set[str]) -> KeywordStatistics:
    """FTS5's own BM25 statistics, as ``bm25()`` reads them: the row count and the
    token totals of its averages record (row 1 of ``memories_fts_data``: varints nRow,
    then the tokens of each column), and each of ``terms``' document count in the
    ``terms`` column (an ``fts5vocab`` table of the connection's temp schema). Run inside
    the caller's snapshot."""
    row = conn.execute("SELECT block FROM memories_fts_data WHERE id = 1").fetchone()
    documents = total = 0
    if row is not None and row[0]:
        data = bytes(row[0])
        documents, at = _varint(data, 0)
        while at < len(data):
            tokens, at = _varint(data, at)
            total += tokens
    frequencies: dict[str, int] = {}
    ordered = sorted(terms)
    for start in range(0, len(ordered), _VOCAB_CHUNK):
        chunk = ordered[start:start + _VOCAB_CHUNK]
        frequencies.update(conn.execute(
            "SELECT term, doc FROM temp.memories_vocab WHERE col = 'terms' AND term IN "
            f"({', '.join('?' * len(chunk))})", chunk).fetchall())
    return KeywordStatistics(documents, total, frequencies)


def fts_query(tokens: Sequence[str], terms: Sequence[str]) -> str:
    """The FTS5 ``MATCH`` expression: any of the namespace ``tokens`` and any ``terms``."""
    ns = " OR ".join(tokens)
    words = " OR ".join('"' + t.replace('"', "") + '"' for t in terms)
    return f"ns:({ns}) AND terms:({words})"


class _MemoryCache:
    """Decoded memories keyed by id and validated by the whole stored row.

    A :class:`Memory` is a pure function of its row, so an entry is reused only when every
    column is unchanged: no invalidation is needed and a write is seen on the next read.
    Saves the decoding (timestamps, tags, embedding) of the same rows request after
    request (bench/gateway: ~8 µs a row, 36 rows a recall). Bounded: cleared when full.
    Used from the reader thread only.
    """

    def __init__(self, capacity: int = 20_000) -> None:
        self._entries: dict[str, tuple[tuple[Any, ...], Memory]] = {}
        self._capacity = capacity

    def memory(self, row: tuple[Any, ...]) -> Memory:
        key = row[0]
        found = self._entries.get(key)
        if found is not None and found[0] == row:
            return found[1]
        memory = memory_from_row(row)
        if len(self._entries) >= self._capacity:
            self._entries.clear()
        self._entries[key] = (row, memory)
        return memory


def _owners(tenant: str, user: str, *, include_shared: bool) -> Owners:
    """The owners whose memories a search of ``user`` may return."""
    if include_shared:
        return ((tenant, user), (tenant, ""), (GLOBAL_NAMESPACE, ""))
    return ((tenant, user),)


def _states(conn: sqlite3.Connection, owners: Owners) -> States:
    """Each owner's counters (``memory_generations``, kept by triggers in every writer's
    transaction), read in the caller's snapshot."""
    rows = conn.execute(
        "SELECT tenant, owner, generation, accessed FROM memory_generations WHERE "
        + " OR ".join(["(tenant = ? AND owner = ?)"] * len(owners)),
        tuple(part for pair in owners for part in pair),
    ).fetchall()
    found = {(r[0], r[1]): (r[2], r[3]) for r in rows}
    return tuple(found.get(pair, (0, 0)) for pair in owners)


@dataclass(frozen=True, slots=True)
class _Matrix:
    """What a vector scan found: the rows' ids, their float32 vectors and norms, and the
    owners' generations when it was read."""

    generations: tuple[int, ...]
    rowids: list[int]
    matrix: Any  # numpy float32, len(rowids) × dimension
    norms: Any  # numpy float32, the rows' L2 norms


class _VectorCache:
    """Vector scans (``rowid, embedding`` of the owners' active memories) reused while the
    owners' generations are unchanged — access statistics do not change a vector — so a
    write of any connection or process is seen on the next search. Saves reading and
    decoding every vector of the user per query (bench/gateway gw-static: ~0.5 ms a query
    at 500 memories). Least recently used first out beyond :data:`VECTOR_CACHE_BYTES`.
    Used from the reader thread only."""

    def __init__(self, capacity_bytes: int = VECTOR_CACHE_BYTES) -> None:
        self._entries: OrderedDict[tuple[Any, ...], _Matrix] = OrderedDict()
        self._bytes = 0
        self._capacity = capacity_bytes

    def get(self, key: tuple[Any, ...], generations: tuple[int, ...]) -> _Matrix | None:
        found = self._entries.get(key)
        if found is None or found.generations != generations:
            return None
        self._entries.move_to_end(key)
        return found

    def put(self, key: tuple[Any, ...], entry: _Matrix) -> None:
        previous = self._entries.pop(key, None)
        if previous is not None:
            self._bytes -= previous.matrix.nbytes
        if entry.matrix.nbytes > self._capacity:
            return
        self._entries[key] = entry
        self._bytes += entry.matrix.nbytes
        while self._bytes > self._capacity:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.matrix.nbytes


class _RowCache:
    """Decoded memories by rowid per owner group, reused while every owner's counters
    (generation and accessed: any change to any column) are unchanged, so reading the
    columns of the same winners request after request is skipped (bench/gateway: ~0.1 ms
    a query for 30 rows). A changed state starts the group afresh. Least recently used
    groups first out beyond :data:`ROW_CACHE_ROWS`. Used from the reader thread only."""

    def __init__(self, capacity_rows: int = ROW_CACHE_ROWS) -> None:
        self._entries: OrderedDict[Owners, tuple[States, dict[int, Memory]]] = OrderedDict()
        self._rows = 0
        self._capacity = capacity_rows

    def group(self, owners: Owners, states: States) -> dict[int, Memory]:
        found = self._entries.pop(owners, None)
        if found is not None and found[0] != states:
            self._rows -= len(found[1])
            found = None
        if found is None:
            found = (states, {})
        self._entries[owners] = found
        return found[1]

    def grew(self, rows: int) -> None:
        self._rows += rows
        while self._rows > self._capacity and self._entries:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._rows -= len(dropped)


@contextlib.contextmanager
def _snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """One read transaction: the statements inside see the same committed state."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")


def _rows_by_rowid(conn: sqlite3.Connection, rowids: Sequence[int]) -> dict[int, tuple[Any, ...]]:
    """``rowid → (columns of COLUMNS)`` for the given rows, as plain tuples."""
    if not rowids:
        return {}
    cursor = conn.cursor()
    cursor.row_factory = None
    rows = cursor.execute(
        f"SELECT m.rowid, {COLUMNS} FROM memories m "
        f"WHERE m.rowid IN ({', '.join('?' * len(rowids))})",
        tuple(rowids),
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def _channel_clause(channels: tuple[str | None, ...] | None) -> tuple[str, list[Any]]:
    """Personal memories visible in a channel: all of them in private (``None``); in a
    group only those learned in that group — never private ones, so a group never hears
    what a member said in private. Shared and system memories (no user) are visible
    everywhere."""
    if channels is None:
        return "", []
    named = [c for c in channels if c is not None]
    if not named:
        return " AND m.user_id IS NULL", []
    return (f" AND (m.user_id IS NULL OR m.source_channel IN ({', '.join('?' * len(named))}))",
            named)


class Recall:
    """The recall reads of one store and the caches behind them (decoded memories, row
    groups, vector matrices). Each method returns the read as a function of the reader
    connection; the store runs it on the reader thread."""

    def __init__(self) -> None:
        self._memories = _MemoryCache()
        self._vectors = _VectorCache()
        self._rows = _RowCache()

    def _memories_by_rowid(self, conn: sqlite3.Connection, owners: Owners, states: States,
                           rowids: Sequence[int]) -> dict[int, Memory]:
        """``rowid → Memory`` holding at least ``rowids`` (rows of ``owners``, whose
        counters in this snapshot are ``states``): cached rows, the others read."""
        group = self._rows.group(owners, states)
        missing = [r for r in rowids if r not in group]
        if missing:
            fetched = _rows_by_rowid(conn, missing)
            for rowid, row in fetched.items():
                group[rowid] = self._memories.memory(row)
            self._rows.grew(len(fetched))
        return group

    def search(self, query: SearchQuery) -> Callable[[sqlite3.Connection], list[Candidate]]:
        """The read answering ``query``: keyword candidates (BM25 rank and score), then
        vector candidates merged into them (cosine rank and score)."""
        tokens = [user_token(query.tenant, query.user)]
        if query.include_shared:
            tokens += [shared_token(query.tenant), shared_token(GLOBAL_NAMESPACE)]
        clause, clause_args = _channel_clause(query.channels)
        owners = _owners(query.tenant, query.user, include_shared=query.include_shared)

        def run(conn: sqlite3.Connection) -> list[Candidate]:
            found: dict[str, Candidate] = {}
            if query.terms:
                # Rank on (rowid, score) only, then read the winners' columns (those not
                # cached): the sorter no longer carries every column of every match.
                with _snapshot(conn):
                    states = _states(conn, owners)
                    ranked = conn.execute(
                        "SELECT memories_fts.rowid, bm25(memories_fts, 0.0, 1.0) AS rank "
                        "FROM memories_fts JOIN memories m ON m.rowid = memories_fts.rowid "
                        f"WHERE memories_fts MATCH ? AND {ACTIVE}{clause} "
                        "ORDER BY rank LIMIT ?",
                        (fts_query(tokens, query.terms), *clause_args, query.limit),
                    ).fetchall()
                    rows = self._memories_by_rowid(conn, owners, states,
                                                   [r[0] for r in ranked])
                for rank, (rowid, score) in enumerate(ranked, start=1):
                    memory = rows[rowid]
                    found[memory.id] = Candidate(memory, keyword_rank=rank,
                                                 keyword_score=-float(score))
            if query.embedding is not None:
                self._vector_candidates(conn, query, owners=owners, clause=clause,
                                        clause_args=clause_args, found=found)
            return list(found.values())

        return run

    def _vector_candidates(
        self,
        conn: sqlite3.Connection,
        query: SearchQuery,
        *,
        owners: Owners,
        clause: str,
        clause_args: list[Any],
        found: dict[str, Candidate],
    ) -> None:
        assert query.embedding is not None
        owner = "m.tenant = ? AND (m.user_id = ?" + \
            (" OR m.user_id IS NULL) OR (m.tenant = ? AND m.user_id IS NULL)"
             if query.include_shared else ")")
        numpy = np()
        vector = numpy.asarray(query.embedding, dtype=numpy.float32)
        # Only vectors of the query's length and model (or of no recorded model): after a
        # model change, vectors of the other model are skipped until reindexed (keyword
        # recall still finds those memories).
        model = "" if query.embedding_model is None else \
            " AND (m.embedding_model IS NULL OR m.embedding_model = ?)"
        cursor = conn.cursor()
        cursor.row_factory = None
        args = (query.tenant, query.user,
                *((GLOBAL_NAMESPACE,) if query.include_shared else ()), vector.nbytes,
                *(() if query.embedding_model is None else (query.embedding_model,)),
                *clause_args)
        # Scan (rowid, vector) only and decode the blobs in one call, then read the
        # winners' columns (through the decoded-memory cache): reading every column of
        # every row cost ~20 ms a request at 500 memories (bench/gateway gw-static). The
        # scan itself is reused while its owners' generations are unchanged.
        with _snapshot(conn):
            states = _states(conn, owners)
            generations = tuple(generation for generation, _ in states)
            key = (owner, model, clause, args)
            scanned = self._vectors.get(key, generations)
            if scanned is None:
                rows = cursor.execute(
                    f"SELECT m.rowid, m.embedding FROM memories m WHERE ({owner}) "
                    f"AND {ACTIVE} AND m.embedding IS NOT NULL AND length(m.embedding) = ?"
                    f"{model}{clause}", args,
                ).fetchall()
                matrix = numpy.frombuffer(b"".join(r[1] for r in rows), dtype=numpy.float32
                                          ).reshape(len(rows), vector.size)
                scanned = _Matrix(generations, [r[0] for r in rows], matrix,
                                  numpy.linalg.norm(matrix, axis=1))
                self._vectors.put(key, scanned)
            if not scanned.rowids:
                return
            norms = scanned.norms * (numpy.linalg.norm(vector) or 1.0)
            sims = (scanned.matrix @ vector) / numpy.where(norms == 0, 1.0, norms)
            order = [int(i) for i in numpy.argsort(-sims, kind="stable")[: query.limit]]
            columns = self._memories_by_rowid(conn, owners, states,
                                              [scanned.rowids[i] for i in order])
        for rank, index in enumerate(order, start=1):
            memory = columns[scanned.rowids[index]]
            previous = found.get(memory.id)
            found[memory.id] = Candidate(
                previous.memory if previous else memory,
                keyword_rank=previous.keyword_rank if previous else None,
                keyword_score=previous.keyword_score if previous else None,
                vector_rank=rank,
                vector_score=float(sims[index]),
            )

    def resident(self, tenant: str, user: str, *, limit: int,
                 channels: tuple[str | None, ...] | None
                 ) -> Callable[[sqlite3.Connection], list[Memory]]:
        """The read of the user's top ``limit`` active memories about themselves, by
        evidence (hits) then recency (``last_seen_at``), visible in ``channels``."""
        clause, clause_args = _channel_clause(channels)
        owners = _owners(tenant, user, include_shared=False)

        def run(conn: sqlite3.Connection) -> list[Memory]:
            with _snapshot(conn):
                states = _states(conn, owners)
                ranked = conn.execute(
                    "SELECT m.rowid FROM memories m WHERE m.tenant = ? AND m.user_id = ? "
                    f"AND {ACTIVE} AND m.subject = 'user'{clause} "
                    "ORDER BY m.hits DESC, m.last_seen_at DESC LIMIT ?",
                    (tenant, user, *clause_args, limit),
                ).fetchall()
                rows = self._memories_by_rowid(conn, owners, states, [r[0] for r in ranked])
            return [rows[r[0]] for r in ranked]

        return run

    def generations(self, tenant: str, user: str
                    ) -> Callable[[sqlite3.Connection], tuple[int, ...]]:
        """The read of the recall owners' generations (``memory_generations``)."""
        owners = _owners(tenant, user, include_shared=True)

        def run(conn: sqlite3.Connection) -> tuple[int, ...]:
            return tuple(generation for generation, _ in _states(conn, owners))

        return run

    def corpus(self, tenant: str, user: str) -> Callable[[sqlite3.Connection], RecallCorpus]:
        """The read of every active memory of the recall owners, with their generations
        and FTS5's statistics in the same snapshot. Runs on the store's bulk thread, so it
        leaves the reader thread's caches alone."""
        owners = _owners(tenant, user, include_shared=True)

        def run(conn: sqlite3.Connection) -> RecallCorpus:
            conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.memories_vocab USING "
                         "fts5vocab(main, memories_fts, col)")
            cursor = conn.cursor()
            cursor.row_factory = None
            with _snapshot(conn):
                states = _states(conn, owners)
                rows = cursor.execute(
                    f"SELECT {COLUMNS} FROM memories m WHERE ((m.tenant = ? AND "
                    "(m.user_id = ? OR m.user_id IS NULL)) OR (m.tenant = ? AND "
                    f"m.user_id IS NULL)) AND {ACTIVE} ORDER BY m.rowid",
                    (tenant, user, GLOBAL_NAMESPACE),
                ).fetchall()
                memories = tuple(memory_from_row(r) for r in rows)
                statistics = keyword_statistics(
                    conn, {t for m in memories for t in memory_terms(m)})
            return RecallCorpus(tuple(g for g, _ in states), memories, FTS5_BM25,
                                statistics=statistics)

        return run
