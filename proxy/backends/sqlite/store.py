"""Embedded :class:`~proxy.memory.store.MemoryStore` on one SQLite file.

Keyword recall is FTS5 BM25 over pre-segmented terms (:mod:`proxy.memory.text`); each row
also carries namespace tokens, so the index itself filters by user (``ns:u…``) instead of
scanning other users' rows. Only active memories are in the keyword index. Vector recall
(when memories carry embeddings) is brute-force cosine in numpy over the user's active
memories — at the per-user quota (500, seed 000 §6) that is well under a millisecond.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.memory.records import (
    MAX_SUMMARIES,
    ConversationRecord,
    Memory,
    Profile,
    from_iso,
    profile_from_json,
    profile_to_json,
    to_iso,
    utcnow,
)
from proxy.memory.store import (
    ApplyPlan,
    AuditEvent,
    AuditFilter,
    Candidate,
    ChangeSet,
    ListQuery,
    PromptVersion,
    ScanQuery,
    SearchQuery,
    StoreUnavailableError,
    UserSettings,
    VectorUpdate,
    fact_key,
    plan_apply,
    related_by_keywords,
    scope_state_counts,
    state_counts,
)
from proxy.memory.text import index_terms, load_segmenter_for, normalize, query_terms
from proxy.settings import GLOBAL_NAMESPACE

_COLUMNS = (
    "id, tenant, user_id, scope, category, subcategory, title, content, tags, subject, source, "
    "source_conversation_id, source_channel, score, embedding, enabled, hits, created_at, "
    "updated_at, last_seen_at, access_count, last_access_at, superseded_at, superseded_by, "
    "supersede_reason, embedding_model"
)
_ACTIVE = "m.enabled = 1 AND m.superseded_at IS NULL"


def content_digest(norm: str) -> str:
    """What a tombstone keeps of deleted content: its SHA-256, never the text the user
    asked to delete (it only has to recognise the fact if learning brings it back)."""
    return hashlib.sha256(norm.encode()).hexdigest()


def user_token(tenant: str, user: str) -> str:
    """Namespace token of a user's memories in the keyword index."""
    return "u" + hashlib.sha256(f"{tenant}\x1f{user}".encode()).hexdigest()[:24]


def shared_token(tenant: str) -> str:
    """Namespace token of a tenant's shared and system memories."""
    return "s" + hashlib.sha256(tenant.encode()).hexdigest()[:24]


def _ns_token(memory: Memory) -> str:
    if memory.user_id is None:
        return shared_token(memory.tenant)
    return user_token(memory.tenant, memory.user_id)


def _fts_query(tokens: Sequence[str], terms: Sequence[str]) -> str:
    ns = " OR ".join(tokens)
    words = " OR ".join('"' + t.replace('"', "") + '"' for t in terms)
    return f"ns:({ns}) AND terms:({words})"


def _np() -> Any:
    """numpy, imported on first use: only stores holding embeddings need it (~15 MB)."""
    import numpy

    return numpy


def _memory_from_row(row: Sequence[Any]) -> Memory:
    """A :class:`Memory` from a row whose first columns are :data:`_COLUMNS` (by position:
    ~3× cheaper than by name)."""
    blob = row[14]
    return Memory(
        id=row[0],
        tenant=row[1],
        user_id=row[2],
        scope=row[3],
        category=row[4],
        subcategory=row[5],
        title=row[6],
        content=row[7],
        tags=tuple(orjson.loads(row[8])),
        subject=row[9],
        source=row[10],
        source_conversation_id=row[11],
        source_channel=row[12],
        score=row[13],
        embedding=None if blob is None else tuple(
            _np().frombuffer(blob, dtype=_np().float32).tolist()),
        enabled=bool(row[15]),
        hits=row[16],
        created_at=_dt(row[17]),
        updated_at=_dt(row[18]),
        last_seen_at=_dt(row[19]),
        access_count=row[20],
        last_access_at=from_iso(row[21]),
        superseded_at=from_iso(row[22]),
        superseded_by=row[23],
        supersede_reason=row[24],
        embedding_model=row[25],
    )


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
        memory = _memory_from_row(row)
        if len(self._entries) >= self._capacity:
            self._entries.clear()
        self._entries[key] = (row, memory)
        return memory


# Vector matrices kept per owner and query shape (bytes of float32): at the per-user quota
# (500 memories, seed 000 §6) of 256-d static vectors one matrix is 0.5 MB, so ~128 users.
VECTOR_CACHE_BYTES = 64 << 20
# Decoded memories kept by owner (rows in all): the quota is 500 a user, so ~40 users.
ROW_CACHE_ROWS = 20_000

# (tenant, owner) pairs: owner = the user id, "" for shared and system memories.
Owners = tuple[tuple[str, str], ...]
# Per owner, in order: (generation, accessed) of migration 10, (0, 0) before any write.
States = tuple[tuple[int, int], ...]


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
    """``rowid → (columns of _COLUMNS)`` for the given rows, as plain tuples."""
    if not rowids:
        return {}
    cursor = conn.cursor()
    cursor.row_factory = None
    rows = cursor.execute(
        f"SELECT m.rowid, {_COLUMNS} FROM memories m "
        f"WHERE m.rowid IN ({', '.join('?' * len(rowids))})",
        tuple(rowids),
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def _dt(value: str) -> datetime:
    parsed = from_iso(value)
    assert parsed is not None
    return parsed


def _row_values(m: Memory) -> tuple[Any, ...]:
    np = _np() if m.embedding is not None else None
    embedding = None if np is None else np.asarray(m.embedding, np.float32).tobytes()
    return (
        m.id, m.tenant, m.user_id, m.scope, m.category, m.subcategory, m.title, m.content,
        orjson.dumps(list(m.tags)).decode(), m.subject, m.source, m.source_conversation_id,
        m.source_channel, m.score, embedding, int(m.enabled), m.hits, to_iso(m.created_at),
        to_iso(m.updated_at), to_iso(m.last_seen_at), m.access_count, to_iso(m.last_access_at),
        to_iso(m.superseded_at), m.superseded_by, m.supersede_reason,
        m.embedding_model if m.embedding is not None else None, normalize(m.content),
    )


def _upsert(conn: sqlite3.Connection, memory: Memory) -> None:
    conn.execute(
        f"INSERT INTO memories ({_COLUMNS}, norm) VALUES ({', '.join('?' * 27)}) "
        "ON CONFLICT(id) DO UPDATE SET "
        + ", ".join(f"{c.strip()} = excluded.{c.strip()}" for c in _COLUMNS.split(",")[1:])
        + ", norm = excluded.norm",
        _row_values(memory),
    )
    rowid = conn.execute("SELECT rowid FROM memories WHERE id = ?", (memory.id,)).fetchone()[0]
    conn.execute("DELETE FROM memories_fts WHERE rowid = ?", (rowid,))
    if memory.active:
        text = f"{memory.title}\n{memory.content}\n{' '.join(memory.tags)}"
        conn.execute(
            "INSERT INTO memories_fts (rowid, ns, terms) VALUES (?, ?, ?)",
            (rowid, _ns_token(memory), index_terms(text)),
        )


def _delete_rows(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[str]:
    rows = conn.execute(f"SELECT rowid, id FROM memories WHERE {where}", args).fetchall()
    for row in rows:
        conn.execute("DELETE FROM memories_fts WHERE rowid = ?", (row[0],))
        conn.execute("DELETE FROM memory_evidence WHERE memory_id = ?", (row[1],))
    conn.execute(f"DELETE FROM memories WHERE {where}", args)
    return [row[1] for row in rows]


def _insert_audit(conn: sqlite3.Connection, events: Sequence[AuditEvent]) -> None:
    conn.executemany(
        "INSERT INTO audit_log (at, tenant, user_id, conversation_id, actor, action, memory_id, "
        "reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (to_iso(e.at), e.tenant, e.user_id, e.conversation_id, e.actor, e.action,
             e.memory_id, e.reason, orjson.dumps(e.detail, default=str).decode())
            for e in events
        ],
    )


def _still_wanted(conn: sqlite3.Connection, changes: ChangeSet) -> list[Memory] | None:
    """The upserts that may still be written (see :class:`ChangeSet` ``learned_from``), or
    ``None`` when the user cleared their memory after the batch's messages were said."""
    if changes.learned_from is None:
        return list(changes.upserts)
    since = to_iso(changes.learned_from) or ""
    cleared = conn.execute(
        "SELECT cleared_at FROM user_settings WHERE tenant = ? AND user_id = ?",
        (changes.tenant, changes.user_id),
    ).fetchone()
    if cleared is not None and cleared[0] is not None and cleared[0] >= since:
        return None
    deleted = {
        row[0] for row in conn.execute(
            "SELECT norm FROM memory_tombstones WHERE tenant = ? AND user_id = ? AND "
            "deleted_at >= ?", (changes.tenant, changes.user_id, since))
    }
    if not deleted:
        return list(changes.upserts)
    stored = {row[0] for row in conn.execute(
        f"SELECT id FROM memories WHERE id IN ({', '.join('?' * len(changes.upserts))})",
        tuple(m.id for m in changes.upserts))} if changes.upserts else set()
    return [m for m in changes.upserts
            if m.id in stored or content_digest(normalize(m.content)) not in deleted]


def _plan(conn: sqlite3.Connection, changes: ChangeSet,
          upserts: list[Memory]) -> ApplyPlan:
    """:func:`~proxy.memory.store.plan_apply` with the stored hits and the stored duplicates
    read in the write transaction (so no other writer changes them before the commit)."""
    stored_hits: dict[str, int] = {}
    if upserts:
        stored_hits = dict(conn.execute(
            f"SELECT id, hits FROM memories WHERE tenant = ? AND user_id = ? AND id IN "
            f"({', '.join('?' * len(upserts))})",
            (changes.tenant, changes.user_id, *(m.id for m in upserts))).fetchall())
    retiring = {m.id for m in upserts if not m.active}
    duplicates: dict[str, Memory] = {}
    for memory in upserts:
        if memory.id in stored_hits or not memory.active:
            continue
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM memories m WHERE m.tenant = ? AND m.user_id = ? AND "
            "m.norm = ? AND m.enabled = 1 AND m.superseded_at IS NULL AND m.id != ?",
            (changes.tenant, changes.user_id, normalize(memory.content), memory.id),
        ).fetchall()
        key = fact_key(memory)
        for row in rows:
            stored = _memory_from_row(row)
            if stored.id not in retiring and fact_key(stored) == key:
                duplicates[memory.id] = stored
                break
    return plan_apply(changes, upserts, stored_hits=stored_hits, duplicates=duplicates)


def _channel_clause(channels: tuple[str | None, ...] | None) -> tuple[str, list[Any]]:
    """Personal memories visible in a channel: all of them in private (``None``); in a
    group only those learned in that group — never private ones (SPEC §3.10). Shared and
    system memories (no user) are visible everywhere."""
    if channels is None:
        return "", []
    named = [c for c in channels if c is not None]
    if not named:
        return " AND m.user_id IS NULL", []
    return (f" AND (m.user_id IS NULL OR m.source_channel IN ({', '.join('?' * len(named))}))",
            named)


def _put_profile(conn: sqlite3.Connection, profile: Profile) -> None:
    conn.execute(
        "INSERT INTO profiles (tenant, user_id, data, updated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(tenant, user_id) DO UPDATE SET data = excluded.data, "
        "updated_at = excluded.updated_at",
        (profile.tenant, profile.user_id, profile_to_json(profile), to_iso(utcnow())),
    )


class SqliteMemoryStore:
    """:class:`~proxy.memory.store.MemoryStore` on a
    :class:`~proxy.backends.sqlite.database.SqliteDatabase`."""

    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db
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

    async def _read(self, fn: Any) -> Any:
        try:
            return await self._db.read(fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite read failed: {exc}") from exc

    async def _write(self, fn: Any) -> Any:
        try:
            return await self._db.write(fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite write failed: {exc}") from exc

    async def ping(self) -> None:
        await self._read(lambda c: c.execute("SELECT 1").fetchone())

    async def maintain(self) -> None:
        """Merge the keyword index's segments into one (FTS5 ``'optimize'``).

        Every write adds a small FTS5 segment and FTS5's automerge keeps several levels of
        them, so a query reads each term's posting list from every segment: on the gateway
        benchmark's 500 memories, one merged segment halves a keyword query (0.28 →
        0.13 ms). Runs on the writer connection (off the loop); readers keep their WAL
        snapshot meanwhile. FTS5 returns at once when the index already is one segment."""
        await self._write(lambda c: c.execute(
            "INSERT INTO memories_fts(memories_fts) VALUES ('optimize')"))

    # hot path --------------------------------------------------------------
    async def search(self, query: SearchQuery) -> list[Candidate]:
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
                        f"WHERE memories_fts MATCH ? AND {_ACTIVE}{clause} "
                        "ORDER BY rank LIMIT ?",
                        (_fts_query(tokens, query.terms), *clause_args, query.limit),
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

        result: list[Candidate] = await self._read(run)
        return result

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
        np = _np()
        vector = np.asarray(query.embedding, dtype=np.float32)
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
                    f"AND {_ACTIVE} AND m.embedding IS NOT NULL AND length(m.embedding) = ?"
                    f"{model}{clause}", args,
                ).fetchall()
                matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32
                                       ).reshape(len(rows), vector.size)
                scanned = _Matrix(generations, [r[0] for r in rows], matrix,
                                  np.linalg.norm(matrix, axis=1))
                self._vectors.put(key, scanned)
            if not scanned.rowids:
                return
            norms = scanned.norms * (np.linalg.norm(vector) or 1.0)
            sims = (scanned.matrix @ vector) / np.where(norms == 0, 1.0, norms)
            order = [int(i) for i in np.argsort(-sims, kind="stable")[: query.limit]]
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

    async def resident(
        self, tenant: str, user: str, *, limit: int, channels: tuple[str | None, ...] | None
    ) -> list[Memory]:
        if limit <= 0:
            return []
        clause, clause_args = _channel_clause(channels)
        owners = _owners(tenant, user, include_shared=False)

        def run(conn: sqlite3.Connection) -> list[Memory]:
            with _snapshot(conn):
                states = _states(conn, owners)
                ranked = conn.execute(
                    "SELECT m.rowid FROM memories m WHERE m.tenant = ? AND m.user_id = ? "
                    f"AND {_ACTIVE} AND m.subject = 'user'{clause} "
                    "ORDER BY m.hits DESC, m.last_seen_at DESC LIMIT ?",
                    (tenant, user, *clause_args, limit),
                ).fetchall()
                rows = self._memories_by_rowid(conn, owners, states, [r[0] for r in ranked])
            return [rows[r[0]] for r in ranked]

        result: list[Memory] = await self._read(run)
        return result

    async def get_profile(self, tenant: str, user: str) -> Profile | None:
        row = await self._read(lambda c: c.execute(
            "SELECT data FROM profiles WHERE tenant = ? AND user_id = ?", (tenant, user)
        ).fetchone())
        return None if row is None else profile_from_json(tenant, user, row[0])

    async def record_access(self, tenant: str, counts: Mapping[str, int], at: datetime) -> None:
        if not counts:
            return
        stamp = to_iso(at)
        await self._write(lambda c: c.executemany(
            "UPDATE memories SET access_count = access_count + ?, last_access_at = ? "
            "WHERE id = ? AND tenant = ?",
            [(n, stamp, i, tenant) for i, n in counts.items()],
        ))

    # management ------------------------------------------------------------
    async def get(self, tenant: str, user: str | None, memory_id: str) -> Memory | None:
        def run(conn: sqlite3.Connection) -> Memory | None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM memories m WHERE m.id = ? AND m.tenant = ? "
                "AND m.user_id IS ?",
                (memory_id, tenant, user),
            ).fetchone()
            return None if row is None else _memory_from_row(row)

        result: Memory | None = await self._read(run)
        return result

    async def list_memories(self, query: ListQuery) -> list[Memory]:
        if query.scope == "personal":
            where = ["m.tenant = ?", "m.user_id = ?"]
            args: list[Any] = [query.tenant, query.user]
        else:
            where = ["m.tenant = ?", "m.user_id IS NULL", "m.scope = ?"]
            args = [query.tenant, query.scope]
        if query.enabled is not None:
            where.append("m.enabled = ?")
            args.append(int(query.enabled))
        if query.source:
            where.append("m.source = ?")
            args.append(query.source)
        if query.after:
            where.append("m.id < ?")
            args.append(query.after)
        if not query.include_retired:
            where.append("m.superseded_at IS NULL")
        if not query.include_disabled:
            where.append("m.enabled = 1")
        if query.category:
            where.append("m.category = ?")
            args.append(query.category)
        if query.text:
            await load_segmenter_for(query.text)
            for term in query_terms(query.text, limit=8) or [query.text]:
                where.append("(m.norm LIKE ? OR lower(m.title) LIKE ?)")
                pattern = f"%{term.lower()}%"
                args.extend([pattern, pattern])

        def run(conn: sqlite3.Connection) -> list[Memory]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM memories m WHERE {' AND '.join(where)} "
                "ORDER BY m.id DESC LIMIT ? OFFSET ?",
                (*args, query.limit, query.offset),
            ).fetchall()
            return [_memory_from_row(r) for r in rows]

        result: list[Memory] = await self._read(run)
        return result

    async def count(self, tenant: str, user: str) -> dict[str, int]:
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            return state_counts(tuple(row) for row in conn.execute(
                "SELECT category, enabled, superseded_at IS NOT NULL AS retired, count(*) "
                "FROM memories WHERE tenant = ? AND user_id = ? "
                "GROUP BY category, enabled, retired",
                (tenant, user),
            ))

        result: dict[str, int] = await self._read(run)
        return result

    async def add(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        def run(conn: sqlite3.Connection) -> None:
            _upsert(conn, memory)
            if audit is not None:
                _insert_audit(conn, [audit])

        await self._write(run)
        return memory

    async def update(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        def run(conn: sqlite3.Connection) -> None:
            exists = conn.execute(
                "SELECT 1 FROM memories WHERE id = ? AND tenant = ? AND user_id IS ?",
                (memory.id, memory.tenant, memory.user_id),
            ).fetchone()
            if exists is None:
                raise KeyError(memory.id)
            _upsert(conn, memory)
            if audit is not None:
                _insert_audit(conn, [audit])

        await self._write(run)
        return memory

    async def delete(
        self, tenant: str, user: str, memory_id: str, *, audit: AuditEvent | None = None
    ) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT norm FROM memories WHERE id = ? AND tenant = ? AND user_id = ?",
                (memory_id, tenant, user),
            ).fetchone()
            if row is None:
                return False
            _delete_rows(conn, "id = ?", (memory_id,))
            conn.execute(
                "INSERT OR REPLACE INTO memory_tombstones (tenant, user_id, norm, deleted_at) "
                "VALUES (?, ?, ?, ?)",
                (tenant, user, content_digest(row[0]), to_iso(utcnow())),
            )
            if audit is not None:
                _insert_audit(conn, [audit])
            return True

        result: bool = await self._write(run)
        return result

    async def clear(self, tenant: str, user: str, *, audit: AuditEvent | None = None) -> int:
        now = to_iso(utcnow())

        def run(conn: sqlite3.Connection) -> int:
            removed = _delete_rows(conn, "tenant = ? AND user_id = ?", (tenant, user))
            conn.execute("DELETE FROM profiles WHERE tenant = ? AND user_id = ?", (tenant, user))
            conn.execute("DELETE FROM conversations WHERE tenant = ? AND user_id = ?",
                         (tenant, user))
            conn.execute(
                "INSERT INTO user_settings (tenant, user_id, cleared_at) VALUES (?, ?, ?) "
                "ON CONFLICT(tenant, user_id) DO UPDATE SET cleared_at = excluded.cleared_at",
                (tenant, user, now),
            )
            if audit is not None:
                _insert_audit(conn, [audit])
            return len(removed)

        result: int = await self._write(run)
        return result

    # learning --------------------------------------------------------------
    async def related(self, tenant: str, user: str, text: str, *, limit: int) -> list[Memory]:
        return await related_by_keywords(self, tenant, user, text, limit=limit)

    async def apply(self, changes: ChangeSet) -> bool:
        now = to_iso(utcnow())

        def run(conn: sqlite3.Connection) -> bool:
            done = conn.execute(
                "INSERT OR IGNORE INTO applied_batches (batch_key, applied_at) VALUES (?, ?)",
                (changes.batch_key, now),
            )
            if done.rowcount == 0:
                return False
            for memory in changes.upserts:
                if memory.tenant != changes.tenant or memory.user_id != changes.user_id:
                    raise ValueError("a change set may only touch its own namespace")
            upserts = _still_wanted(conn, changes)
            if upserts is None:
                return False
            plan = _plan(conn, changes, upserts)
            for memory in plan.upserts:
                _upsert(conn, memory)
            for memory_id, key in plan.evidence:
                added = conn.execute(
                    "INSERT OR IGNORE INTO memory_evidence (memory_id, evidence_key, at) "
                    "VALUES (?, ?, ?)", (memory_id, key, now)).rowcount
                if added and memory_id in plan.counted:  # atomic: under the write lock
                    conn.execute("UPDATE memories SET hits = hits + 1 WHERE id = ?",
                                 (memory_id,))
            for memory_id in changes.deletes:
                _delete_rows(conn, "id = ? AND tenant = ? AND user_id = ?",
                             (memory_id, changes.tenant, changes.user_id))
            if changes.profile is not None:
                _put_profile(conn, changes.profile)
            if changes.conversation is not None:
                record = changes.conversation
                conn.execute(
                    "INSERT INTO conversations (tenant, user_id, conversation_id, score, "
                    "dimensions, reason, learned_messages, updated_at, summary) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(tenant, user_id, conversation_id) DO UPDATE SET "
                    "score = excluded.score, dimensions = excluded.dimensions, "
                    "reason = excluded.reason, "
                    "learned_messages = conversations.learned_messages + "
                    "excluded.learned_messages, updated_at = excluded.updated_at, "
                    "summary = CASE WHEN excluded.summary != '' THEN excluded.summary "
                    "ELSE conversations.summary END",
                    (record.tenant, record.user_id, record.conversation_id, record.score,
                     orjson.dumps(record.dimensions).decode(), record.reason,
                     record.learned_messages, to_iso(record.updated_at), record.summary),
                )
                if record.summary:
                    conn.execute(
                        "UPDATE conversations SET summary = '' WHERE tenant = ? AND "
                        "user_id = ? AND summary != '' AND conversation_id NOT IN (SELECT "
                        "conversation_id FROM conversations WHERE tenant = ? AND user_id = ? "
                        "AND summary != '' ORDER BY updated_at DESC LIMIT ?)",
                        (record.tenant, record.user_id, record.tenant, record.user_id,
                         MAX_SUMMARIES),
                    )
            _insert_audit(conn, plan.audit)
            return True

        result: bool = await self._write(run)
        return result

    async def scan(self, query: ScanQuery) -> list[Memory]:
        where, args = ["m.user_id IS NOT NULL"], []  # type: list[str], list[Any]
        if query.tenant is not None:
            where.append("m.tenant = ?")
            args.append(query.tenant)
        if query.user is not None:
            where.append("m.user_id = ?")
            args.append(query.user)
        if query.channel is not None:
            where.append("m.source_channel = ?")
            args.append(query.channel)
        if query.created_before is not None:
            where.append("m.created_at < ?")
            args.append(to_iso(query.created_before))
        if query.never_accessed:
            where.append("m.access_count = 0")

        def run(conn: sqlite3.Connection) -> list[Memory]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM memories m WHERE {' AND '.join(where)} "
                "ORDER BY m.created_at LIMIT ?", (*args, query.limit),
            ).fetchall()
            return [_memory_from_row(r) for r in rows]

        result: list[Memory] = await self._read(run)
        return result

    async def tombstoned(
        self, tenant: str, user: str, norms: Sequence[str]
    ) -> dict[str, datetime]:
        if not norms:
            return {}

        by_digest = {content_digest(n): n for n in norms}

        def run(conn: sqlite3.Connection) -> dict[str, datetime]:
            rows = conn.execute(
                "SELECT norm, deleted_at FROM memory_tombstones WHERE tenant = ? AND "
                f"user_id = ? AND norm IN ({', '.join('?' * len(by_digest))})",
                (tenant, user, *by_digest),
            ).fetchall()
            return {by_digest[r[0]]: _dt(r[1]) for r in rows}

        result: dict[str, datetime] = await self._read(run)
        return result

    async def put_profile(self, profile: Profile) -> None:
        await self._write(lambda c: _put_profile(c, profile))

    async def get_conversation(
        self, tenant: str, user: str, conversation_id: str
    ) -> ConversationRecord | None:
        row = await self._read(lambda c: c.execute(
            "SELECT score, dimensions, reason, learned_messages, updated_at, summary "
            "FROM conversations "
            "WHERE tenant = ? AND user_id = ? AND conversation_id = ?",
            (tenant, user, conversation_id),
        ).fetchone())
        if row is None:
            return None
        return ConversationRecord(
            tenant=tenant, user_id=user, conversation_id=conversation_id, score=row[0],
            dimensions=orjson.loads(row[1]), reason=row[2], learned_messages=row[3],
            updated_at=_dt(row[4]), summary=row[5],
        )

    async def bind_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        keys = sorted({normalize(n) for n in names if normalize(n)})
        if not keys:
            return
        stamp = to_iso(utcnow())
        await self._write(lambda c: c.executemany(
            "INSERT INTO user_names (tenant, name, user_id, seen_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(tenant, name, user_id) DO UPDATE SET seen_at = excluded.seen_at",
            [(tenant, key, user, stamp) for key in keys],
        ))

    async def users_named(self, tenant: str, name: str) -> list[str]:
        key = normalize(name)
        rows = await self._read(lambda c: c.execute(
            "SELECT user_id FROM user_names WHERE tenant = ? AND name = ? ORDER BY user_id",
            (tenant, key),
        ).fetchall())
        return [r[0] for r in rows]

    async def get_user_settings(self, tenant: str, user: str) -> UserSettings:
        row = await self._read(lambda c: c.execute(
            "SELECT enable_personal_learning, show_learning_indicator, cleared_at "
            "FROM user_settings WHERE tenant = ? AND user_id = ?",
            (tenant, user),
        ).fetchone())
        if row is None:
            return UserSettings()
        return UserSettings(bool(row[0]), bool(row[1]), from_iso(row[2]))

    async def put_user_settings(self, tenant: str, user: str, settings: UserSettings) -> None:
        await self._write(lambda c: c.execute(
            "INSERT INTO user_settings (tenant, user_id, enable_personal_learning, "
            "show_learning_indicator, cleared_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(tenant, user_id) DO UPDATE SET "
            "enable_personal_learning = excluded.enable_personal_learning, "
            "show_learning_indicator = excluded.show_learning_indicator, "
            "cleared_at = excluded.cleared_at",
            (tenant, user, int(settings.enable_personal_learning),
             int(settings.show_learning_indicator), to_iso(settings.cleared_at)),
        ))

    async def audit(self, events: Sequence[AuditEvent]) -> None:
        if events:
            await self._write(lambda c: _insert_audit(c, events))

    async def save_prompt(self, tenant: str, kind: str, text: str, actor: str,
                          at: datetime) -> PromptVersion:
        def run(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT coalesce(max(version), 0) FROM prompts WHERE tenant = ? AND kind = ?",
                (tenant, kind)).fetchone()
            version = int(row[0]) + 1
            conn.execute("INSERT INTO prompts (tenant, kind, version, text, actor, at) VALUES "
                         "(?, ?, ?, ?, ?, ?)", (tenant, kind, version, text, actor, to_iso(at)))
            return version

        version: int = await self._write(run)
        return PromptVersion(tenant=tenant, kind=kind, version=version, text=text,  # type: ignore[arg-type]
                             actor=actor, at=at)

    async def prompt_versions(self, tenant: str, kind: str, *,
                              limit: int = 20) -> list[PromptVersion]:
        rows = await self._read(lambda c: c.execute(
            "SELECT version, text, actor, at FROM prompts WHERE tenant = ? AND kind = ? "
            "ORDER BY version DESC LIMIT ?", (tenant, kind, limit)).fetchall())
        return [PromptVersion(tenant=tenant, kind=kind, version=r[0], text=r[1],  # type: ignore[arg-type]
                              actor=r[2], at=_dt(r[3])) for r in rows]

    async def audit_log(
        self, tenant: str, user: str | None, *, limit: int = 100, before_id: int | None = None
    ) -> list[tuple[int, AuditEvent]]:
        return await self.audit_search(tenant, AuditFilter(user=user), limit=limit,
                                       before_id=before_id)

    # issue 13: admin governance ----------------------------------------------------------
    async def audit_search(self, tenant: str, where: AuditFilter, *, limit: int = 100,
                           before_id: int | None = None) -> list[tuple[int, AuditEvent]]:
        clauses: list[str] = ["tenant = ?"]
        args: list[Any] = [tenant]
        for column, value in (("user_id", where.user), ("action", where.action),
                              ("actor", where.actor),
                              ("conversation_id", where.conversation)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if where.since is not None:
            clauses.append("at >= ?")
            args.append(to_iso(where.since) or "")
        if where.until is not None:
            clauses.append("at < ?")
            args.append(to_iso(where.until) or "")
        if before_id is not None:
            clauses.append("id < ?")
            args.append(before_id)

        def run(conn: sqlite3.Connection) -> list[tuple[int, AuditEvent]]:
            rows = conn.execute(
                "SELECT id, at, tenant, user_id, conversation_id, actor, action, memory_id, "
                f"reason, detail FROM audit_log WHERE {' AND '.join(clauses)} "
                "ORDER BY id DESC LIMIT ?", (*args, max(0, limit))).fetchall()
            return [(r[0], AuditEvent(
                tenant=r[2], user_id=r[3], conversation_id=r[4], actor=r[5], action=r[6],
                memory_id=r[7], reason=r[8], detail=orjson.loads(r[9]), at=_dt(r[1])))
                for r in rows]

        result: list[tuple[int, AuditEvent]] = await self._read(run)
        return result

    async def audit_counts(self, tenant: str, *, since: datetime
                           ) -> dict[tuple[str, str, str], int]:
        rows = await self._read(lambda c: c.execute(
            "SELECT substr(at, 1, 10), action, actor, count(*) FROM audit_log "
            "WHERE tenant = ? AND at >= ? GROUP BY 1, 2, 3",
            (tenant, to_iso(since))).fetchall())
        return {(r[0], r[1], r[2]): int(r[3]) for r in rows}

    async def tenant_counts(self, tenant: str) -> dict[str, dict[str, int]]:
        def run(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
            return scope_state_counts(tuple(row) for row in conn.execute(
                "SELECT scope, category, enabled, superseded_at IS NOT NULL, count(*) "
                "FROM memories WHERE tenant = ? GROUP BY 1, 2, 3, 4", (tenant,),
            ))

        result: dict[str, dict[str, int]] = await self._read(run)
        return result

    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        row = await self._read(lambda c: c.execute(
            "SELECT data FROM tenant_settings WHERE tenant = ?", (tenant,)).fetchone())
        return {} if row is None else dict(orjson.loads(row[0]))

    async def put_tenant_settings(self, tenant: str, overrides: Mapping[str, object]
                                  ) -> None:
        data = orjson.dumps(dict(overrides)).decode()
        await self._write(lambda c: c.execute(
            "INSERT INTO tenant_settings (tenant, data, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT(tenant) DO UPDATE SET data = excluded.data, "
            "updated_at = excluded.updated_at", (tenant, data, to_iso(utcnow()))))

    # issue 12: erasure ---------------------------------------------------------------
    async def erase_user(self, tenant: str, user: str, *, audit: AuditEvent) -> int:
        marker = to_iso(utcnow())
        owner = (tenant, user)

        def run(conn: sqlite3.Connection) -> int:
            # Keyword-index rows first (by rowid), then the memories: one transaction.
            conn.execute(
                "DELETE FROM memories_fts WHERE rowid IN (SELECT rowid FROM memories "
                "WHERE tenant = ? AND user_id = ?)", owner)
            conn.execute(
                "DELETE FROM memory_evidence WHERE memory_id IN (SELECT id FROM memories "
                "WHERE tenant = ? AND user_id = ?)", owner)
            removed = conn.execute("DELETE FROM memories WHERE tenant = ? AND user_id = ?",
                                   owner).rowcount
            for table in ("memory_tombstones", "profiles", "conversations", "user_names",
                          "audit_log", "user_settings"):
                conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND user_id = ?", owner)
            conn.execute("INSERT INTO user_settings (tenant, user_id, cleared_at) "
                         "VALUES (?, ?, ?)", (tenant, user, marker))
            _insert_audit(conn, [audit])
            return int(removed)

        result: int = await self._write(run)
        return result

    async def delete_shared(self, tenant: str, memory_id: str, *,
                            audit: AuditEvent | None = None) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT 1 FROM memories WHERE id = ? AND tenant = ? AND "
                               "user_id IS NULL", (memory_id, tenant)).fetchone()
            if row is None:
                return False
            _delete_rows(conn, "id = ?", (memory_id,))
            if audit is not None:
                _insert_audit(conn, [audit])
            return True

        result: bool = await self._write(run)
        return result

    # vectors kept consistent with the embedder (memory-proxy reindex) -------------------
    async def stale_vectors(self, model: str, *, limit: int,
                            cursor: str = "") -> tuple[list[Memory], str]:
        after = int(cursor) if cursor.isdigit() else 0

        def run(conn: sqlite3.Connection) -> tuple[list[Memory], str]:
            cur = conn.cursor()
            cur.row_factory = None
            rows = cur.execute(
                f"SELECT m.rowid, {_COLUMNS} FROM memories m WHERE m.rowid > ? AND {_ACTIVE} "
                "AND (m.embedding IS NULL OR m.embedding_model IS NULL "
                "OR m.embedding_model != ?) ORDER BY m.rowid LIMIT ?",
                (after, model, max(1, limit)),
            ).fetchall()
            following = str(rows[-1][0]) if len(rows) >= max(1, limit) else ""
            return [_memory_from_row(r[1:]) for r in rows], following

        result: tuple[list[Memory], str] = await self._read(run)
        return result

    async def set_vectors(self, updates: Sequence[VectorUpdate]) -> int:
        if not updates:
            return 0
        np = _np()

        def run(conn: sqlite3.Connection) -> int:
            written = 0
            for u in updates:
                written += conn.execute(
                    "UPDATE memories SET embedding = ?, embedding_model = ? WHERE id = ? "
                    "AND tenant = ? AND user_id IS ? AND content = ?",
                    (np.asarray(u.embedding, np.float32).tobytes(), u.model, u.memory_id,
                     u.tenant, u.user_id, u.content),
                ).rowcount
            return written

        result: int = await self._write(run)
        return result
