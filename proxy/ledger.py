"""Token ledgers: the user's usage and, apart from it, what learning spent
(docs/design.md#accounting).

The usage ledger has one row per chat request: upstream prompt/completion tokens (as the
upstream reported them — the prompt includes the injected memory block, which is what the
provider bills) and, separately, the memory tokens and memories injected and the
``recall_tokens`` a remote embedder billed for the request's query embeddings (memory
cost: never in the user's prompt/completion totals, never in the learning ledger). The learning
ledger has one row per learning call (purpose ``score`` / ``extract`` / ``embed``); it is
never added to a user's usage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal, Protocol, get_args

Purpose = Literal["score", "extract", "embed", "vision", "verdict"]
PURPOSES: tuple[str, ...] = get_args(Purpose)


@dataclass(frozen=True, slots=True)
class UsageRecord:
    at: datetime
    tenant: str
    user_id: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    memory_tokens: int
    memories_injected: int
    estimated: bool = False
    recall_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LearningUsage:
    at: datetime
    tenant: str
    user_id: str | None
    model: str
    purpose: Purpose
    prompt_tokens: int
    completion_tokens: int
    job_id: str | None = None


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int
    prompt_tokens: int
    completion_tokens: int
    memory_tokens: int = 0
    recall_tokens: int = 0

    def to_api(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "memory_tokens": self.memory_tokens,
            "recall_tokens": self.recall_tokens,
        }


GroupBy = Literal["user", "model", "day"]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One group of ``GET /v1/admin/usage``: chat requests and their tokens (``prompt`` /
    ``completion`` as the upstream billed them, ``memory`` injected by the gateway) and,
    always apart, the learning tokens (prompt + completion) per ledger purpose.

    ``key``: the user id (``None`` for requests without a user), the model name, or the
    UTC date ``YYYY-MM-DD``, after the report's ``group_by``."""

    key: str | None
    requests: int = 0
    prompt: int = 0
    completion: int = 0
    memory: int = 0
    learning: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DailyUsage:
    """One UTC day of a tenant: chat tokens (prompt + completion), learning tokens (every
    purpose) and how many distinct users chatted."""

    day: date
    user_tokens: int = 0
    learning_tokens: int = 0
    active_users: int = 0


@dataclass(frozen=True, slots=True)
class KnownUser:
    """A user of the tenant index: the user id and the time of their latest usage row or
    memory write (:meth:`Ledger.register_user`)."""

    user: str
    last_seen: datetime


class Ledger(Protocol):
    async def record_usage(self, records: Sequence[UsageRecord]) -> None: ...

    async def record_learning(self, records: Sequence[LearningUsage]) -> None: ...

    async def usage_totals(self, tenant: str, user: str | None = None) -> Totals: ...

    async def learning_totals(self, tenant: str, user: str | None = None) -> Totals: ...

    # per-day / per-model reports and the tenant → users index (admin reports) -----------
    async def usage_report(
        self, tenant: str, *, group_by: GroupBy, user: str | None = None,
        since: date | None = None, until: date | None = None,
    ) -> list[UsageRow]:
        """Usage and learning tokens of ``tenant`` grouped by user, model or UTC day,
        optionally of one ``user`` and between the UTC days ``since`` and ``until``
        (inclusive). Sorted by key (``None`` first); a group with neither usage nor
        learning is absent."""
        ...

    async def daily(self, tenant: str, *, since: date, until: date) -> list[DailyUsage]:
        """One :class:`DailyUsage` per UTC day from ``since`` to ``until`` (inclusive),
        oldest first, days without usage included with zeros."""
        ...

    async def users(self, tenant: str, *, after: str | None = None,
                    limit: int = 100) -> list[KnownUser]:
        """The tenant's users — those with usage rows and those :meth:`register_user`
        added — in user-id order, strictly after the cursor ``after``, at most ``limit``."""
        ...

    async def register_user(self, tenant: str, user: str, at: datetime) -> None:
        """Put ``user`` in the tenant → users index as a usage row of time ``at`` does,
        without a row: for users who write memories without chatting (``POST
        /v1/memories``, MCP ``add_memory``, ``POST /v1/memories/import``). Their
        ``last_seen`` becomes ``at`` unless it is already later. Raises
        :class:`~proxy.memory.store.StoreUnavailableError` when the storage fails."""
        ...

    async def user_count(self, tenant: str) -> int:
        """How many users the tenant index holds."""
        ...

    async def erase_user(self, tenant: str, user: str) -> None:
        """Take ``user`` out of the ledgers (``DELETE /v1/me``): their rows and counters
        (lifetime, per day, per model) lose the user id — the tenant's figures keep their
        tokens as usage without a user (key ``null`` in reports) — and their entry of the
        tenant → users index goes. Other users and tenants are untouched."""
        ...


class UsageWriter:
    """Buffers usage rows in memory and writes them in batches (one write per flush), so
    the hot path never waits on the ledger. A failed write keeps its rows, oldest first,
    for the next flush (the app flushes every second): nothing is cleared before the write
    succeeded. Past ``max_pending`` rows (the ledger has been away a long time) the newest
    rows are dropped and counted (``dropped``; with ``on_drop``, e.g. the
    ``memory_proxy_learning_events_total{event="spool_dropped", label="usage"}`` counter).
    Rows still buffered when the process dies are lost; the Prometheus token counters
    have them too."""

    def __init__(self, ledger: Ledger, *, max_pending: int = 10_000,
                 on_drop: Callable[[int], None] | None = None) -> None:
        self._ledger = ledger
        self._pending: list[UsageRecord] = []
        self._max = max_pending
        self._on_drop = on_drop
        self.dropped = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, record: UsageRecord) -> None:
        if len(self._pending) < self._max:
            self._pending.append(record)
            return
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop(1)

    async def flush(self) -> None:
        """Write the buffered rows. Raises what the ledger raised (the rows stay)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            await self._ledger.record_usage(pending)
        except BaseException:
            # Back in front of rows added meanwhile, within the cap (newest dropped).
            merged = pending + self._pending
            self._pending = merged[:self._max]
            lost = len(merged) - len(self._pending)
            if lost:
                self.dropped += lost
                if self._on_drop is not None:
                    self._on_drop(lost)
            raise
