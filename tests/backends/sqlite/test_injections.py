"""Injection records on SQLite: the per-user cap walks a user's rows only when they may
be over it, and still holds when rows expired, were erased, or came from another
process writing the same file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from proxy.backends.sqlite import injections
from proxy.backends.sqlite.migrations import migrate
from proxy.memory.explain import InjectionRecord, row
from proxy.memory.records import new_id

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
OWNER = ("t1", "u1")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(":memory:", isolation_level=None)
    migrate(connection)
    yield connection
    connection.close()


def records(count: int, *, start: int = 0, user: str = "u1") -> list[InjectionRecord]:
    return [InjectionRecord(id=new_id(), tenant="t1", user=user,
                            created_at=T0 + timedelta(seconds=start + i), model="m",
                            conversation_id=None, channel="private", items=())
            for i in range(count)]


def write(conn: sqlite3.Connection, batch: list[InjectionRecord], counts: injections.Counts,
          *, per_user: int = 5) -> list[str]:
    """Insert ``batch``; the statements that walked a user's rows for the cap."""
    walks: list[str] = []
    conn.set_trace_callback(lambda sql: walks.append(sql) if "OFFSET" in sql else None)
    injections.insert(conn, [row(r) for r in batch], cutoff=T0 - timedelta(days=7),
                      per_user=per_user, counts=counts)
    conn.set_trace_callback(None)
    return walks


def stored_ids(conn: sqlite3.Connection, user: str = "u1") -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT id FROM injections WHERE tenant = 't1' AND user_id = ? "
        "ORDER BY created_at", (user,))]


def test_a_user_under_the_cap_is_not_walked_and_one_over_it_keeps_the_newest(
        conn: sqlite3.Connection) -> None:
    counts = injections.Counts(Clock())
    first = records(3)
    assert write(conn, first, counts) == []
    assert write(conn, records(2, start=3), counts) == []  # 5: at the cap, not over
    later = records(2, start=5)
    assert len(write(conn, later, counts)) == 1  # 7 > 5: one walk drops the oldest two
    assert stored_ids(conn)[-2:] == [r.id for r in later]
    assert len(stored_ids(conn)) == 5
    assert first[0].id not in stored_ids(conn)
    assert len(write(conn, records(1, start=7), counts)) == 1  # at the cap: each write


def test_rows_that_went_away_are_counted_again(conn: sqlite3.Connection) -> None:
    """After erasure (or expiry) the bound is stale-high: one walk finds nothing to drop,
    the user is counted again, and the next writes under the cap walk nothing."""
    counts = injections.Counts(Clock())
    write(conn, records(5), counts)
    conn.execute("DELETE FROM injections WHERE tenant = 't1' AND user_id = 'u1'")
    assert len(write(conn, records(1, start=10), counts)) == 1  # bound 6: walked once
    assert write(conn, records(3, start=11), counts) == []  # counted again: 4 of 5
    assert len(stored_ids(conn)) == 4


def test_rows_another_writer_added_are_capped_at_the_recount(
        conn: sqlite3.Connection) -> None:
    clock = Clock()
    counts = injections.Counts(clock)
    neighbour = records(2, user="u2")
    write(conn, records(2) + neighbour, counts)
    write(conn, records(6, start=2), injections.Counts(Clock()))  # another process
    assert len(stored_ids(conn)) == 5  # its own write trimmed what it saw
    write(conn, records(4, start=8), injections.Counts(Clock()))
    assert len(stored_ids(conn)) == 5
    # This process's bound says 2: its next write is not walked until the recount.
    assert write(conn, records(1, start=12), counts) == []
    assert len(stored_ids(conn)) == 6
    clock.now += injections.Counts.RECOUNT_SECONDS
    assert len(write(conn, records(1, start=13), counts)) == 1
    assert len(stored_ids(conn)) == 5
    assert stored_ids(conn, "u2") == [r.id for r in neighbour]  # their cap is their own


def test_a_flush_of_several_statements_writes_each_record_once(
        conn: sqlite3.Connection) -> None:
    """A flush larger than one INSERT statement's rows writes every record in order,
    each reading back as written; the cap then keeps the newest across statements; the
    same records sent again (a flush retried after a write whose outcome was lost) add
    no second row."""
    counts = injections.Counts(Clock())
    items = (("memory", "m1", 0.5, ("keyword",)),)
    size = injections.ROWS_PER_INSERT * 2 + 7
    batch = [r._replace(items=items) for r in records(size)]
    write(conn, batch, counts, per_user=size)
    assert stored_ids(conn) == [r.id for r in batch]
    for r in (batch[0], batch[injections.ROWS_PER_INSERT], batch[-1]):
        assert injections.get(conn, "t1", "u1", r.id, since=T0) == r
    write(conn, batch, counts, per_user=size)
    assert stored_ids(conn) == [r.id for r in batch]
    newer = records(3, start=size)
    write(conn, newer, counts, per_user=size)
    assert stored_ids(conn) == [r.id for r in batch[3:] + newer]
    assert injections.get(conn, "t1", "u1", batch[2].id, since=T0) is None
