"""A user's and a tenant's records besides memories, on SQLite: profile, conversation
records, display-name bindings, settings, tombstones (digests of deleted contents, never
the text), the tenant's setting overrides and prompt versions — and erasure of a user.

Functions of a connection: the store runs reads on the reader thread and writes inside
its write transactions. Errors are the caller's to translate.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime

import orjson

from proxy.backends.sqlite import conflicts
from proxy.backends.sqlite.audit import insert_events
from proxy.backends.sqlite.codec import parse_time
from proxy.memory.records import (
    MAX_SUMMARIES,
    ConversationRecord,
    Profile,
    from_iso,
    profile_from_json,
    profile_to_json,
    to_iso,
    utcnow,
)
from proxy.memory.store import AuditEvent, PromptVersion, UserSettings


# profile and conversation records ------------------------------------------------------
def get_profile(conn: sqlite3.Connection, tenant: str, user: str) -> Profile | None:
    row = conn.execute(
        "SELECT data FROM profiles WHERE tenant = ? AND user_id = ?", (tenant, user)
    ).fetchone()
    return None if row is None else profile_from_json(tenant, user, row[0])


def put_profile(conn: sqlite3.Connection, profile: Profile) -> None:
    conn.execute(
        "INSERT INTO profiles (tenant, user_id, data, updated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(tenant, user_id) DO UPDATE SET data = excluded.data, "
        "updated_at = excluded.updated_at",
        (profile.tenant, profile.user_id, profile_to_json(profile), to_iso(utcnow())),
    )


def get_conversation(conn: sqlite3.Connection, tenant: str, user: str,
                     conversation_id: str) -> ConversationRecord | None:
    row = conn.execute(
        "SELECT score, dimensions, reason, learned_messages, updated_at, summary "
        "FROM conversations "
        "WHERE tenant = ? AND user_id = ? AND conversation_id = ?",
        (tenant, user, conversation_id),
    ).fetchone()
    if row is None:
        return None
    return ConversationRecord(
        tenant=tenant, user_id=user, conversation_id=conversation_id, score=row[0],
        dimensions=orjson.loads(row[1]), reason=row[2], learned_messages=row[3],
        updated_at=parse_time(row[4]), summary=row[5],
    )


def put_conversation(conn: sqlite3.Connection, record: ConversationRecord) -> None:
    """Overwrite score, dimensions, reason, updated_at (and the summary when the record
    has one); add learned_messages; keep the summaries of the user's
    :data:`MAX_SUMMARIES` most recent conversations only."""
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


# display names -------------------------------------------------------------------------
def bind_names(conn: sqlite3.Connection, tenant: str, user: str, keys: Sequence[str],
               stamp: str | None) -> None:
    """Record that ``user`` goes by each normalised name of ``keys``, seen at ``stamp``."""
    conn.executemany(
        "INSERT INTO user_names (tenant, name, user_id, seen_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(tenant, name, user_id) DO UPDATE SET seen_at = excluded.seen_at",
        [(tenant, key, user, stamp) for key in keys],
    )


def users_named(conn: sqlite3.Connection, tenant: str, key: str) -> list[str]:
    rows = conn.execute(
        "SELECT user_id FROM user_names WHERE tenant = ? AND name = ? ORDER BY user_id",
        (tenant, key),
    ).fetchall()
    return [r[0] for r in rows]


# settings ------------------------------------------------------------------------------
def get_settings(conn: sqlite3.Connection, tenant: str, user: str) -> UserSettings:
    row = conn.execute(
        "SELECT enable_personal_learning, show_learning_indicator, cleared_at "
        "FROM user_settings WHERE tenant = ? AND user_id = ?",
        (tenant, user),
    ).fetchone()
    if row is None:
        return UserSettings()
    return UserSettings(bool(row[0]), bool(row[1]), from_iso(row[2]))


def put_settings(conn: sqlite3.Connection, tenant: str, user: str,
                 settings: UserSettings) -> None:
    conn.execute(
        "INSERT INTO user_settings (tenant, user_id, enable_personal_learning, "
        "show_learning_indicator, cleared_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(tenant, user_id) DO UPDATE SET "
        "enable_personal_learning = excluded.enable_personal_learning, "
        "show_learning_indicator = excluded.show_learning_indicator, "
        "cleared_at = excluded.cleared_at",
        (tenant, user, int(settings.enable_personal_learning),
         int(settings.show_learning_indicator), to_iso(settings.cleared_at)),
    )


def get_tenant_settings(conn: sqlite3.Connection, tenant: str) -> dict[str, object]:
    row = conn.execute("SELECT data FROM tenant_settings WHERE tenant = ?",
                       (tenant,)).fetchone()
    return {} if row is None else dict(orjson.loads(row[0]))


def put_tenant_settings(conn: sqlite3.Connection, tenant: str,
                        overrides: Mapping[str, object], stamp: str | None) -> None:
    conn.execute(
        "INSERT INTO tenant_settings (tenant, data, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT(tenant) DO UPDATE SET data = excluded.data, "
        "updated_at = excluded.updated_at",
        (tenant, orjson.dumps(dict(overrides)).decode(), stamp))


# prompts -------------------------------------------------------------------------------
def save_prompt(conn: sqlite3.Connection, tenant: str, kind: str, *, text: str, actor: str,
                at: datetime) -> int:
    """Append the next version of the tenant's ``kind`` prompt; returns its number (1…)."""
    row = conn.execute(
        "SELECT coalesce(max(version), 0) FROM prompts WHERE tenant = ? AND kind = ?",
        (tenant, kind)).fetchone()
    version = int(row[0]) + 1
    conn.execute("INSERT INTO prompts (tenant, kind, version, text, actor, at) VALUES "
                 "(?, ?, ?, ?, ?, ?)", (tenant, kind, version, text, actor, to_iso(at)))
    return version


def prompt_versions(conn: sqlite3.Connection, tenant: str, kind: str, *,
                    limit: int) -> list[PromptVersion]:
    """The tenant's ``limit`` latest versions of the ``kind`` prompt, newest first."""
    rows = conn.execute(
        "SELECT version, text, actor, at FROM prompts WHERE tenant = ? AND kind = ? "
        "ORDER BY version DESC LIMIT ?", (tenant, kind, limit)).fetchall()
    return [PromptVersion(tenant=tenant, kind=kind, version=r[0], text=r[1],  # type: ignore[arg-type]
                          actor=r[2], at=parse_time(r[3])) for r in rows]


# tombstones and erasure ----------------------------------------------------------------
def tombstoned(conn: sqlite3.Connection, tenant: str, user: str,
               by_digest: Mapping[str, str]) -> dict[str, datetime]:
    """``norm → deletion time`` of the user's tombstones among ``by_digest``
    (``content digest → norm``)."""
    rows = conn.execute(
        "SELECT norm, deleted_at FROM memory_tombstones WHERE tenant = ? AND "
        f"user_id = ? AND norm IN ({', '.join('?' * len(by_digest))})",
        (tenant, user, *by_digest),
    ).fetchall()
    return {by_digest[r[0]]: parse_time(r[1]) for r in rows}


def erase_user(conn: sqlite3.Connection, tenant: str, user: str, *, marker: str | None,
               audit: AuditEvent) -> int:
    """Delete everything held about the user (memories with their keyword-index rows and
    evidence, tombstones, profile, conversations, names, audit events, settings, injection
    records, their ``memory_generations`` row) in the caller's transaction; leave only a
    content-free settings row whose ``cleared_at`` is ``marker``, and ``audit``; mark a
    keyword-index purge owed. Returns the memories removed."""
    owner = (tenant, user)
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
                  "audit_log", "user_settings", "injections"):
        conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND user_id = ?", owner)
    # The counters row goes too; the floor rises above it so a later write never brings
    # the user's generation back to a value some process's cache saw (migration 13).
    conn.execute(
        "UPDATE generation_floor SET value = max(value, coalesce((SELECT generation FROM "
        "memory_generations WHERE tenant = ? AND owner = ?), 0)) + 1", owner)
    conn.execute("DELETE FROM memory_generations WHERE tenant = ? AND owner = ?", owner)
    # A group batch's change set for this user is applied under "<batch key>:<user id>"
    # (proxy.learning.owners): that key names the user. Batch keys are b_ + 32 hex digits.
    conn.execute("DELETE FROM applied_batches WHERE substr(batch_key, 35) = ?",
                 (":" + user,))
    conn.execute("UPDATE purges SET owed = 1")
    conn.execute("INSERT INTO user_settings (tenant, user_id, cleared_at) "
                 "VALUES (?, ?, ?)", (tenant, user, marker))
    # Conflicts and weekly profile snapshots (docs/design.md#conflicts).
    conflicts.erase(conn, tenant, user)
    insert_events(conn, [audit])
    return int(removed)
