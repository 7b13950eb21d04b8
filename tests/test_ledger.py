"""Token ledgers, on both backends: usage per user and tenant, learning apart (SPEC §2.8,
§3.7)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.ledger import SqliteLedger
from proxy.ledger import LearningUsage, Ledger, Totals, UsageRecord, UsageWriter
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
