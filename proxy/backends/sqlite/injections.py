"""Injection records on SQLite (docs/design.md#injection-records): table ``injections``
(migration 17), one row per record: its id, owner and time in columns and the rest in
the compact form of :func:`~proxy.memory.explain.stored` (rows written before it hold the
API's JSON; both read back). Functions of a connection, run by
:class:`~proxy.backends.sqlite.store.SqliteMemoryStore` in a write transaction or on the
reader thread."""

from __future__ import annotations

import functools
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime

from proxy.memory.explain import InjectionRecord, RecordRow, from_stored
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


# Rows one INSERT statement writes (5 bound values each, far under SQLite's 32,766): the
# rows of a statement are bound and stepped in C in one call, where ``executemany`` made a
# call per row, and the writer thread releases and takes back the GIL (which ``sqlite3``
# drops around each step) once per statement instead of once per row, so a flush of
# hundreds of records hands the GIL to and from the event loop a few times, not hundreds
# (``bench/injection_cost.py``).
ROWS_PER_INSERT = 100


@functools.lru_cache(maxsize=8)
def _insert_rows(count: int) -> str:
    return ("INSERT OR IGNORE INTO injections (id, tenant, user_id, created_at, record) "
            "VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * count))


class Counts:
    """An upper bound of each user's stored records, kept by the store so that a write
    walks a user's rows (to drop those beyond the cap) only when the user may be over it:
    a user writing one record a second would otherwise walk up to ``per_user`` index
    entries on every flush (``bench/injection_cost.py``, "flush of 1"). Touched only in
    write transactions (one writer thread). A bound is never below the true count: it
    starts as a ``COUNT`` of the user's rows, grows by each record written, and after a
    walk is the cap, or the count again when the walk dropped nothing (rows that expired or
    were erased since). A rolled-back write leaves it high, which only costs a walk. Every
    :data:`RECOUNT_SECONDS` and at :data:`MAX_OWNERS` users the bounds start over (each
    user counted again at their next write), so rows another process wrote to the same
    file (the gateway is their one writer; a second one would be) count within a minute.
    """

    MAX_OWNERS = 100_000
    RECOUNT_SECONDS = 60.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._bounds: dict[tuple[str, str], int] = {}
        self._clock = clock
        self._since = clock()

    def start(self) -> None:
        """Called at each write: forget the bounds when they are due for a recount."""
        now = self._clock()
        if now - self._since >= self.RECOUNT_SECONDS or len(self._bounds) >= self.MAX_OWNERS:
            self._bounds.clear()
            self._since = now

    def trim(self, conn: sqlite3.Connection, owner: tuple[str, str], written: int, *,
             per_user: int) -> None:
        """After ``written`` records of ``owner`` were inserted in this transaction, drop
        the owner's rows beyond their newest ``per_user`` if there may be any."""
        bound = self._bounds.get(owner)
        if bound is None:
            bound = _count(conn, owner)
        else:
            bound += written
        if bound > per_user:
            dropped = conn.execute(_OVERFLOW, (*owner, per_user)).rowcount
            bound = per_user if dropped else _count(conn, owner)
        self._bounds[owner] = bound


def _count(conn: sqlite3.Connection, owner: tuple[str, str]) -> int:
    row = conn.execute("SELECT COUNT(*) FROM injections WHERE tenant = ? AND user_id = ?",
                       owner).fetchone()
    return int(row[0])


def insert(conn: sqlite3.Connection, records: Sequence[RecordRow], *, cutoff: datetime,
           per_user: int, counts: Counts) -> None:
    """Insert ``records``, then drop records older than ``cutoff`` (all users) and each
    written user's records beyond their newest ``per_user`` (walked only when ``counts``
    says the user may be over it)."""
    for start in range(0, len(records), ROWS_PER_INSERT):
        chunk = records[start:start + ROWS_PER_INSERT]
        conn.execute(_insert_rows(len(chunk)), [
            value for r in chunk for value in (r[0], r[1], r[2], r[3], r[5])])
    conn.execute("DELETE FROM injections WHERE created_at < ?", (to_iso(cutoff),))
    counts.start()
    for owner, written in Counter((r[1], r[2]) for r in records).items():
        counts.trim(conn, owner, written, per_user=per_user)


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
