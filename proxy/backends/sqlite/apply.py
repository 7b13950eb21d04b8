"""The at-most-once apply of a learning batch's :class:`~proxy.memory.store.ChangeSet`
on SQLite, in one write transaction.

**At most once.** The batch key goes into ``applied_batches`` first; a key already there
means the batch was applied, and nothing is written. SQLite keeps the keys forever.

**Deletions win.** What the user deleted (or cleared) after the batch's messages were
said is not written back (tombstones and ``cleared_at``, read in the same transaction).

Errors are the caller's to translate.
"""

from __future__ import annotations

import sqlite3

from proxy.backends.sqlite import conflicts, users
from proxy.backends.sqlite.audit import insert_events
from proxy.backends.sqlite.codec import COLUMNS, content_digest, memory_from_row
from proxy.backends.sqlite.rows import delete_memories, upsert_memory
from proxy.memory.records import Memory, to_iso
from proxy.memory.store import ChangeSet
from proxy.memory.text import normalize
from proxy.memory.writes import ApplyPlan, fact_key, plan_apply


def apply_changes(conn: sqlite3.Connection, changes: ChangeSet, *, now: str | None) -> bool:
    """Write ``changes`` in the caller's transaction (stamped ``now``) unless their batch
    was applied already or the user cleared their memory since its messages (``False``);
    ``True`` when written. Raises ``ValueError`` when an upsert is of another namespace."""
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
        upsert_memory(conn, memory)
    for memory_id, key in plan.evidence:
        added = conn.execute(
            "INSERT OR IGNORE INTO memory_evidence (memory_id, evidence_key, at) "
            "VALUES (?, ?, ?)", (memory_id, key, now)).rowcount
        if added and memory_id in plan.counted:  # atomic: under the write lock
            conn.execute("UPDATE memories SET hits = hits + 1 WHERE id = ?",
                         (memory_id,))
    for memory_id in changes.deletes:
        delete_memories(conn, "id = ? AND tenant = ? AND user_id = ?",
                        (memory_id, changes.tenant, changes.user_id))
    if changes.profile is not None:
        users.put_profile(conn, changes.profile)
    if changes.conversation is not None:
        users.put_conversation(conn, changes.conversation)
    insert_events(conn, plan.audit)
    conflicts.put_conflicts(conn, plan.conflicts)
    if changes.snapshot is not None:
        conflicts.put_week(conn, changes.snapshot)
    return True


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
    """:func:`~proxy.memory.writes.plan_apply` with the stored hits and the stored duplicates
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
            f"SELECT {COLUMNS} FROM memories m WHERE m.tenant = ? AND m.user_id = ? AND "
            "m.norm = ? AND m.enabled = 1 AND m.superseded_at IS NULL AND m.id != ?",
            (changes.tenant, changes.user_id, normalize(memory.content), memory.id),
        ).fetchall()
        key = fact_key(memory)
        for row in rows:
            stored = memory_from_row(row)
            if stored.id not in retiring and fact_key(stored) == key:
                duplicates[memory.id] = stored
                break
    return plan_apply(changes, upserts, stored_hits=stored_hits, duplicates=duplicates)
