"""The store's part of conflicts and the profile over time, on both backends
(docs/design.md#conflicts, docs/design.md#profile-over-time): a change set writes
conflicts and weekly snapshots with the memories it changes, listings stay within the
user, snapshots are bounded, and erasure removes both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.ledger import SqliteLedger
from proxy.backends.sqlite.store import SqliteMemoryStore
from proxy.ledger import Ledger
from proxy.memory.conflicts import (
    HISTORY_WEEKS,
    MAX_CONFLICTS,
    STATUS_FILTERS,
    Conflict,
    ProfileWeek,
    WeightedTag,
    iso_week,
    mark_pair,
)
from proxy.memory.records import Memory, new_id
from proxy.memory.store import AuditEvent, ChangeSet, MemoryStore
from tests.memory.conftest import DIM
from tests.memory.test_store_contract import ask, mem

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def conflict(retired: Memory, successor: Memory, *, user: str = "u1", minutes: int = 0,
             **fields: Any) -> Conflict:
    return Conflict(id=fields.pop("id", new_id()), tenant="t1", user_id=user,
                    kind=fields.pop("kind", "supersede"),
                    status=fields.pop("status", "unconfirmed"), retired_id=retired.id,
                    successor_id=successor.id, reason="test",
                    created_at=T0 + timedelta(minutes=minutes), **fields)


def week(number: int, *, user: str = "u1", score: float = 1.0) -> ProfileWeek:
    moment = T0 + timedelta(weeks=number)
    return ProfileWeek(tenant="t1", user_id=user, week=iso_week(moment), at=moment,
                       traits=(WeightedTag("curious", score),),
                       topics=(WeightedTag("hiking", score / 2),))


async def test_a_change_set_writes_its_conflicts_and_the_marks_round_trip(
        store: MemoryStore) -> None:
    """Conflicts of an applied change set are listed by status filter (newest first) and
    read back by id; the open conflict's marks come back on get and on search; another
    user of the tenant sees none of them."""
    old = mem("Lives in Porto for work", hits=3)
    gone = mem("Works at the harbour office", minutes=1)
    await store.add(old)
    await store.add(gone)
    new = mem("Lives in Braga for work", minutes=2)
    successor = mem("Works at the central office", minutes=3)
    marked_old, marked_new = mark_pair(old, new)
    retired = gone.with_changes(enabled=False, superseded_at=T0, superseded_by=successor.id)
    opened = conflict(old, new, kind="contradicts", status="open", minutes=5)
    supersede = conflict(gone, successor, minutes=4)
    assert await store.apply(ChangeSet(
        tenant="t1", user_id="u1", batch_key="b-conflicts",
        upserts=(marked_old, marked_new, retired, successor),
        conflicts=(opened, supersede)))
    listed = await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["open"])
    assert [c.id for c in listed] == [opened.id, supersede.id]
    assert await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["settled"]) == []
    assert await store.get_conflict("t1", "u1", opened.id) == opened
    assert await store.get_conflict("t1", "u2", opened.id) is None
    assert await store.list_conflicts("t1", "u2", statuses=STATUS_FILTERS["all"]) == []
    stored_old = await store.get("t1", "u1", old.id)
    stored_new = await store.get("t1", "u1", new.id)
    assert stored_old is not None
    assert stored_new is not None
    assert (stored_old.conflict_with, stored_old.conflict_yields) == (new.id, False)
    assert (stored_new.conflict_with, stored_new.conflict_yields) == (old.id, True)
    found = {c.memory.id: c.memory for c in await store.search(ask("Lives for work"))}
    assert found[new.id].conflict_yields is True
    assert found[old.id].conflict_yields is False


async def test_a_conflict_replaced_by_id_changes_status(store: MemoryStore) -> None:
    """A later change set with the same conflict id replaces it (how a settlement is
    written): the status filters follow."""
    a, b = mem("Plays the cello on weekends"), mem("Plays the violin on weekends")
    pending = conflict(a, b)
    await store.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b1", upserts=(a, b),
                                conflicts=(pending,)))
    done = Conflict(**{**{f: getattr(pending, f) for f in Conflict.__slots__},
                       "status": "confirmed", "settled_at": T0, "settled_by": "user"})
    await store.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b2", upserts=(a, b),
                                conflicts=(done,)))
    assert await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["open"]) == []
    assert await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["settled"]) == \
        [done]


async def test_a_conflict_without_both_memories_is_not_written(store: MemoryStore) -> None:
    """A conflict naming a memory neither written by the change set nor stored is left
    out; one whose memories are both there is written."""
    a, b = mem("Owns a red bicycle"), mem("Owns a blue bicycle")
    missing = mem("Owns no bicycle")
    await store.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="b1", upserts=(a, b),
                                conflicts=(conflict(a, missing), conflict(a, b))))
    listed = await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["all"])
    assert [(c.retired_id, c.successor_id) for c in listed] == [(a.id, b.id)]


async def test_weekly_snapshots_are_kept_oldest_first_and_bounded(
        store: MemoryStore) -> None:
    """Snapshots come back oldest first; the same week is overwritten; past
    HISTORY_WEEKS the oldest weeks are dropped; another user has none."""
    for number in range(HISTORY_WEEKS + 2):
        assert await store.apply(ChangeSet(tenant="t1", user_id="u1",
                                           batch_key=f"w{number}", snapshot=week(number)))
    await store.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="again",
                                snapshot=week(HISTORY_WEEKS + 1, score=7.0)))
    weeks = await store.profile_history("t1", "u1")
    assert len(weeks) == HISTORY_WEEKS
    assert weeks[0].week == week(2).week
    assert weeks[-1].week == week(HISTORY_WEEKS + 1).week
    assert weeks[-1].traits == (WeightedTag("curious", 7.0),)
    assert [w.week for w in weeks] == sorted(w.week for w in weeks)
    assert await store.profile_history("t1", "u2") == []


async def test_erasure_removes_conflicts_and_snapshots_of_that_user_only(
        store: MemoryStore) -> None:
    """erase_user deletes the user's conflicts and weekly snapshots; another user's stay."""
    for user in ("u1", "u2"):
        a, b = mem(f"Likes jazz {user}", user=user), mem(f"Likes rock {user}", user=user)
        await store.apply(ChangeSet(tenant="t1", user_id=user, batch_key=f"b-{user}",
                                    upserts=(a, b), conflicts=(conflict(a, b, user=user),),
                                    snapshot=week(1, user=user)))
    erased = AuditEvent(tenant="t1", user_id="u1", action="erased", actor="user",
                        at=datetime.now(UTC))
    await store.erase_user("t1", "u1", audit=erased)
    assert await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["all"]) == []
    assert await store.profile_history("t1", "u1") == []
    assert len(await store.list_conflicts("t1", "u2", statuses=STATUS_FILTERS["all"])) == 1
    assert len(await store.profile_history("t1", "u2")) == 1


async def test_clearing_removes_conflicts_and_snapshots_of_that_user_only(
        store: MemoryStore) -> None:
    """clear (the "clear all" of the memory API) deletes the user's conflicts and weekly
    snapshots with their memories; another user's stay."""
    for user in ("u1", "u2"):
        a, b = mem(f"Likes jazz {user}", user=user), mem(f"Likes rock {user}", user=user)
        await store.apply(ChangeSet(tenant="t1", user_id=user, batch_key=f"c-{user}",
                                    upserts=(a, b), conflicts=(conflict(a, b, user=user),),
                                    snapshot=week(1, user=user)))
    assert await store.clear("t1", "u1") == 2
    assert await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["all"]) == []
    assert await store.profile_history("t1", "u1") == []
    assert len(await store.list_conflicts("t1", "u2", statuses=STATUS_FILTERS["all"])) == 1
    assert len(await store.profile_history("t1", "u2")) == 1


def test_a_disabled_memory_yields_to_the_enabled_one_whatever_its_evidence() -> None:
    """mark_pair keeps the enabled memory of a pair even when the disabled one has more
    evidence; with both enabled, evidence decides again."""
    strong, weak = mem("Works at the harbour office", hits=5), mem("Works in town")
    off_strong, kept_weak = mark_pair(strong.with_changes(enabled=False), weak)
    assert (off_strong.conflict_yields, kept_weak.conflict_yields) == (True, False)
    on_strong, held_weak = mark_pair(strong, weak)
    assert (on_strong.conflict_yields, held_weak.conflict_yields) == (False, True)


async def test_conflicts_are_bounded_per_user_oldest_dropped(store: MemoryStore) -> None:
    """Past MAX_CONFLICTS a user's oldest conflicts are dropped; the newest stay; another
    user's are not touched."""
    a, b = mem("Drinks black coffee"), mem("Drinks green tea")
    first = tuple(conflict(a, b, minutes=i) for i in range(MAX_CONFLICTS))
    await store.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="many", upserts=(a, b),
                                conflicts=first))
    other_a, other_b = mem("Drinks milk", user="u2"), mem("Drinks water", user="u2")
    await store.apply(ChangeSet(tenant="t1", user_id="u2", batch_key="u2", upserts=(
        other_a, other_b), conflicts=(conflict(other_a, other_b, user="u2"),)))
    later = tuple(conflict(a, b, minutes=MAX_CONFLICTS + i) for i in range(2))
    await store.apply(ChangeSet(tenant="t1", user_id="u1", batch_key="more", upserts=(a, b),
                                conflicts=later))
    kept = await store.list_conflicts("t1", "u1", statuses=STATUS_FILTERS["all"],
                                      limit=2 * MAX_CONFLICTS)
    assert len(kept) == MAX_CONFLICTS
    ids = {c.id for c in kept}
    assert {c.id for c in later} <= ids
    assert not {c.id for c in first[:2]} & ids
    assert first[2].id in ids
    assert len(await store.list_conflicts("t1", "u2", statuses=STATUS_FILTERS["all"])) == 1


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def with_ledger(request: pytest.FixtureRequest,
                      tmp_path: Path) -> AsyncIterator[tuple[MemoryStore, Ledger]]:
    """A fresh store and the ledger beside it (whose tenant users index the Redis store's
    tenant listing reads), on SQLite, then on a real Redis."""
    if request.param == "sqlite":
        async with SqliteDatabase(tmp_path / "memory.db") as db:
            yield SqliteMemoryStore(db), SqliteLedger(db)
        return
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.ledger import RedisLedger
    from proxy.backends.redis.store import RedisMemoryStore

    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
    async with connect(url) as client:
        redis_store = RedisMemoryStore(client, key_prefix=prefix, vector_dim=DIM)
        await redis_store.prepare()
        yield redis_store, RedisLedger(client, key_prefix=prefix)


async def test_the_tenant_listing_holds_every_users_conflicts_of_that_tenant_only(
        with_ledger: tuple[MemoryStore, Ledger]) -> None:
    """list_tenant_conflicts: the conflicts of users spread over a tenant of 230 users
    (more than one Redis round of 200), newest first, each under its user; the same user
    id in another tenant stays out, as does that tenant's only user; the status filter
    and the limit apply across users; a tenant without conflicts lists nothing."""
    store, ledger = with_ledger
    users = [f"u{n:03d}" for n in range(230)]
    for user in users:
        await ledger.register_user("t1", user, T0)
    await ledger.register_user("t2", "u000", T0)
    written: dict[tuple[str, str], Conflict] = {}
    for minutes, (tenant, user, status) in enumerate((
            ("t1", "u000", "unconfirmed"), ("t2", "u000", "open"), ("t1", "u150", "open"),
            ("t1", "u229", "confirmed"), ("t1", "u199", "reversed"))):
        a = mem(f"Likes jazz {user}", tenant=tenant, user=user)
        b = mem(f"Likes rock {user}", tenant=tenant, user=user)
        made = replace(conflict(a, b, user=user, minutes=minutes, status=status),
                       tenant=tenant)
        assert await store.apply(ChangeSet(tenant=tenant, user_id=user,
                                           batch_key=f"t-{tenant}-{user}", upserts=(a, b),
                                           conflicts=(made,)))
        written[tenant, user] = made
    every = await store.list_tenant_conflicts("t1", statuses=STATUS_FILTERS["all"])
    assert every == [written["t1", u] for u in ("u199", "u229", "u150", "u000")]
    assert [c.user_id for c in every] == ["u199", "u229", "u150", "u000"]
    assert {c.tenant for c in every} == {"t1"}
    assert await store.list_tenant_conflicts("t1", statuses=STATUS_FILTERS["open"]) == \
        [written["t1", "u150"], written["t1", "u000"]]
    assert await store.list_tenant_conflicts("t1", statuses=STATUS_FILTERS["settled"],
                                             limit=1) == [written["t1", "u199"]]
    assert await store.list_tenant_conflicts("t2", statuses=STATUS_FILTERS["all"]) == \
        [written["t2", "u000"]]
    assert await store.list_tenant_conflicts("t3", statuses=STATUS_FILTERS["all"]) == []
    assert await store.list_tenant_conflicts("t1", statuses=STATUS_FILTERS["all"],
                                             limit=0) == []
