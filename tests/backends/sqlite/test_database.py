"""Reads issued together share one trip to the reader thread; each caller still gets its
own result or its own error."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase


async def test_concurrent_reads_each_get_their_result(tmp_path: Path) -> None:
    """Reads gathered in one loop iteration are answered in order, each with its value."""
    async with SqliteDatabase(tmp_path / "db.sqlite") as db:
        values = await asyncio.gather(*(
            db.read(lambda c, n=n: c.execute("SELECT ?", (n,)).fetchone()[0])
            for n in range(20)
        ))
    assert values == list(range(20))


async def test_a_failing_read_fails_only_its_caller(tmp_path: Path) -> None:
    """An error in one read of a batch reaches that caller; the others succeed."""
    async with SqliteDatabase(tmp_path / "db.sqlite") as db:
        good, bad, also_good = await asyncio.gather(
            db.read(lambda c: c.execute("SELECT 1").fetchone()[0]),
            db.read(lambda c: c.execute("SELECT * FROM missing").fetchone()),
            db.read(lambda c: c.execute("SELECT 2").fetchone()[0]),
            return_exceptions=True,
        )
    assert (good, also_good) == (1, 2)
    assert isinstance(bad, sqlite3.OperationalError)


async def test_a_cancelled_reader_does_not_break_the_batch(tmp_path: Path) -> None:
    """A caller that gave up (deadline) leaves the other reads of its batch unharmed."""
    async with SqliteDatabase(tmp_path / "db.sqlite") as db:
        doomed = asyncio.ensure_future(db.read(lambda c: c.execute("SELECT 1").fetchone()))
        kept = asyncio.ensure_future(db.read(lambda c: c.execute("SELECT 3").fetchone()[0]))
        doomed.cancel()
        assert await kept == 3
        with pytest.raises(asyncio.CancelledError):
            await doomed


async def test_reading_a_closed_database_raises(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path / "db.sqlite")
    with pytest.raises(sqlite3.ProgrammingError):
        await db.read(lambda c: c.execute("SELECT 1"))


async def test_processes_opening_a_new_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    """Several connections creating the same new database concurrently (serve --processes,
    a worker next to serve) all open it: each migration runs once, in one of them."""
    from proxy.backends.sqlite.migrations import MIGRATIONS

    path = tmp_path / "shared.db"
    databases = [SqliteDatabase(path) for _ in range(4)]
    await asyncio.gather(*(db.__aenter__() for db in databases))
    try:
        versions = await asyncio.gather(*(db.read(
            lambda c: c.execute("PRAGMA user_version").fetchone()[0]) for db in databases))
    finally:
        for db in databases:
            await db.close()
    assert versions == [len(MIGRATIONS)] * 4


async def test_reads_of_tasks_started_alongside_share_one_batch(tmp_path: Path) -> None:
    """A read issued now and reads of tasks this step starts (a recall gathering its
    searches beside its profile read) go to the reader thread as one batch."""
    async with SqliteDatabase(tmp_path / "db.sqlite") as db:
        threads: list[int] = []

        def ident(c: sqlite3.Connection) -> int:
            import threading

            threads.append(threading.get_ident())
            return int(c.execute("SELECT 1").fetchone()[0])

        async def nested() -> list[int]:
            return list(await asyncio.gather(db.read(ident), db.read(ident)))

        batches: list[int] = []
        submit = db._submit_batch

        def counted(loop: asyncio.AbstractEventLoop) -> None:
            batches.append(len(db._batch))
            submit(loop)

        db._submit_batch = counted  # type: ignore[method-assign]
        await asyncio.gather(db.read(ident), nested(), db.read(ident))
        assert batches == [4]
        await db.read(ident)  # a later read is a batch of its own
        assert batches == [4, 1]


async def test_queued_writes_under_a_lock_fail_within_one_busy_timeout(tmp_path: Path) -> None:
    """While another process holds the write lock, writes queued behind each other all
    fail with "database is locked" within about one busy timeout in all — not one
    timeout each, one after the other."""
    path = tmp_path / "db.sqlite"
    async with SqliteDatabase(path, busy_timeout=0.3) as db:
        await db.write(lambda c: c.execute("CREATE TABLE t (n INTEGER)"))
        other = sqlite3.connect(path, isolation_level=None, timeout=0)
        other.execute("BEGIN IMMEDIATE")
        try:
            started = asyncio.get_running_loop().time()
            results = await asyncio.gather(*(
                db.write(lambda c, n=n: c.execute("INSERT INTO t VALUES (?)", (n,)))
                for n in range(6)), return_exceptions=True)
            took = asyncio.get_running_loop().time() - started
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert all(isinstance(r, sqlite3.OperationalError) and "locked" in str(r)
                   for r in results), results
        assert took < 1.0  # six full timeouts one after the other would be 1.8 s
        # The lock gone, writes succeed again, with the full timeout restored.
        await db.write(lambda c: c.execute("INSERT INTO t VALUES (7)"))
        assert [tuple(r) for r in await db.read(
            lambda c: c.execute("SELECT n FROM t").fetchall())] == [(7,)]
        assert await db.write(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) == 300
