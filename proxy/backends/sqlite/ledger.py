"""The usage and learning ledgers in the embedded SQLite file (:class:`proxy.ledger.Ledger`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.ledger import LearningUsage, Totals, UsageRecord
from proxy.memory.records import to_iso


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

    async def erase_user(self, tenant: str, user: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            for table in ("usage_ledger", "learning_ledger"):
                conn.execute(f"DELETE FROM {table} WHERE tenant = ? AND user_id = ?",
                             (tenant, user))

        await self._db.write(run)
