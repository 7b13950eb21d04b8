"""The learning log on SQLite: the ``audit_log`` table, appended to inside the transaction
that makes the change, read newest first (ids are the table's autoincrement rowids).

Functions of a connection: the store runs reads on the reader thread and appends inside
its write transactions. Errors are the caller's to translate.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from proxy.backends.sqlite.codec import parse_time
from proxy.memory.records import to_iso
from proxy.memory.store import AuditEvent, AuditFilter


def insert_events(conn: sqlite3.Connection, events: Sequence[AuditEvent]) -> None:
    """Append ``events`` (``detail`` as JSON; values JSON cannot hold as their ``str``)."""
    conn.executemany(
        "INSERT INTO audit_log (at, tenant, user_id, conversation_id, actor, action, memory_id, "
        "reason, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (to_iso(e.at), e.tenant, e.user_id, e.conversation_id, e.actor, e.action,
             e.memory_id, e.reason, orjson.dumps(e.detail, default=str).decode())
            for e in events
        ],
    )


def search_events(conn: sqlite3.Connection, tenant: str, where: AuditFilter, *, limit: int,
                  before_id: int | None) -> list[tuple[int, AuditEvent]]:
    """Newest first, at most ``limit`` (none when ``limit <= 0``) events of ``tenant``
    passing ``where`` with ids below ``before_id`` when given."""
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
    rows = conn.execute(
        "SELECT id, at, tenant, user_id, conversation_id, actor, action, memory_id, "
        f"reason, detail FROM audit_log WHERE {' AND '.join(clauses)} "
        "ORDER BY id DESC LIMIT ?", (*args, max(0, limit))).fetchall()
    return [(r[0], AuditEvent(
        tenant=r[2], user_id=r[3], conversation_id=r[4], actor=r[5], action=r[6],
        memory_id=r[7], reason=r[8], detail=orjson.loads(r[9]), at=parse_time(r[1])))
        for r in rows]


def count_events(conn: sqlite3.Connection, tenant: str, *,
                 since: datetime) -> dict[tuple[str, str, str], int]:
    """Events of ``tenant`` at or after ``since``, counted per (UTC day of ``at``,
    action, actor)."""
    rows = conn.execute(
        "SELECT substr(at, 1, 10), action, actor, count(*) FROM audit_log "
        "WHERE tenant = ? AND at >= ? GROUP BY 1, 2, 3",
        (tenant, to_iso(since))).fetchall()
    return {(r[0], r[1], r[2]): int(r[3]) for r in rows}
