"""The learning settings in force for a tenant, its learning model and its budget.

A tenant's run-time settings (admin overrides) count over the configuration's when the
worker has the tenants' settings; a tenant's learning budget is enforced when it has a
ledger to read spent tokens from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from proxy.learning.budget import WORKER_CACHE_SECONDS, LearningBudgets
from proxy.learning.model import LearningModel
from proxy.ledger import Ledger
from proxy.memory.store import MemoryStore
from proxy.metrics import Metrics
from proxy.settings import LearningSettings
from proxy.tenants import REFRESH_SECONDS, TenantSettings


class TenantLearning:
    """Per-tenant learning settings, model, prompts and budget, for the worker."""

    def __init__(self, *, settings: LearningSettings, store: MemoryStore,
                 model: LearningModel, tenants: TenantSettings | None,
                 ledger: Ledger | None, clock: Callable[[], datetime],
                 metrics: Metrics | None) -> None:
        self.settings = settings
        self._store = store
        self._model = model
        self.tenants = tenants
        self._metrics = metrics
        self.budgets = None if ledger is None else \
            LearningBudgets(ledger, clock=clock, cache_seconds=WORKER_CACHE_SECONDS)

    async def config(self, tenant: str) -> LearningSettings:
        """The tenant's learning settings (config + run-time overrides)."""
        if self.tenants is None:
            return self.settings
        return (await self.tenants.get(tenant)).learning

    @property
    def refresh_seconds(self) -> float:
        """The tenant-settings refresh interval (s): the tenants' cache's, else
        :data:`~proxy.tenants.REFRESH_SECONDS`."""
        return REFRESH_SECONDS if self.tenants is None else self.tenants.refresh_seconds

    def monotonic(self) -> float:
        """The clock of that refresh (monotonic seconds): the tenants' cache's, else
        :func:`time.monotonic`."""
        return time.monotonic() if self.tenants is None else self.tenants.now()

    def model(self, config: LearningSettings) -> LearningModel:
        """The learning model of ``config`` (the configured one unless overridden)."""
        return self._model if config.model == self.settings.model else \
            self._model.with_model(config.model)

    async def check_budget(self, tenant: str, config: LearningSettings) -> None:
        """Raises :class:`~proxy.learning.budget.BudgetSpent` when the tenant's budget is
        spent (nothing without a ledger)."""
        if self.budgets is not None:
            await self.budgets.check(tenant, config.budget)

    def forget(self, tenant: str) -> None:
        """The tenant spent tokens: its budget is read again next time."""
        if self.budgets is not None:
            self.budgets.forget(tenant)

    async def budget_spent(self, tenant: str,
                           config: LearningSettings | None = None) -> bool:
        """Whether the tenant's learning budget is spent now (also sets its gauges)."""
        config = config or await self.config(tenant)
        budget = config.budget
        if self.budgets is None or (budget.tokens_per_day is None
                                    and budget.tokens_per_month is None):
            if self._metrics is not None:  # a cap removed while paused: not paused now
                self._metrics.learning_budget(tenant, paused=False)
            return False
        state = await self.budgets.state(tenant, budget)
        if self._metrics is not None:
            self._metrics.learning_budget(tenant, paused=state.spent,
                                          spent_today=state.spent_today,
                                          spent_this_month=state.spent_this_month)
        return state.spent

    async def prompt(self, tenant: str, kind: str) -> str | None:
        """The prompt in force: the tenant's latest admin edit, else ``learning.<kind>_prompt``
        from config, else ``None`` (the built-in one)."""
        versions = await self._store.prompt_versions(tenant, kind, limit=1)
        if versions and versions[0].text:
            return versions[0].text
        configured: str | None = getattr(self.settings, f"{kind}_prompt")
        return configured or None
