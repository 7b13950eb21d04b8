"""What only the SQLite queue has: the migrations that give jobs their tenant and index
the budget-postponed ones."""

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


POSTPONED_INDEX_MIGRATION = 18  # the partial index of budget-postponed jobs


async def test_jobs_postponed_before_the_index_are_listed_after_it(tmp_path: Path) -> None:
    """A file whose jobs a spent budget put off under the previous schema lists their
    tenant once migrated — only for jobs still waiting (not one leased, not one merely
    retried) — and resuming them empties the list."""
    path = tmp_path / "old.db"
    async with SqliteDatabase(path):
        pass
    conn = sqlite3.connect(path)  # the schema before the index: the rest is the same
    conn.execute("DROP INDEX jobs_postponed")
    conn.execute(f"PRAGMA user_version = {POSTPONED_INDEX_MIGRATION - 1}")
    conn.executemany(
        "INSERT INTO jobs (id, kind, payload, status, attempts, available_at, created_at, "
        "updated_at, tenant, postponed) VALUES (?, 'learn', x'7b7d', ?, 0, 9e9, 0, 0, ?, ?)",
        [("a", "ready", "t1", 1), ("b", "ready", "t1", 1), ("c", "ready", "t2", 0),
         ("d", "leased", "t3", 1)])
    conn.commit()
    conn.close()
    async with SqliteDatabase(path) as db:
        queue = SqliteLearningQueue(db)
        assert await queue.postponed_tenants() == ["t1"]
        assert await queue.resume_postponed("t1") == 2
        assert await queue.postponed_tenants() == []
