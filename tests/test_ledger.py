"""Token ledgers, on both backends: usage per user and tenant, learning apart (SPEC §2.8,
§3.7)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.ledger import SqliteLedger
from proxy.ledger import LearningUsage, Ledger, Totals, UsageRecord
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
