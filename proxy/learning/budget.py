"""Learning budgets per tenant (``learning.budget``, docs/design.md#learning-budgets).

What learning spent is read from the learning ledger (every learning call books its
prompt + completion tokens there: ``score``, ``extract``, ``embed``, ``vision``): the
current UTC day against ``tokens_per_day``, the current UTC calendar month against
``tokens_per_month``. When either is reached the budget is *spent* until the period
ends: the worker then scores and extracts nothing (:class:`BudgetSpent`), and chat is
untouched. A batch already being learned finishes, so a budget can be overshot by at
most one batch's calls.
"""

from __future__ import annotations

import time as time_module
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from proxy.errors import MemoryProxyError
from proxy.ledger import Ledger
from proxy.settings import LearningBudget

# The worker reuses a tenant's budget state this long (seconds) between ledger reads.
WORKER_CACHE_SECONDS = 5.0
MAX_CACHED_TENANTS = 10_000


class BudgetSpent(MemoryProxyError):
    """A tenant's learning budget is spent; learning resumes at ``resumes_at``."""

    def __init__(self, tenant: str, resumes_at: datetime) -> None:
        super().__init__(f"learning budget of tenant {tenant!r} spent until "
                         f"{resumes_at.isoformat()}")
        self.tenant = tenant
        self.resumes_at = resumes_at


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A tenant's budget now: caps (``None`` = none), tokens spent this UTC day and month,
    and — when spent — which period and when learning resumes."""

    tokens_per_day: int | None
    tokens_per_month: int | None
    spent_today: int
    spent_this_month: int
    spent: bool
    period: str | None = None  # "day" | "month" when spent
    resumes_at: datetime | None = None

    def to_api(self) -> dict[str, Any]:
        return {
            "budget": {"tokens_per_day": self.tokens_per_day,
                       "tokens_per_month": self.tokens_per_month},
            "spent_today": self.spent_today,
            "spent_this_month": self.spent_this_month,
            "state": "paused" if self.spent else "active",
            "paused_by": self.period,
            "resumes_at": None if self.resumes_at is None else
            self.resumes_at.isoformat().replace("+00:00", "Z"),
        }


def _next_month(day: date) -> date:
    return date(day.year + (day.month == 12), day.month % 12 + 1, 1)


class LearningBudgets:
    """Reads budget states from the learning ledger (module docstring).

    With ``cache_seconds`` a tenant's state is reused that long (the worker checks every
    exchange it buffers: one ledger read of the month per tenant and interval instead of
    per message); :meth:`forget` drops it when this process has just spent tokens for the
    tenant. Other processes' spending is seen within ``cache_seconds``."""

    def __init__(self, ledger: Ledger, *, clock: Callable[[], datetime],
                 cache_seconds: float = 0.0,
                 monotonic: Callable[[], float] = time_module.monotonic) -> None:
        self._ledger = ledger
        self._clock = clock
        self._cache_seconds = cache_seconds
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, date, LearningBudget, BudgetState]] = {}

    def forget(self, tenant: str) -> None:
        """Read the tenant's spending again at the next check."""
        self._cache.pop(tenant, None)

    async def state(self, tenant: str, budget: LearningBudget) -> BudgetState:
        """The tenant's budget state now (one ledger read of the current month, unless a
        state of the same budget younger than ``cache_seconds`` is at hand)."""
        hit = self._cache.get(tenant)
        now = self._monotonic()
        today = self._clock().astimezone(UTC).date()
        if hit is not None and hit[1] == today and hit[2] == budget and \
                now - hit[0] < self._cache_seconds:
            return hit[3]
        state = await self._read(tenant, budget, today)
        if self._cache_seconds > 0:
            if len(self._cache) >= MAX_CACHED_TENANTS:
                self._cache.clear()
            self._cache[tenant] = (now, today, budget, state)
        return state

    async def _read(self, tenant: str, budget: LearningBudget, today: date) -> BudgetState:
        days = await self._ledger.daily(tenant, since=today.replace(day=1), until=today)
        month = sum(d.learning_tokens for d in days)
        day = days[-1].learning_tokens if days else 0
        period: str | None = None
        resumes: date | None = None
        if budget.tokens_per_month is not None and month >= budget.tokens_per_month:
            period, resumes = "month", _next_month(today)
        elif budget.tokens_per_day is not None and day >= budget.tokens_per_day:
            period, resumes = "day", today + timedelta(days=1)
        return BudgetState(
            tokens_per_day=budget.tokens_per_day, tokens_per_month=budget.tokens_per_month,
            spent_today=day, spent_this_month=month, spent=period is not None,
            period=period,
            resumes_at=None if resumes is None else datetime.combine(resumes, time(),
                                                                     tzinfo=UTC))

    async def check(self, tenant: str, budget: LearningBudget) -> None:
        """Raise :class:`BudgetSpent` when the tenant's budget is spent (no ledger read
        when the budget has no cap)."""
        if budget.tokens_per_day is None and budget.tokens_per_month is None:
            return
        state = await self.state(tenant, budget)
        if state.spent:
            assert state.resumes_at is not None
            raise BudgetSpent(tenant, state.resumes_at)
