"""Injection records on SQLite (docs/design.md#injection-records): table ``injections``
(migration 17), one row per record: its id, owner and time in columns and the rest in
the compact form of :func:`~proxy.memory.explain.stored` (rows written before it hold the
API's JSON; both read back). Functions of a connection, run by
:class:`~proxy.backends.sqlite.store.SqliteMemoryStore` in a write transaction or on the
reader thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

from proxy.memory.explain import InjectionRecord, from_stored, stored
from proxy.memory.records import from_iso, to_iso

# The user's rows beyond their newest ``per_user``, newest first by time then by insertion
# (rowid): the walk reads only the covering index ``injections_owner`` (tenant, user_id,
# created_at — and the rowid every index entry ends with), where ordering by ``id`` as
# well made SQLite sort all the user's rows in a temporary B-tree on every write
# (``bench/injection_cost.py``: ~1.7 ms of each flush at the cap).
_OVERFLOW = (
    "DELETE FROM injections WHERE rowid IN (SELECT rowid FROM injections "
    "WHERE tenant = ? AND user_id = ? ORDER BY created_at DESC, rowid DESC "
    "LIMIT -1 OFFSET ?)")


def insert(conn: sqlite3.Connection, records: Sequence[InjectionRecord], *, cutoff: datetime,
           per_user: int) -> None:
    """Insert ``records``, then drop records older than ``cutoff`` (all users) and each
    written user's records beyond their newest ``per_user``."""
    conn.executemany(
        "INSERT OR IGNORE INTO injections (id, tenant, user_id, created_at, record) "
        "VALUES (?, ?, ?, ?, ?)",
        [(r.id, r.tenant, r.user, to_iso(r.created_at), stored(r)) for r in records])
    conn.execute("DELETE FROM injections WHERE created_at < ?", (to_iso(cutoff),))
    for tenant, user in {(r.tenant, r.user) for r in records}:
        conn.execute(_OVERFLOW, (tenant, user, per_user))


def get(conn: sqlite3.Connection, tenant: str, user: str, injection_id: str, *,
        since: datetime) -> InjectionRecord | None:
    row = conn.execute(
        "SELECT created_at, record FROM injections WHERE id = ? AND tenant = ? "
        "AND user_id = ? AND created_at >= ?",
        (injection_id, tenant, user, to_iso(since))).fetchone()
    if row is None:
        return None
    created = from_iso(row[0])
    assert created is not None
    return from_stored(tenant, user, injection_id, row[1], created_at=created)
