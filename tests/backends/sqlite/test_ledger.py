"""What only the SQLite ledger has: the migration that lists users who only wrote
memories."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.ledger import SqliteLedger
from proxy.backends.sqlite.migrations import MIGRATIONS

WRITERS_MIGRATION = 11  # the migration that adds memory-only users to tenant_users


def _memory(conn: sqlite3.Connection, memory_id: str, tenant: str, user: str | None,
            updated_at: str) -> None:
    conn.execute(
        "INSERT INTO memories (id, tenant, user_id, scope, category, content, source, "
        "created_at, updated_at, last_seen_at) VALUES (?, ?, ?, ?, 'domain', 'x', "
        "'manual', ?, ?, ?)", (memory_id, tenant, user, "personal" if user else "shared",
                               updated_at, updated_at, updated_at))


async def test_users_with_only_memories_join_the_index_on_upgrade(tmp_path: Path) -> None:
    """After the upgrade a user with memories but no usage row is listed with their latest
    memory write; a user who chatted keeps their last chat time; shared memories (no
    user) and other tenants add nobody."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:WRITERS_MIGRATION - 1]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {WRITERS_MIGRATION - 1}")
    _memory(conn, "m1", "acme", "importer", "2025-01-01T00:00:00.000000Z")
    _memory(conn, "m2", "acme", "importer", "2025-03-01T00:00:00.000000Z")
    _memory(conn, "m3", "acme", "talker", "2025-06-01T00:00:00.000000Z")
    _memory(conn, "m4", "acme", None, "2025-06-01T00:00:00.000000Z")
    _memory(conn, "m5", "globex", "other", "2025-06-01T00:00:00.000000Z")
    conn.execute("INSERT INTO tenant_users (tenant, user_id, last_seen) VALUES "
                 "('acme', 'talker', '2025-02-01T00:00:00.000000Z')")
    conn.commit()
    conn.close()
    async with SqliteDatabase(path) as db:
        users = await SqliteLedger(db).users("acme")
        assert [(u.user, u.last_seen) for u in users] == [
            ("importer", datetime(2025, 3, 1, tzinfo=UTC)),
            ("talker", datetime(2025, 2, 1, tzinfo=UTC))]
        assert [u.user for u in await SqliteLedger(db).users("globex")] == ["other"]
