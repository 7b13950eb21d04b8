"""What only the SQLite queue has: the migration that gives jobs their tenant."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.migrations import MIGRATIONS
from proxy.backends.sqlite.queue import SqliteLearningQueue

TENANT_MIGRATION = 7  # the migration that added jobs.tenant


async def test_jobs_dead_before_the_tenant_column_are_for_the_operator_only(
        tmp_path: Path) -> None:
    """A job dead-lettered by the previous schema keeps its row after the migration; no
    tenant's admin lists, requeues or drops it; the operator (no tenant) requeues it."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:TENANT_MIGRATION - 1]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {TENANT_MIGRATION - 1}")
    conn.execute(
        "INSERT INTO jobs (id, kind, payload, status, attempts, available_at, last_error, "
        "created_at, updated_at) VALUES ('old', 'learn', x'7b7d', 'dead', 5, 0, 'boom', 0, 0)")
    conn.commit()
    conn.close()
    async with SqliteDatabase(path) as db:
        queue = SqliteLearningQueue(db)
        assert await queue.dead_letters(tenant="default") == []
        assert not await queue.requeue("old", tenant="default")
        assert not await queue.drop("old", tenant="default")
        [legacy] = await queue.dead_letters()
        assert (legacy.id, legacy.tenant, legacy.attempts) == ("old", None, 5)
        assert await queue.requeue("old")
        job = await queue.claim("w", lease_seconds=30)
        assert job is not None
        assert job.id == "old"
