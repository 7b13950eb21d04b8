"""Token ledgers: the user's usage and, apart from it, what learning spent (SPEC §2.8, §3.7).

The usage ledger has one row per chat request: upstream prompt/completion tokens (as the
upstream reported them — the prompt includes the injected memory block, which is what the
provider bills) and, separately, the memory tokens and memories injected. The learning
ledger has one row per learning call (purpose ``score`` / ``extract`` / ``embed``); it is
never added to a user's usage.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from proxy.memory.records import to_iso
from proxy.sqlite import SqliteDatabase

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


class SqliteLedger:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def record_usage(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        rows = [
            (to_iso(r.at), r.tenant, r.user_id, r.model, r.prompt_tokens, r.completion_tokens,
             r.memory_tokens, r.memories_injected, int(r.estimated))
            for r in records
        ]
        await self._db.write(lambda c: c.executemany(
            "INSERT INTO usage_ledger (at, tenant, user_id, model, prompt_tokens, "
            "completion_tokens, memory_tokens, memories_injected, estimated) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows,
        ))

    async def record_learning(self, records: Sequence[LearningUsage]) -> None:
        if not records:
            return
        rows = [
            (to_iso(r.at), r.tenant, r.user_id, r.model, r.purpose, r.prompt_tokens,
             r.completion_tokens, r.job_id)
            for r in records
        ]
        await self._db.write(lambda c: c.executemany(
            "INSERT INTO learning_ledger (at, tenant, user_id, model, purpose, prompt_tokens, "
            "completion_tokens, job_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows,
        ))

    async def _totals(self, table: str, memory: bool, tenant: str, user: str | None) -> Totals:
        where, args = "tenant = ?", [tenant]
        if user is not None:
            where += " AND user_id = ?"
            args.append(user)
        memory_sum = "coalesce(sum(memory_tokens), 0)" if memory else "0"

        def run(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                f"SELECT count(*), coalesce(sum(prompt_tokens), 0), "
                f"coalesce(sum(completion_tokens), 0), {memory_sum} FROM {table} WHERE {where}",
                args,
            ).fetchone()

        row = await self._db.read(run)
        return Totals(int(row[0]), int(row[1]), int(row[2]), int(row[3]))

    async def usage_totals(self, tenant: str, user: str | None = None) -> Totals:
        return await self._totals("usage_ledger", True, tenant, user)

    async def learning_totals(self, tenant: str, user: str | None = None) -> Totals:
        return await self._totals("learning_ledger", False, tenant, user)


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
