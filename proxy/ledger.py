"""Token ledgers: the user's usage and, apart from it, what learning spent (SPEC §2.8, §3.7).

The usage ledger has one row per chat request: upstream prompt/completion tokens (as the
upstream reported them — the prompt includes the injected memory block, which is what the
provider bills) and, separately, the memory tokens and memories injected. The learning
ledger has one row per learning call (purpose ``score`` / ``extract`` / ``embed``); it is
never added to a user's usage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

Purpose = Literal["score", "extract", "embed", "vision"]


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

    def to_api(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "memory_tokens": self.memory_tokens,
        }


class Ledger(Protocol):
    async def record_usage(self, records: Sequence[UsageRecord]) -> None: ...

    async def record_learning(self, records: Sequence[LearningUsage]) -> None: ...

    async def usage_totals(self, tenant: str, user: str | None = None) -> Totals: ...

    async def learning_totals(self, tenant: str, user: str | None = None) -> Totals: ...

    async def erase_user(self, tenant: str, user: str) -> None:
        """Delete the user's usage and learning rows (or counters); tenant totals keep
        the user's share without naming them (issue 12, ``DELETE /v1/me``)."""
        ...


class UsageWriter:
    """Buffers usage rows in memory and writes them in batches (one transaction per flush),
    so the hot path never waits on the ledger. Rows still buffered when the process dies
    are lost; the Prometheus token counters have them too."""

    def __init__(self, ledger: Ledger, *, max_pending: int = 10_000) -> None:
        self._ledger = ledger
        self._pending: list[UsageRecord] = []
        self._max = max_pending

    def add(self, record: UsageRecord) -> None:
        if len(self._pending) < self._max:
            self._pending.append(record)

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            await self._ledger.record_usage(pending)
