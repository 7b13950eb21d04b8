"""Erased text leaves the SQLite files (docs/design.md#erasure): after an erasure the
main file and its ``-wal`` hold none of the user's words, no row but the erasure marker
and the tombstone event names the user, and a later erasure within the purge period
merges the keyword index only when the period ends."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.queue import SqliteLearningQueue
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.memory.store import AuditEvent, ChangeSet
from tests.learning.test_queue_contract import exchange, turn
from tests.memory.test_store_contract import mem

ERASED = "zanzibarquokkaxq"  # appears nowhere else
KEPT = "kilimanjarowombat"  # another user's word, which must stay
VICTIM = "victim-user-7f3a"


def _files_hold(path: Path, word: str) -> bool:
    return any(word.encode() in p.read_bytes()
               for p in (path, path.with_name(path.name + "-wal")) if p.is_file())


def _tombstone(user: str) -> AuditEvent:
    return AuditEvent(tenant="t1", user_id=user, action="erased", actor="user",
                      at=datetime.now(UTC))


async def test_main_file_and_wal_hold_no_erased_word(tmp_path: Path) -> None:
    """Memories, a buffered turn and its fingerprints of the user, written and then
    erased: neither file holds the word or a row naming the user beyond the marker and
    the tombstone; the other user's word is still in the files."""
    path = tmp_path / "memory.db"
    async with SqliteDatabase(path) as db:
        store, queue = SqliteMemoryStore(db), SqliteLearningQueue(db)
        for i in range(3):
            await store.add(mem(f"Owns a {ERASED} number {i}", user=VICTIM))
        await store.add(mem(f"Owns a {KEPT}", user="u2"))
        await queue.buffer(exchange(turn(f"my {ERASED} sleeps"), user=VICTIM),
                           batch_size=9, now=1000)
        group_key = "b_" + "0" * 32 + ":" + VICTIM  # a group batch's key for the user
        await store.apply(ChangeSet(tenant="t1", user_id=VICTIM, batch_key=group_key,
                                    upserts=(mem(f"Said {ERASED} in the group",
                                                 user=VICTIM),)))
        assert _files_hold(path, ERASED)

        await queue.erase_user("t1", VICTIM, names=[])
        await store.erase_user("t1", VICTIM, audit=_tombstone(VICTIM))

        assert not _files_hold(path, ERASED)
        assert _files_hold(path, KEPT)
        assert path.with_name(path.name + "-wal").stat().st_size == 0

        def naming(conn: sqlite3.Connection) -> set[str]:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {t for t in tables
                    if any(VICTIM in str(tuple(row))
                           for row in conn.execute("SELECT * FROM " + t))}  # noqa: S608

        assert await db.read(naming) == {"user_settings", "audit_log"}


async def test_a_second_erasure_within_the_period_merges_the_index_when_it_ends(
        tmp_path: Path) -> None:
    """The first erasure merges the keyword index at once; a second one within
    ``purge_seconds`` owes its merge (none runs), which runs once the period ended."""
    async with SqliteDatabase(tmp_path / "memory.db") as db:
        store = SqliteMemoryStore(db, purge_seconds=600)
        await store.add(mem("first fact", user="a"))
        await store.erase_user("t1", "a", audit=_tombstone("a"))
        await store.add(mem("second fact", user="b"))
        await store.erase_user("t1", "b", audit=_tombstone("b"))
        now = datetime.now(UTC).timestamp()
        assert await store.purge_erased(now=now) is False  # within the period
        assert await store.purge_erased(now=now + 601) is True
        assert await store.purge_erased(now=now + 1300) is False  # nothing owed
