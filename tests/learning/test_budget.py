"""Learning budgets: spent by day or by month from the learning ledger, resuming at the
next UTC period; the worker's cached state is read again after forget()."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.ledger import SqliteLedger
from proxy.learning.budget import BudgetSpent, LearningBudgets
from proxy.ledger import LearningUsage, Ledger
from proxy.settings import LearningBudget

NOW = datetime(2026, 12, 31, 15, 0, tzinfo=UTC)


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    async with SqliteDatabase(tmp_path / "ledger.db") as db:
        yield SqliteLedger(db)


def spent(tokens: int, *, days_ago: int = 0, tenant: str = "acme") -> LearningUsage:
    return LearningUsage(at=NOW - timedelta(days=days_ago), tenant=tenant, user_id="u1",
                         model="m", purpose="extract", prompt_tokens=tokens,
                         completion_tokens=0)


async def test_day_and_month_caps(ledger: Ledger) -> None:
    """A day cap counts today's tokens and resumes tomorrow; a month cap counts the UTC
    calendar month and resumes on the 1st; other tenants and last month do not count."""
    await ledger.record_learning([spent(60), spent(50, days_ago=3), spent(999, days_ago=31),
                                  spent(999, tenant="globex")])
    budgets = LearningBudgets(ledger, clock=lambda: NOW)
    free = await budgets.state("acme", LearningBudget())
    assert (free.spent, free.spent_today, free.spent_this_month) == (False, 60, 110)
    day = await budgets.state("acme", LearningBudget(tokens_per_day=60))
    assert (day.spent, day.period, day.resumes_at) == (
        True, "day", datetime(2027, 1, 1, tzinfo=UTC))
    assert not (await budgets.state("acme", LearningBudget(tokens_per_day=61))).spent
    month = await budgets.state("acme", LearningBudget(tokens_per_day=1000,
                                                       tokens_per_month=110))
    assert (month.spent, month.period) == (True, "month")
    assert month.to_api()["state"] == "paused"
    with pytest.raises(BudgetSpent) as caught:
        await budgets.check("acme", LearningBudget(tokens_per_month=100))
    assert caught.value.resumes_at == datetime(2027, 1, 1, tzinfo=UTC)
    await budgets.check("acme", LearningBudget())  # no cap: never spent


async def test_cached_state_is_read_again_after_forget_or_a_new_day(ledger: Ledger) -> None:
    """With a cache the state is reused within cache_seconds, but not after forget(),
    another budget or the next UTC day."""
    clock = [NOW]
    budgets = LearningBudgets(ledger, clock=lambda: clock[0], cache_seconds=60,
                              monotonic=lambda: 0.0)
    cap = LearningBudget(tokens_per_day=10)
    assert not (await budgets.state("acme", cap)).spent
    await ledger.record_learning([spent(10)])
    assert not (await budgets.state("acme", cap)).spent  # cached
    budgets.forget("acme")
    assert (await budgets.state("acme", cap)).spent
    clock[0] = NOW + timedelta(days=1)
    assert not (await budgets.state("acme", cap)).spent
