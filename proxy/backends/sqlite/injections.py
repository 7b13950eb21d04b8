"""Injection records on SQLite (docs/design.md#injection-records): table ``injections``
(migration 14), one row per record holding the API's JSON. Functions of a connection, run
by :class:`~proxy.backends.sqlite.store.SqliteMemoryStore` in a write transaction or on the
reader thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

import orjson

from proxy.memory.explain import InjectionRecord
from proxy.memory.records import to_iso


def insert(conn: sqlite3.Connection, records: Sequence[InjectionRecord], *, cutoff: datetime,
           per_user: int) -> None:
    """Insert ``records``, then drop records older than ``cutoff`` (all users) and each
    written user's records beyond their newest ``per_user``."""
    conn.executemany(
        "INSERT OR IGNORE INTO injections (id, tenant, user_id, created_at, record) "
        "VALUES (?, ?, ?, ?, ?)",
        [(r.id, r.tenant, r.user, to_iso(r.created_at), orjson.dumps(r.to_api()).decode())
         for r in records])
    conn.execute("DELETE FROM injections WHERE created_at < ?", (to_iso(cutoff),))
    for tenant, user in {(r.tenant, r.user) for r in records}:
        conn.execute(
            "DELETE FROM injections WHERE id IN (SELECT id FROM injections "
            "WHERE tenant = ? AND user_id = ? ORDER BY created_at DESC, id DESC "
            "LIMIT -1 OFFSET ?)", (tenant, user, per_user))


def get(conn: sqlite3.Connection, tenant: str, user: str, injection_id: str, *,
        since: datetime) -> InjectionRecord | None:
    row = conn.execute(
        "SELECT record FROM injections WHERE id = ? AND tenant = ? AND user_id = ? "
        "AND created_at >= ?", (injection_id, tenant, user, to_iso(since))).fetchone()
    return None if row is None else InjectionRecord.from_api(tenant, user, orjson.loads(row[0]))
