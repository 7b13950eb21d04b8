"""Token ledgers, on both backends: usage per user and tenant, learning apart
(docs/design.md#accounting)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.ledger import SqliteLedger
from proxy.ledger import (
    DailyUsage,
    LearningUsage,
    Ledger,
    Totals,
    UsageRecord,
    UsageRow,
    UsageWriter,
)
from proxy.memory.store import StoreUnavailableError
from tests.redis_server import free_port

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Ledger]:
    if request.param == "sqlite":
        async with SqliteDatabase(tmp_path / "ledger.db") as db:
            yield SqliteLedger(db)
        return
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.ledger import RedisLedger

    url = request.getfixturevalue("redis_url")
    async with connect(url) as client:
        yield RedisLedger(client, key_prefix=request.getfixturevalue("redis_prefix"))


def usage(user: str | None, prompt: int, completion: int, memory: int = 0, *,
          tenant: str = "t1") -> UsageRecord:
    return UsageRecord(at=T0, tenant=tenant, user_id=user, model="m", prompt_tokens=prompt,
                       completion_tokens=completion, memory_tokens=memory,
                       memories_injected=1 if memory else 0)


def learned(user: str | None, prompt: int, completion: int) -> LearningUsage:
    return LearningUsage(at=T0, tenant="t1", user_id=user, model="m", purpose="extract",
                         prompt_tokens=prompt, completion_tokens=completion)


async def test_usage_adds_up_per_user_and_per_tenant(ledger: Ledger) -> None:
    """Usage totals count requests and tokens per user, and per tenant across its users
    (records without a user count for the tenant only); other tenants are apart."""
    await ledger.record_usage([usage("u1", 10, 2, 5), usage("u1", 20, 3)])
    await ledger.record_usage([usage("u2", 1, 1), usage(None, 4, 0),
                               usage("u1", 99, 99, tenant="t2")])
    assert await ledger.usage_totals("t1", "u1") == Totals(2, 30, 5, 5)
    assert await ledger.usage_totals("t1", "u2") == Totals(1, 1, 1, 0)
    assert await ledger.usage_totals("t1") == Totals(4, 35, 6, 5)
    assert await ledger.usage_totals("t2") == Totals(1, 99, 99, 0)
    assert await ledger.usage_totals("t1", "nobody") == Totals(0, 0, 0, 0)


async def test_learning_tokens_are_kept_apart_from_usage(ledger: Ledger) -> None:
    """Learning calls go to the learning ledger only; they never add to usage."""
    await ledger.record_learning([learned("u1", 100, 20), learned(None, 5, 1)])
    await ledger.record_learning([])
    assert await ledger.learning_totals("t1", "u1") == Totals(1, 100, 20)
    assert await ledger.learning_totals("t1") == Totals(2, 105, 21)
    assert await ledger.usage_totals("t1", "u1") == Totals(0, 0, 0, 0)


async def test_recall_tokens_are_memory_cost_beside_usage(ledger: Ledger) -> None:
    """Query-embedding tokens add up as ``recall_tokens`` per user and tenant, apart from
    the user's prompt/completion tokens and never in the learning ledger."""
    await ledger.record_usage([replace(usage("u1", 10, 2, 5), recall_tokens=7),
                               replace(usage("u2", 1, 1), recall_tokens=3), usage("u1", 4, 0)])
    assert await ledger.usage_totals("t1", "u1") == Totals(2, 14, 2, 5, 7)
    assert await ledger.usage_totals("t1") == Totals(3, 15, 3, 5, 10)
    assert (await ledger.usage_totals("t1", "u2")).to_api() == {
        "requests": 1, "prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2,
        "memory_tokens": 0, "recall_tokens": 3}
    assert await ledger.learning_totals("t1") == Totals(0, 0, 0)


@pytest.mark.redis
async def test_redis_ledger_failure_is_store_unavailable() -> None:
    """An unreachable Redis surfaces as StoreUnavailableError from the Redis ledger."""
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.ledger import RedisLedger

    async with connect(f"redis://127.0.0.1:{free_port()}/0") as client:
        broken = RedisLedger(client)
        with pytest.raises(StoreUnavailableError):
            await broken.record_usage([usage("u1", 1, 1)])
        with pytest.raises(StoreUnavailableError):
            await broken.usage_totals("t1")


def dated(user: str | None, model: str, day: int, prompt: int, completion: int, *,
          memory: int = 0, tenant: str = "t1") -> UsageRecord:
    return UsageRecord(at=T0 + timedelta(days=day, hours=1), tenant=tenant, user_id=user,
                       model=model, prompt_tokens=prompt, completion_tokens=completion,
                       memory_tokens=memory, memories_injected=0)


def spent(user: str | None, model: str, day: int, purpose: str, tokens: int, *,
          tenant: str = "t1") -> LearningUsage:
    return LearningUsage(at=T0 + timedelta(days=day, hours=2), tenant=tenant, user_id=user,
                         model=model, purpose=purpose,  # type: ignore[arg-type]
                         prompt_tokens=tokens - 1, completion_tokens=1)


async def _seed(ledger: Ledger) -> None:
    await ledger.record_usage([dated("u1", "gpt", 0, 10, 2, memory=5),
                               dated("u1", "qwen", 1, 20, 3),
                               dated("u2", "gpt", 1, 1, 1), dated(None, "gpt", 2, 4, 0),
                               dated("u1", "gpt", 0, 99, 99, tenant="t2")])
    await ledger.record_learning([spent("u1", "mini", 0, "score", 30),
                                  spent("u1", "mini", 1, "extract", 50),
                                  spent("u2", "mini", 1, "embed", 7),
                                  spent("u1", "mini", 0, "score", 1000, tenant="t2")])


async def test_usage_report_groups_by_user_model_and_day(ledger: Ledger) -> None:
    """The report groups chat and, apart, learning tokens per purpose by user, model or UTC
    day; another tenant's rows never appear."""
    await _seed(ledger)
    by_user = await ledger.usage_report("t1", group_by="user")
    assert by_user == [
        UsageRow(key=None, requests=1, prompt=4),
        UsageRow(key="u1", requests=2, prompt=30, completion=5, memory=5,
                 learning={"score": 30, "extract": 50}),
        UsageRow(key="u2", requests=1, prompt=1, completion=1, learning={"embed": 7}),
    ]
    by_model = {r.key: r for r in await ledger.usage_report("t1", group_by="model")}
    assert set(by_model) == {"gpt", "qwen", "mini"}
    assert by_model["gpt"].requests == 3
    assert by_model["qwen"].prompt == 20
    assert by_model["mini"] == UsageRow(key="mini", learning={"score": 30, "extract": 50,
                                                              "embed": 7})
    by_day = await ledger.usage_report("t1", group_by="day")
    assert [r.key for r in by_day] == ["2025-01-01", "2025-01-02", "2025-01-03"]
    assert by_day[1] == UsageRow(key="2025-01-02", requests=2, prompt=21, completion=4,
                                 learning={"extract": 50, "embed": 7})


async def test_usage_report_filters_by_user_and_days(ledger: Ledger) -> None:
    """``user`` keeps one user's rows; ``since``/``until`` are inclusive UTC days."""
    await _seed(ledger)
    rows = await ledger.usage_report("t1", group_by="day", user="u1",
                                     since=date(2025, 1, 2), until=date(2025, 1, 2))
    assert rows == [UsageRow(key="2025-01-02", requests=1, prompt=20, completion=3,
                             learning={"extract": 50})]
    assert await ledger.usage_report("t1", group_by="user", since=date(2025, 2, 1)) == []
    assert await ledger.usage_report("t1", group_by="user", user="nobody") == []


async def test_daily_counts_tokens_and_active_users(ledger: Ledger) -> None:
    """Daily figures: chat tokens, learning tokens and distinct users, zero-filled days."""
    await _seed(ledger)
    days = await ledger.daily("t1", since=date(2024, 12, 31), until=date(2025, 1, 3))
    assert days == [
        DailyUsage(day=date(2024, 12, 31)),
        DailyUsage(day=date(2025, 1, 1), user_tokens=12, learning_tokens=30, active_users=1),
        DailyUsage(day=date(2025, 1, 2), user_tokens=25, learning_tokens=57, active_users=2),
        DailyUsage(day=date(2025, 1, 3), user_tokens=4, learning_tokens=0, active_users=0),
    ]


async def test_reports_and_days_carry_recall_tokens_beside_the_rest(ledger: Ledger) -> None:
    """Recall tokens show per user, model and day in the report and per day in the daily
    figures, in neither chat nor learning tokens; rows without any report 0, and another
    tenant's never count."""
    await _seed(ledger)
    await ledger.record_usage([replace(dated("u1", "gpt", 1, 2, 1), recall_tokens=9),
                               replace(dated("u2", "qwen", 1, 1, 1), recall_tokens=4),
                               replace(dated("u1", "gpt", 1, 1, 1, tenant="t2"),
                                       recall_tokens=500)])
    by_user = {r.key: r for r in await ledger.usage_report("t1", group_by="user")}
    assert {k: r.recall for k, r in by_user.items()} == {None: 0, "u1": 9, "u2": 4}
    assert by_user["u1"].prompt == 32  # 30 seeded + 2: recall is not prompt
    by_day = {r.key: r.recall for r in await ledger.usage_report("t1", group_by="day")}
    assert by_day == {"2025-01-01": 0, "2025-01-02": 13, "2025-01-03": 0}
    by_model = {r.key: r.recall for r in await ledger.usage_report("t1", group_by="model")}
    assert by_model == {"gpt": 9, "qwen": 4, "mini": 0}
    days = await ledger.daily("t1", since=date(2025, 1, 1), until=date(2025, 1, 3))
    assert [(d.recall_tokens, d.user_tokens, d.learning_tokens) for d in days] == [
        (0, 12, 30), (13, 30, 57), (0, 4, 0)]


async def test_users_index_pages_in_id_order_with_last_seen(ledger: Ledger) -> None:
    """The tenant → users index lists users by id after a cursor, with their latest usage
    time; users of another tenant and records without a user are not in it."""
    await _seed(ledger)
    await ledger.record_usage([dated("a0", "gpt", 5, 1, 1)])
    first = await ledger.users("t1", limit=2)
    assert [u.user for u in first] == ["a0", "u1"]
    assert first[1].last_seen == T0 + timedelta(days=1, hours=1)
    assert [u.user for u in await ledger.users("t1", after="u1", limit=2)] == ["u2"]
    assert await ledger.users("t1", after="u2") == []
    assert await ledger.user_count("t1") == 3
    assert [u.user for u in await ledger.users("t2")] == ["u1"]


async def test_registered_users_join_the_index_without_usage(ledger: Ledger) -> None:
    """A user registered by a memory write (no usage row) is listed in their tenant only,
    with that time; a later write moves last_seen forward, an earlier one never back, and
    a chat row after it counts the same way; no usage is added."""
    await ledger.register_user("t1", "writer", T0 + timedelta(days=3))
    assert [(u.user, u.last_seen) for u in await ledger.users("t1")] == [
        ("writer", T0 + timedelta(days=3))]
    assert await ledger.users("t2") == []
    await ledger.register_user("t1", "writer", T0 + timedelta(days=1))
    assert (await ledger.users("t1"))[0].last_seen == T0 + timedelta(days=3)
    await ledger.register_user("t1", "writer", T0 + timedelta(days=4))
    assert (await ledger.users("t1"))[0].last_seen == T0 + timedelta(days=4)
    await ledger.record_usage([dated("writer", "gpt", 2, 1, 1)])
    assert (await ledger.users("t1"))[0].last_seen == T0 + timedelta(days=4)
    await ledger.record_usage([dated("writer", "gpt", 6, 1, 1)])
    assert (await ledger.users("t1"))[0].last_seen == T0 + timedelta(days=6, hours=1)
    assert await ledger.user_count("t1") == 1
    assert (await ledger.usage_totals("t1", "writer")).requests == 2
    await ledger.erase_user("t1", "writer")
    assert await ledger.users("t1") == []


async def test_erase_user_keeps_their_tokens_without_their_name(ledger: Ledger) -> None:
    """Erasing a user takes their id out of every report and the index: their tokens stay
    in the tenant's figures as usage without a user; other users and tenants keep theirs."""
    await _seed(ledger)
    await ledger.erase_user("t1", "u1")
    assert await ledger.usage_report("t1", group_by="user") == [
        UsageRow(key=None, requests=3, prompt=34, completion=5, memory=5,
                 learning={"score": 30, "extract": 50}),
        UsageRow(key="u2", requests=1, prompt=1, completion=1, learning={"embed": 7}),
    ]
    assert await ledger.usage_report("t1", group_by="user", user="u1") == []
    assert [u.user for u in await ledger.users("t1")] == ["u2"]
    assert await ledger.user_count("t1") == 1
    assert await ledger.usage_totals("t1", "u1") == Totals(0, 0, 0, 0)
    assert await ledger.usage_totals("t1") == Totals(4, 35, 6, 5)
    assert await ledger.learning_totals("t1", "u1") == Totals(0, 0, 0)
    assert (await ledger.daily("t1", since=date(2025, 1, 2), until=date(2025, 1, 2)))[0] \
        == DailyUsage(day=date(2025, 1, 2), user_tokens=25, learning_tokens=57,
                      active_users=1)
    assert [u.user for u in await ledger.users("t2")] == ["u1"]
    assert (await ledger.usage_totals("t2", "u1")).requests == 1


async def test_erase_user_removes_only_that_users_rows(ledger: Ledger) -> None:
    """erase_user deletes a user's usage and learning rows; other users' stay, and the
    tenant totals never name the erased user."""
    await ledger.record_usage([usage("u1", 10, 2), usage("u2", 1, 1)])
    await ledger.record_learning([learned("u1", 5, 5), learned("u2", 1, 1)])
    await ledger.erase_user("t1", "u1")
    assert await ledger.usage_totals("t1", "u1") == Totals(0, 0, 0, 0)
    assert await ledger.learning_totals("t1", "u1") == Totals(0, 0, 0, 0)
    assert await ledger.usage_totals("t1", "u2") == Totals(1, 1, 1, 0)
    assert await ledger.learning_totals("t1", "u2") == Totals(1, 1, 1, 0)
class _AwayLedger:
    """A ledger whose writes fail while ``away`` (the store is unreachable)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.away = True

    async def record_usage(self, records: Sequence[UsageRecord]) -> None:
        if self.away:
            raise StoreUnavailableError("ledger away")
        await self.ledger.record_usage(records)


async def test_usage_rows_survive_a_failed_write(ledger: Ledger) -> None:
    """A failed flush keeps every row (the buffer is not cleared before the write
    succeeded); the next flush after the store returns writes each row once."""
    away = _AwayLedger(ledger)
    writer = UsageWriter(away)  # type: ignore[arg-type]
    writer.add(usage("u1", 10, 1))
    with pytest.raises(StoreUnavailableError):
        await writer.flush()
    writer.add(usage("u1", 20, 2))
    with pytest.raises(StoreUnavailableError):
        await writer.flush()
    assert writer.pending == 2
    away.away = False
    await writer.flush()
    await writer.flush()
    assert writer.pending == 0
    assert await ledger.usage_totals("t1", "u1") == Totals(2, 30, 3, 0)


async def test_usage_rows_past_the_cap_are_dropped_and_counted(ledger: Ledger) -> None:
    """With the store away, rows beyond ``max_pending`` are dropped and counted (the oldest
    are kept); nothing is dropped silently."""
    away = _AwayLedger(ledger)
    counted: list[int] = []
    writer = UsageWriter(away, max_pending=3, on_drop=counted.append)  # type: ignore[arg-type]
    for prompt in range(1, 6):
        writer.add(usage("u1", prompt, 0))
    with pytest.raises(StoreUnavailableError):
        await writer.flush()
    assert (writer.pending, writer.dropped, sum(counted)) == (3, 2, 2)
    away.away = False
    await writer.flush()
    assert await ledger.usage_totals("t1", "u1") == Totals(3, 6, 0, 0)

