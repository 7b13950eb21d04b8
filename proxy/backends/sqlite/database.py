"""The embedded database: one SQLite file in WAL mode, used off the event loop.

Writes run on one dedicated thread and connection (SQLite allows one writer), each call in
its own ``BEGIN IMMEDIATE`` transaction; reads run on a second thread with its own
connection, so a long write never stalls the hot path's reads (WAL readers do not block on
the writer). Reads issued in the same event-loop iteration (or the next one) go to the
reader thread as one batch: a recall's reads — and those of concurrent requests — cost one
thread hop and one wake-up of the loop instead of one each (bench/gateway: the reader
thread's queue had recalls missing their 150 ms deadline at 32 concurrent requests).
Schema changes are numbered migrations tracked in ``PRAGMA user_version``
(:mod:`proxy.backends.sqlite.migrations`).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from proxy.backends.sqlite import migrations

T = TypeVar("T")
# How long a statement waits for another process's lock before failing (then callers see
# StoreUnavailableError: 503 on the API, degraded memory on chat, a retried learning job).
BUSY_TIMEOUT_SECONDS = 5.0
# A write queued this long or more behind other writes gets the rest of its busy timeout
# as its busy timeout (shorter waits are not worth a PRAGMA).
LATE_WRITE_SECONDS = 0.05



class SqliteDatabase:
    """A SQLite file with one writer thread and one reader thread.

    Use as ``async with SqliteDatabase(path) as db``; :meth:`read` and :meth:`write` run a
    function ``fn(connection) -> T`` on the right thread and return its result.
    ``sqlite3.Error`` propagates to the caller unchanged. ``busy_timeout`` (seconds): how
    long a statement waits for another process's lock before ``database is locked``
    (default :data:`BUSY_TIMEOUT_SECONDS`); a write's wait behind other writes counts in
    it (:meth:`write`).
    """

    def __init__(self, path: Path | str, *, busy_timeout: float | None = None) -> None:
        self.path = Path(path)
        # Read at construction (not at import), so the module constant is the one default.
        self.busy_timeout = BUSY_TIMEOUT_SECONDS if busy_timeout is None else busy_timeout
        self._writer: ThreadPoolExecutor | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._lconn: sqlite3.Connection | None = None  # the event loop's, for small reads
        self._bulk: ThreadPoolExecutor | None = None  # long reads, beside the reader
        self._bconn: sqlite3.Connection | None = None
        self._batch: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []

    async def __aenter__(self) -> SqliteDatabase:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="sqlite-writer")
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="sqlite-reader")
        loop = asyncio.get_running_loop()
        self._wconn = await loop.run_in_executor(self._writer, self._connect, True)
        self._rconn = await loop.run_in_executor(self._reader, self._connect, False)
        self._lconn = self._connect(False)
        # A small read on the loop never waits for a lock: busy → it goes to the reader.
        self._lconn.execute("PRAGMA busy_timeout=0")

    def _connect(self, migrate: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True,
                               timeout=self.busy_timeout)
        conn.row_factory = sqlite3.Row
        _enter_wal(conn, self.busy_timeout)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        # Deleted memories are overwritten on disk, not left in free pages: "delete" means
        # gone from the file too (users delete what was learned about them:
        # docs/design.md#deletion).
        conn.execute("PRAGMA secure_delete=ON")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        if migrate:
            migrations.migrate(conn)
        return conn

    async def close(self) -> None:
        if self._lconn is not None:
            self._lconn.close()
            self._lconn = None
        loop = asyncio.get_running_loop()
        if self._bulk is not None:
            if self._bconn is not None:
                await loop.run_in_executor(self._bulk, self._bconn.close)
            self._bulk.shutdown(wait=True)
            self._bulk, self._bconn = None, None
        for executor, conn in ((self._reader, self._rconn), (self._writer, self._wconn)):
            if executor is not None and conn is not None:
                await loop.run_in_executor(executor, conn.close)
            if executor is not None:
                executor.shutdown(wait=True)
        self._reader = self._writer = None
        self._rconn = self._wconn = None

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the reader connection (autocommit; a consistent WAL snapshot per
        statement), batched with the other reads of this loop iteration."""
        if self._reader is None or self._rconn is None:
            raise sqlite3.ProgrammingError("database is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if not self._batch:
            # Submitted one loop iteration later: tasks that this iteration starts (a
            # recall's searches, gathered beside its profile and resident reads) join the
            # batch, so a recall costs one thread hop instead of two.
            loop.call_soon(loop.call_soon, self._submit_batch, loop)
        self._batch.append((fn, future))
        return await future

    async def read_small(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` — a read of a few rows by primary key, tens of microseconds — on
        the event loop's own connection: no thread hop. A lock it would wait for (busy)
        sends it to the reader thread (:meth:`read`) instead."""
        conn = self._lconn
        if conn is None:
            return await self.read(fn)
        try:
            return fn(conn)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return await self.read(fn)

    async def read_bulk(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` — a long read (a user's whole recall corpus) — on a third thread and
        connection, opened on first use, so it never queues the hot path's reads."""
        if self._reader is None:
            raise sqlite3.ProgrammingError("database is not open")
        if self._bulk is None:
            self._bulk = ThreadPoolExecutor(1, thread_name_prefix="sqlite-bulk")

        def run() -> T:
            if self._bconn is None:
                self._bconn = self._connect(False)
            return fn(self._bconn)

        return await asyncio.get_running_loop().run_in_executor(self._bulk, run)

    def _submit_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._batch = self._batch, []
        if self._reader is None or self._rconn is None:
            for _, future in batch:
                if not future.done():
                    future.set_exception(sqlite3.ProgrammingError("database is not open"))
            return
        conn = self._rconn

        def run() -> None:
            outcomes: list[tuple[bool, Any]] = []
            for fn, future in batch:
                if future.cancelled():
                    outcomes.append((True, None))
                    continue
                try:
                    outcomes.append((True, fn(conn)))
                except BaseException as exc:  # handed to the awaiting caller
                    outcomes.append((False, exc))
            loop.call_soon_threadsafe(_settle, batch, outcomes)

        self._reader.submit(run)

    async def checkpoint(self) -> bool:
        """``PRAGMA wal_checkpoint(TRUNCATE)`` on the writer connection, outside any
        transaction: every page of the ``-wal`` file is copied into the database and the
        ``-wal`` file is cut to zero bytes. ``False`` when a reader of another connection
        kept it from completing (it waited ``busy_timeout`` for them)."""
        if self._writer is None or self._wconn is None:
            raise sqlite3.ProgrammingError("database is not open")
        conn = self._wconn

        def run() -> bool:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            return not busy

        return await asyncio.get_running_loop().run_in_executor(self._writer, run)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside ``BEGIN IMMEDIATE … COMMIT`` on the writer connection; any
        exception rolls the transaction back and propagates.

        A write waits at most ``busy_timeout`` seconds in all, its wait behind earlier
        writes on the writer thread included: while another process holds the file's lock
        each queued write would otherwise wait its own full timeout after the one before
        it (a manual memory queued behind other writes answered only after several). A
        write whose timeout ran out in the queue raises :class:`sqlite3.OperationalError`
        ("database is locked") without trying; one that starts late (by
        :data:`LATE_WRITE_SECONDS` or more) gets what is left as its busy timeout."""
        if self._writer is None or self._wconn is None:
            raise sqlite3.ProgrammingError("database is not open")
        conn = self._wconn
        queued = time.monotonic()

        def run() -> T:
            waited = time.monotonic() - queued
            left = self.busy_timeout - waited
            if left <= 0:
                raise sqlite3.OperationalError(
                    f"database is locked: the write waited {waited:.1f} s for the writer "
                    f"(busy timeout {self.busy_timeout:g} s)")
            late = waited >= LATE_WRITE_SECONDS
            if late:
                conn.execute(f"PRAGMA busy_timeout={max(1, int(left * 1000))}")
            try:
                return _transaction(conn, fn)
            finally:
                if late:
                    conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")

        return await asyncio.get_running_loop().run_in_executor(self._writer, run)


def _transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn(conn)`` inside ``BEGIN IMMEDIATE … COMMIT``, rolled back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _settle(batch: list[tuple[Any, asyncio.Future[Any]]],
            outcomes: list[tuple[bool, Any]]) -> None:
    for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


# Pause between tries of the switch to WAL while another process holds the lock.
WAL_RETRY_SECONDS = 0.05


def _enter_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Switch ``conn``'s file to WAL. SQLite's busy handler does not cover the lock that
    change takes, so processes opening a new file at the same moment (``serve --processes``,
    a worker beside ``serve``) get "database is locked" at once: retry until ``timeout``
    seconds, then raise :class:`sqlite3.OperationalError` as SQLite does."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_SECONDS)
        else:
            return


def preflight(path: Path) -> None:
    """Check that the database file at ``path`` can be created and opened (its folder is
    made if missing), before a server starts. Raises :class:`OSError` or
    :class:`sqlite3.Error` with the reason."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sqlite3.connect(path).close()
