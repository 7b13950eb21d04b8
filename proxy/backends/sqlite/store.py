"""Embedded :class:`~proxy.memory.store.MemoryStore` on one SQLite file: the store class
and memories CRUD.

The parts live beside it: row codec and index tokens :mod:`proxy.backends.sqlite.codec`;
row writes with their keyword-index rows :mod:`proxy.backends.sqlite.rows`; keyword and
vector recall with their caches :mod:`proxy.backends.sqlite.search`; the at-most-once
apply of learned changes :mod:`proxy.backends.sqlite.apply`; user and tenant records,
prompts and erasure :mod:`proxy.backends.sqlite.users`; the learning log
:mod:`proxy.backends.sqlite.audit`. Each is a function of a connection that this class runs
on the database's reader thread or inside one write transaction, translating every
``sqlite3`` failure into :class:`~proxy.memory.store.StoreUnavailableError`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import structlog

from proxy.backends.sqlite import conflicts, injections, synonyms, users
from proxy.backends.sqlite.apply import apply_changes
from proxy.backends.sqlite.audit import count_events, insert_events, search_events
from proxy.backends.sqlite.codec import (
    ACTIVE,
    COLUMNS,
    content_digest,
    memory_from_row,
    np,
)
from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.rows import delete_memories, upsert_memory
from proxy.backends.sqlite.search import Recall
from proxy.memory.conflicts import Conflict, ProfileWeek
from proxy.memory.explain import InjectionRecord, RecordRow
from proxy.memory.records import ConversationRecord, Memory, Profile, to_iso, utcnow
from proxy.memory.store import (
    DEFAULT_PURGE_SECONDS,
    AuditEvent,
    AuditFilter,
    Candidate,
    ChangeSet,
    ListQuery,
    PromptVersion,
    RecallCorpus,
    ScanQuery,
    SearchQuery,
    StoreUnavailableError,
    UserSettings,
    VectorUpdate,
    related_by_keywords,
)
from proxy.memory.synonyms import SynonymCandidate, SynonymExample, SynonymStatus
from proxy.memory.text import load_segmenter_for, normalize, query_terms
from proxy.memory.writes import scope_state_counts, state_counts

T = TypeVar("T")
log = structlog.get_logger("proxy.memory.sqlite")


class SqliteMemoryStore:
    """:class:`~proxy.memory.store.MemoryStore` on a
    :class:`~proxy.backends.sqlite.database.SqliteDatabase`."""

    def __init__(self, db: SqliteDatabase, *,
                 purge_seconds: float = DEFAULT_PURGE_SECONDS) -> None:
        self._db = db
        self._recall = Recall()
        self._purge_seconds = purge_seconds
        self._injection_counts = injections.Counts()  # per-user bounds (the cap's walks)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.read(fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite read failed: {exc}") from exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
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

    # hot path: one reader-thread trip each (see proxy.backends.sqlite.search) -----------
    async def search(self, query: SearchQuery) -> list[Candidate]:
        return await self._read(self._recall.search(query))

    incremental_corpus = False  # recall_corpus reads everything (MemoryStore)

    async def recall_generations(self, tenant: str, user: str) -> tuple[int, ...]:
        try:  # three rows by primary key: on the loop (docs/design.md#recall-index)
            return await self._db.read_small(self._recall.generations(tenant, user))
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite read failed: {exc}") from exc

    async def recall_corpus(self, tenant: str, user: str, *,
                            since: RecallCorpus | None = None) -> RecallCorpus:
        del since  # no change log here: the whole read, in its own thread
        try:
            return await self._db.read_bulk(self._recall.corpus(tenant, user))
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite read failed: {exc}") from exc

    async def resident(
        self, tenant: str, user: str, *, limit: int, channels: tuple[str | None, ...] | None
    ) -> list[Memory]:
        if limit <= 0:
            return []
        return await self._read(self._recall.resident(tenant, user, limit=limit,
                                                      channels=channels))

    async def get_profile(self, tenant: str, user: str) -> Profile | None:
        try:  # one row by primary key: on the loop, beside the generations
            return await self._db.read_small(lambda c: users.get_profile(c, tenant, user))
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite read failed: {exc}") from exc

    async def record_access(self, tenant: str, counts: Mapping[str, int], at: datetime) -> None:
        if not counts:
            return
        stamp = to_iso(at)
        await self._write(lambda c: c.executemany(
            "UPDATE memories SET access_count = access_count + ?, last_access_at = ? "
            "WHERE id = ? AND tenant = ?",
            [(n, stamp, i, tenant) for i, n in counts.items()],
        ))

    async def record_injections(self, records: Sequence[RecordRow], *, now: datetime,
                                retention: timedelta, per_user: int) -> None:
        if records:
            await self._write(lambda c: injections.insert(
                c, records, cutoff=now - retention, per_user=per_user,
                counts=self._injection_counts))

    async def get_injection(self, tenant: str, user: str, injection_id: str, *,
                            since: datetime) -> InjectionRecord | None:
        return await self._read(
            lambda c: injections.get(c, tenant, user, injection_id, since=since))

    # management ------------------------------------------------------------
    async def get(self, tenant: str, user: str | None, memory_id: str) -> Memory | None:
        def run(conn: sqlite3.Connection) -> Memory | None:
            row = conn.execute(
                f"SELECT {COLUMNS} FROM memories m WHERE m.id = ? AND m.tenant = ? "
                "AND m.user_id IS ?",
                (memory_id, tenant, user),
            ).fetchone()
            return None if row is None else memory_from_row(row)

        return await self._read(run)

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
            for term in query_terms(query.text, limit=8, subwords=False) or [query.text]:
                where.append("(m.norm LIKE ? OR lower(m.title) LIKE ?)")
                pattern = f"%{term.lower()}%"
                args.extend([pattern, pattern])

        def run(conn: sqlite3.Connection) -> list[Memory]:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM memories m WHERE {' AND '.join(where)} "
                "ORDER BY m.id DESC LIMIT ? OFFSET ?",
                (*args, query.limit, query.offset),
            ).fetchall()
            return [memory_from_row(r) for r in rows]

        return await self._read(run)

    async def count(self, tenant: str, user: str) -> dict[str, int]:
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            return state_counts(tuple(row) for row in conn.execute(
                "SELECT category, enabled, superseded_at IS NOT NULL AS retired, count(*) "
                "FROM memories WHERE tenant = ? AND user_id = ? "
                "GROUP BY category, enabled, retired",
                (tenant, user),
            ))

        return await self._read(run)

    async def add(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        def run(conn: sqlite3.Connection) -> None:
            upsert_memory(conn, memory)
            if audit is not None:
                insert_events(conn, [audit])

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
            upsert_memory(conn, memory)
            if audit is not None:
                insert_events(conn, [audit])

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
            delete_memories(conn, "id = ?", (memory_id,))
            conn.execute(
                "INSERT OR REPLACE INTO memory_tombstones (tenant, user_id, norm, deleted_at) "
                "VALUES (?, ?, ?, ?)",
                (tenant, user, content_digest(row[0]), to_iso(utcnow())),
            )
            if audit is not None:
                insert_events(conn, [audit])
            return True

        return await self._write(run)

    async def clear(self, tenant: str, user: str, *, audit: AuditEvent | None = None) -> int:
        now = to_iso(utcnow())

        def run(conn: sqlite3.Connection) -> int:
            removed = delete_memories(conn, "tenant = ? AND user_id = ?", (tenant, user))
            conn.execute("DELETE FROM profiles WHERE tenant = ? AND user_id = ?", (tenant, user))
            conn.execute("DELETE FROM conversations WHERE tenant = ? AND user_id = ?",
                         (tenant, user))
            # What was derived from the memories and the profile goes with them
            # (docs/design.md#deletion): their conflicts and the weekly profile snapshots.
            conflicts.erase(conn, tenant, user)
            conn.execute(
                "INSERT INTO user_settings (tenant, user_id, cleared_at) VALUES (?, ?, ?) "
                "ON CONFLICT(tenant, user_id) DO UPDATE SET cleared_at = excluded.cleared_at",
                (tenant, user, now),
            )
            if audit is not None:
                insert_events(conn, [audit])
            return len(removed)

        return await self._write(run)

    # learning --------------------------------------------------------------
    async def related(self, tenant: str, user: str, text: str, *, limit: int) -> list[Memory]:
        return await related_by_keywords(self, tenant, user, text, limit=limit)

    async def apply(self, changes: ChangeSet) -> bool:
        now = to_iso(utcnow())
        return await self._write(lambda c: apply_changes(c, changes, now=now))

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
        if query.source is not None:
            where.append("m.source = ?")
            args.append(query.source)
        if query.created_before is not None:
            where.append("m.created_at < ?")
            args.append(to_iso(query.created_before))
        if query.never_accessed:
            where.append("m.access_count = 0")

        def run(conn: sqlite3.Connection) -> list[Memory]:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM memories m WHERE {' AND '.join(where)} "
                "ORDER BY m.created_at LIMIT ?", (*args, query.limit),
            ).fetchall()
            return [memory_from_row(r) for r in rows]

        return await self._read(run)

    async def tombstoned(
        self, tenant: str, user: str, norms: Sequence[str]
    ) -> dict[str, datetime]:
        if not norms:
            return {}
        by_digest = {content_digest(n): n for n in norms}
        return await self._read(lambda c: users.tombstoned(c, tenant, user, by_digest))

    async def put_profile(self, profile: Profile) -> None:
        await self._write(lambda c: users.put_profile(c, profile))

    async def get_conversation(
        self, tenant: str, user: str, conversation_id: str
    ) -> ConversationRecord | None:
        return await self._read(
            lambda c: users.get_conversation(c, tenant, user, conversation_id))

    async def bind_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        keys = sorted({normalize(n) for n in names if normalize(n)})
        if not keys:
            return
        stamp = to_iso(utcnow())
        await self._write(lambda c: users.bind_names(c, tenant, user, keys, stamp))

    async def users_named(self, tenant: str, name: str) -> list[str]:
        key = normalize(name)
        return await self._read(lambda c: users.users_named(c, tenant, key))

    async def names_of(self, tenant: str, user: str) -> list[str]:
        rows = await self._read(lambda c: c.execute(
            "SELECT name FROM user_names WHERE tenant = ? AND user_id = ? ORDER BY name",
            (tenant, user)).fetchall())
        return [r[0] for r in rows]

    async def get_user_settings(self, tenant: str, user: str) -> UserSettings:
        return await self._read(lambda c: users.get_settings(c, tenant, user))

    async def put_user_settings(self, tenant: str, user: str, settings: UserSettings) -> None:
        await self._write(lambda c: users.put_settings(c, tenant, user, settings))

    async def audit(self, events: Sequence[AuditEvent]) -> None:
        if events:
            await self._write(lambda c: insert_events(c, events))

    async def save_prompt(self, tenant: str, kind: str, text: str, actor: str,
                          at: datetime) -> PromptVersion:
        version = await self._write(
            lambda c: users.save_prompt(c, tenant, kind, text=text, actor=actor, at=at))
        return PromptVersion(tenant=tenant, kind=kind, version=version, text=text,  # type: ignore[arg-type]
                             actor=actor, at=at)

    async def prompt_versions(self, tenant: str, kind: str, *,
                              limit: int = 20) -> list[PromptVersion]:
        return await self._read(lambda c: users.prompt_versions(c, tenant, kind, limit=limit))

    async def audit_log(
        self, tenant: str, user: str | None, *, limit: int = 100, before_id: int | None = None
    ) -> list[tuple[int, AuditEvent]]:
        return await self.audit_search(tenant, AuditFilter(user=user), limit=limit,
                                       before_id=before_id)

    # admin governance --------------------------------------------------------------------
    async def audit_search(self, tenant: str, where: AuditFilter, *, limit: int = 100,
                           before_id: int | None = None) -> list[tuple[int, AuditEvent]]:
        return await self._read(lambda c: search_events(c, tenant, where, limit=limit,
                                                        before_id=before_id))

    async def audit_counts(self, tenant: str, *, since: datetime
                           ) -> dict[tuple[str, str, str], int]:
        return await self._read(lambda c: count_events(c, tenant, since=since))

    async def tenant_counts(self, tenant: str) -> dict[str, dict[str, int]]:
        def run(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
            return scope_state_counts(tuple(row) for row in conn.execute(
                "SELECT scope, category, enabled, superseded_at IS NOT NULL, count(*) "
                "FROM memories WHERE tenant = ? GROUP BY 1, 2, 3, 4", (tenant,),
            ))

        return await self._read(run)

    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        return await self._read(lambda c: users.get_tenant_settings(c, tenant))

    async def put_tenant_settings(self, tenant: str, overrides: Mapping[str, object]
                                  ) -> None:
        stamp = to_iso(utcnow())
        await self._write(lambda c: users.put_tenant_settings(c, tenant, overrides, stamp))

    async def change_tenant_settings(
        self, tenant: str, change: Callable[[dict[str, object]], dict[str, object]]
    ) -> tuple[dict[str, object], dict[str, object]]:
        stamp = to_iso(utcnow())

        def run(conn: sqlite3.Connection) -> tuple[dict[str, object], dict[str, object]]:
            before = users.get_tenant_settings(conn, tenant)
            after = change(dict(before))
            users.put_tenant_settings(conn, tenant, after, stamp)
            return before, after

        return await self._write(run)

    # candidate synonyms (proxy.backends.sqlite.synonyms) -----------------------------------
    async def count_synonyms(self, tenant: str, user: str,
                             examples: Sequence[SynonymExample]) -> None:
        if examples:
            await self._write(lambda c: synonyms.count_synonyms(c, tenant, user, examples))

    async def synonym_candidates(self, tenant: str, *, status: SynonymStatus | None,
                                 limit: int) -> list[SynonymCandidate]:
        return await self._read(
            lambda c: synonyms.synonym_candidates(c, tenant, status=status, limit=limit))

    async def decide_synonym(self, tenant: str, candidate: str, *, status: SynonymStatus,
                             actor: str, at: datetime) -> SynonymCandidate | None:
        return await self._write(lambda c: synonyms.decide_synonym(
            c, tenant, candidate, status=status, actor=actor, at=at))

    # erasure -----------------------------------------------------------------------------
    async def list_conflicts(self, tenant: str, user: str, *, statuses: frozenset[str],
                             limit: int = 500) -> list[Conflict]:
        return await self._read(
            lambda c: conflicts.list_conflicts(c, tenant, user, statuses, limit))

    async def list_tenant_conflicts(self, tenant: str, *, statuses: frozenset[str],
                                    limit: int = 500) -> list[Conflict]:
        return await self._read(
            lambda c: conflicts.tenant_conflicts(c, tenant, statuses, limit))

    async def get_conflict(self, tenant: str, user: str,
                           conflict_id: str) -> Conflict | None:
        return await self._read(lambda c: conflicts.get_conflict(c, tenant, user, conflict_id))

    async def profile_history(self, tenant: str, user: str) -> list[ProfileWeek]:
        return await self._read(lambda c: conflicts.weeks(c, tenant, user))

    async def erase_user(self, tenant: str, user: str, *, audit: AuditEvent) -> int:
        """Erase in one transaction, then purge the files (:meth:`purge_erased`); a purge
        that fails is logged and left owed (the periodic purge retries it): the erasure
        stands."""
        marker = to_iso(utcnow())

        def run(conn: sqlite3.Connection) -> int:
            synonyms.erase_user(conn, tenant, user)
            return users.erase_user(conn, tenant, user, marker=marker, audit=audit)

        removed = await self._write(run)
        try:
            await self.purge_erased(checkpoint=True)
        except StoreUnavailableError as exc:
            log.warning("sqlite_erasure_purge_failed", error=str(exc)[:300])
        return removed

    async def purge_erased(self, *, now: float | None = None,
                           checkpoint: bool = False) -> bool:
        """Make erased text leave the files (docs/design.md#erasure): when an erasure
        owes a purge and none ran in the last ``purge_seconds``, merge the keyword index
        (FTS5 ``'optimize'`` rewrites its segments without the deleted rows' terms; with
        ``secure_delete`` the freed pages are zeroed), then checkpoint the WAL with
        TRUNCATE (the ``-wal`` file, which held copies of the erased rows, is cut to zero
        bytes; also with ``checkpoint``, as right after an erasure). Whether a merge ran.
        Raises :class:`StoreUnavailableError`."""
        at = time.time() if now is None else now

        def run(conn: sqlite3.Connection) -> bool:
            owed, last = conn.execute("SELECT owed, last_at FROM purges").fetchone()
            if not owed or at - last < self._purge_seconds:
                return False
            conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('optimize')")
            conn.execute("UPDATE purges SET owed = 0, last_at = ?", (at,))
            return True

        ran = bool(await self._write(run))
        if not ran and not checkpoint:
            return False
        try:
            if not await self._db.checkpoint():
                log.info("sqlite_checkpoint_busy")  # the next purge or checkpoint cuts it
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite checkpoint failed: {exc}") from exc
        return ran

    async def delete_shared(self, tenant: str, memory_id: str, *,
                            audit: AuditEvent | None = None) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT 1 FROM memories WHERE id = ? AND tenant = ? AND "
                               "user_id IS NULL", (memory_id, tenant)).fetchone()
            if row is None:
                return False
            delete_memories(conn, "id = ?", (memory_id,))
            if audit is not None:
                insert_events(conn, [audit])
            return True

        return await self._write(run)

    # vectors kept consistent with the embedder (memory-proxy reindex) -------------------
    async def stale_vectors(self, model: str, *, limit: int,
                            cursor: str = "") -> tuple[list[Memory], str]:
        after = int(cursor) if cursor.isdigit() else 0

        def run(conn: sqlite3.Connection) -> tuple[list[Memory], str]:
            cur = conn.cursor()
            cur.row_factory = None
            rows = cur.execute(
                f"SELECT m.rowid, {COLUMNS} FROM memories m WHERE m.rowid > ? AND {ACTIVE} "
                "AND (m.embedding IS NULL OR m.embedding_model IS NULL "
                "OR m.embedding_model != ?) ORDER BY m.rowid LIMIT ?",
                (after, model, max(1, limit)),
            ).fetchall()
            following = str(rows[-1][0]) if len(rows) >= max(1, limit) else ""
            return [memory_from_row(r[1:]) for r in rows], following

        return await self._read(run)

    async def set_vectors(self, updates: Sequence[VectorUpdate]) -> int:
        if not updates:
            return 0
        numpy = np()

        def run(conn: sqlite3.Connection) -> int:
            written = 0
            for u in updates:
                written += conn.execute(
                    "UPDATE memories SET embedding = ?, embedding_model = ? WHERE id = ? "
                    "AND tenant = ? AND user_id IS ? AND content = ?",
                    (numpy.asarray(u.embedding, numpy.float32).tobytes(), u.model, u.memory_id,
                     u.tenant, u.user_id, u.content),
                ).rowcount
            return written

        return await self._write(run)
