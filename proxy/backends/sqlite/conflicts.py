"""Conflicts and weekly profile snapshots on SQLite (docs/design.md#conflicts,
docs/design.md#profile-over-time): the ``memory_conflicts`` and ``profile_history``
tables, written inside the caller's transaction (an apply) and read by the store.
Errors are the caller's to translate.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from proxy.memory.conflicts import (
    HISTORY_WEEKS,
    MAX_CONFLICTS,
    Conflict,
    ProfileWeek,
    conflict_from_json,
    week_from_json,
)
from proxy.memory.records import to_iso

# Migration 15 (proxy/backends/sqlite/database.py): the pairs, and the mark an open one
# leaves on its two memories (memories_generation_update recreated with the new columns,
# as every migration adding a column to memories must); the weekly profile snapshots.
CONFLICTS_MIGRATION = """
    ALTER TABLE memories ADD COLUMN conflict_with TEXT;
    ALTER TABLE memories ADD COLUMN conflict_yields INTEGER NOT NULL DEFAULT 0;
    DROP TRIGGER memories_generation_update;
    CREATE TRIGGER memories_generation_update AFTER UPDATE OF id, tenant, user_id, scope,
        category, subcategory, title, content, tags, subject, source, source_conversation_id,
        source_channel, score, embedding, enabled, hits, created_at, updated_at, last_seen_at,
        superseded_at, superseded_by, supersede_reason, norm, embedding_model, conflict_with,
        conflict_yields ON memories BEGIN
        INSERT INTO memory_generations (tenant, owner, generation)
        VALUES (OLD.tenant, coalesce(OLD.user_id, ''),
                (SELECT value FROM generation_floor) + 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; INSERT INTO
        memory_generations (tenant, owner, generation)
        VALUES (NEW.tenant, coalesce(NEW.user_id, ''),
                (SELECT value FROM generation_floor) + 1)
        ON CONFLICT (tenant, owner) DO UPDATE SET generation = generation + 1; END;
    CREATE TABLE memory_conflicts (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX memory_conflicts_owner ON memory_conflicts (tenant, user_id, created_at);
    CREATE TABLE profile_history (
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        week TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (tenant, user_id, week)
    ) WITHOUT ROWID;
    """


def put_conflicts(conn: sqlite3.Connection, conflicts: Sequence[Conflict]) -> None:
    """Insert or replace each conflict (by id); then drop the user's oldest beyond
    :data:`~proxy.memory.conflicts.MAX_CONFLICTS`."""
    if not conflicts:
        return
    conn.executemany(
        "INSERT INTO memory_conflicts (id, tenant, user_id, status, created_at, body) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET status = excluded.status, "
        "body = excluded.body",
        [(c.id, c.tenant, c.user_id, c.status, to_iso(c.created_at), c.to_json())
         for c in conflicts])
    owner = (conflicts[0].tenant, conflicts[0].user_id)
    conn.execute(
        "DELETE FROM memory_conflicts WHERE tenant = ? AND user_id = ? AND id NOT IN "
        "(SELECT id FROM memory_conflicts WHERE tenant = ? AND user_id = ? "
        "ORDER BY created_at DESC, id DESC LIMIT ?)", (*owner, *owner, MAX_CONFLICTS))


def list_conflicts(conn: sqlite3.Connection, tenant: str, user: str,
                   statuses: frozenset[str], limit: int) -> list[Conflict]:
    """The user's conflicts of those statuses, newest first, at most ``limit``."""
    if not statuses or limit <= 0:
        return []
    marks = ", ".join("?" * len(statuses))
    rows = conn.execute(
        f"SELECT body FROM memory_conflicts WHERE tenant = ? AND user_id = ? AND status IN "
        f"({marks}) ORDER BY created_at DESC, id DESC LIMIT ?",
        (tenant, user, *sorted(statuses), limit)).fetchall()
    return [conflict_from_json(tenant, user, r[0]) for r in rows]


def tenant_conflicts(conn: sqlite3.Connection, tenant: str, statuses: frozenset[str],
                     limit: int) -> list[Conflict]:
    """The conflicts of those statuses of every user of the tenant, newest first, at most
    ``limit``, each with its user."""
    if not statuses or limit <= 0:
        return []
    marks = ", ".join("?" * len(statuses))
    rows = conn.execute(
        f"SELECT user_id, body FROM memory_conflicts WHERE tenant = ? AND status IN "
        f"({marks}) ORDER BY created_at DESC, id DESC LIMIT ?",
        (tenant, *sorted(statuses), limit)).fetchall()
    return [conflict_from_json(tenant, r[0], r[1]) for r in rows]


def get_conflict(conn: sqlite3.Connection, tenant: str, user: str,
                 conflict_id: str) -> Conflict | None:
    row = conn.execute(
        "SELECT body FROM memory_conflicts WHERE id = ? AND tenant = ? AND user_id = ?",
        (conflict_id, tenant, user)).fetchone()
    return None if row is None else conflict_from_json(tenant, user, row[0])


def put_week(conn: sqlite3.Connection, week: ProfileWeek) -> None:
    """Write the snapshot of its week, then drop the user's weeks beyond the newest
    :data:`~proxy.memory.conflicts.HISTORY_WEEKS`."""
    owner = (week.tenant, week.user_id)
    conn.execute(
        "INSERT INTO profile_history (tenant, user_id, week, body) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(tenant, user_id, week) DO UPDATE SET body = excluded.body",
        (*owner, week.week, week.to_json()))
    conn.execute(
        "DELETE FROM profile_history WHERE tenant = ? AND user_id = ? AND week NOT IN "
        "(SELECT week FROM profile_history WHERE tenant = ? AND user_id = ? "
        "ORDER BY week DESC LIMIT ?)", (*owner, *owner, HISTORY_WEEKS))


def weeks(conn: sqlite3.Connection, tenant: str, user: str) -> list[ProfileWeek]:
    """The user's stored snapshots, oldest first."""
    rows = conn.execute(
        "SELECT body FROM profile_history WHERE tenant = ? AND user_id = ? ORDER BY week",
        (tenant, user)).fetchall()
    return [week_from_json(tenant, user, r[0]) for r in rows]


def erase(conn: sqlite3.Connection, tenant: str, user: str) -> None:
    """Remove the user's conflicts and snapshots (erasure, in its transaction)."""
    for table in ("memory_conflicts", "profile_history"):
        conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND user_id = ?", (tenant, user))
