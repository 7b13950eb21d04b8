"""The usage and learning ledgers in the embedded SQLite file (:class:`proxy.ledger.Ledger`).

Every ``sqlite3`` failure (a locked or full file, a read-only folder) is raised as
:class:`~proxy.memory.store.StoreUnavailableError`, as the memory store and the queue do:
503 ``store_unavailable`` on the API, rows kept for the next flush by the usage writer."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from typing import Any, TypeVar

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.ledger import (
    DailyUsage,
    GroupBy,
    KnownUser,
    LearningUsage,
    Totals,
    UsageRecord,
    UsageRow,
)
from proxy.memory.records import from_iso, to_iso
from proxy.memory.store import StoreUnavailableError

T = TypeVar("T")

# SQL of each report key over a ledger row (``at`` is ISO 8601 UTC: its first 10
# characters are the UTC day).
_GROUP_KEY = {"user": "user_id", "model": "model", "day": "substr(at, 1, 10)"}


class SqliteLedger:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.read(fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite ledger read failed: {exc}") from exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.write(fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite ledger write failed: {exc}") from exc

    async def record_usage(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        rows = [
            (to_iso(r.at), r.tenant, r.user_id, r.model, r.prompt_tokens, r.completion_tokens,
             r.memory_tokens, r.memories_injected, int(r.estimated), r.recall_tokens)
            for r in records
        ]
        seen: dict[tuple[str, str], str] = {}
        for r in records:
            if r.user_id is not None:
                stamp = to_iso(r.at) or ""
                key = (r.tenant, r.user_id)
                seen[key] = max(seen.get(key, ""), stamp)

        def run(c: sqlite3.Connection) -> None:
            c.executemany(
                "INSERT INTO usage_ledger (at, tenant, user_id, model, prompt_tokens, "
                "completion_tokens, memory_tokens, memories_injected, estimated, "
                "recall_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows,
            )
            c.executemany(
                "INSERT INTO tenant_users (tenant, user_id, last_seen) VALUES (?, ?, ?) "
                "ON CONFLICT(tenant, user_id) DO UPDATE SET "
                "last_seen = max(last_seen, excluded.last_seen)",
                [(t, u, at) for (t, u), at in seen.items()],
            )

        await self._write(run)

    async def record_learning(self, records: Sequence[LearningUsage]) -> None:
        if not records:
            return
        rows = [
            (to_iso(r.at), r.tenant, r.user_id, r.model, r.purpose, r.prompt_tokens,
             r.completion_tokens, r.job_id)
            for r in records
        ]
        await self._write(lambda c: c.executemany(
            "INSERT INTO learning_ledger (at, tenant, user_id, model, purpose, prompt_tokens, "
            "completion_tokens, job_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows,
        ))

    async def _totals(self, table: str, memory: bool, tenant: str, user: str | None) -> Totals:
        where, args = "tenant = ?", [tenant]
        if user is not None:
            where += " AND user_id = ?"
            args.append(user)
        memory_sum = "coalesce(sum(memory_tokens), 0), coalesce(sum(recall_tokens), 0)" \
            if memory else "0, 0"

        def run(conn: sqlite3.Connection) -> Any:
            return conn.execute(
                f"SELECT count(*), coalesce(sum(prompt_tokens), 0), "
                f"coalesce(sum(completion_tokens), 0), {memory_sum} FROM {table} WHERE {where}",
                args,
            ).fetchone()

        row = await self._read(run)
        return Totals(int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]))

    async def usage_totals(self, tenant: str, user: str | None = None) -> Totals:
        return await self._totals("usage_ledger", True, tenant, user)

    async def learning_totals(self, tenant: str, user: str | None = None) -> Totals:
        return await self._totals("learning_ledger", False, tenant, user)

    # per-day / per-model reports and the tenant → users index ----------------------------
    async def usage_report(
        self, tenant: str, *, group_by: GroupBy, user: str | None = None,
        since: date | None = None, until: date | None = None,
    ) -> list[UsageRow]:
        where, args = _window(tenant, user, since, until)
        key = _GROUP_KEY[group_by]

        def run(conn: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
            chat = conn.execute(
                f"SELECT {key}, count(*), coalesce(sum(prompt_tokens), 0), "
                f"coalesce(sum(completion_tokens), 0), coalesce(sum(memory_tokens), 0), "
                f"coalesce(sum(recall_tokens), 0) "
                f"FROM usage_ledger WHERE {where} GROUP BY 1", args).fetchall()
            learned = conn.execute(
                f"SELECT {key}, purpose, sum(prompt_tokens + completion_tokens) "
                f"FROM learning_ledger WHERE {where} GROUP BY 1, 2", args).fetchall()
            return chat, learned

        chat, learned = await self._read(run)
        rows: dict[str | None, dict[str, Any]] = {}
        for k, requests, prompt, completion, memory, recall in chat:
            rows[k] = {"requests": int(requests), "prompt": int(prompt),
                       "completion": int(completion), "memory": int(memory),
                       "recall": int(recall), "learning": {}}
        for k, purpose, tokens in learned:
            row = rows.setdefault(k, {"learning": {}})
            row["learning"][purpose] = int(tokens)
        return [UsageRow(key=k, **rows[k])
                for k in sorted(rows, key=lambda k: (k is not None, k or ""))]

    async def daily(self, tenant: str, *, since: date, until: date) -> list[DailyUsage]:
        where, args = _window(tenant, None, since, until)

        def run(conn: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
            chat = conn.execute(
                "SELECT substr(at, 1, 10), sum(prompt_tokens + completion_tokens), "
                "count(DISTINCT user_id), sum(recall_tokens) "
                f"FROM usage_ledger WHERE {where} GROUP BY 1",
                args).fetchall()
            learned = conn.execute(
                "SELECT substr(at, 1, 10), sum(prompt_tokens + completion_tokens) "
                f"FROM learning_ledger WHERE {where} GROUP BY 1", args).fetchall()
            return chat, learned

        chat, learned = await self._read(run)
        by_chat = {d: (int(t), int(n), int(r)) for d, t, n, r in chat}
        by_learning = {d: int(t) for d, t in learned}
        out = []
        day = since
        while day <= until:
            iso = day.isoformat()
            tokens, active, recall = by_chat.get(iso, (0, 0, 0))
            out.append(DailyUsage(day=day, user_tokens=tokens,
                                  learning_tokens=by_learning.get(iso, 0),
                                  active_users=active, recall_tokens=recall))
            day += timedelta(days=1)
        return out

    async def users(self, tenant: str, *, after: str | None = None,
                    limit: int = 100) -> list[KnownUser]:
        rows = await self._read(lambda c: c.execute(
            "SELECT user_id, last_seen FROM tenant_users WHERE tenant = ? AND user_id > ? "
            "ORDER BY user_id LIMIT ?", (tenant, after or "", max(0, limit))).fetchall())
        out = []
        for user, seen in rows:
            at = from_iso(seen)
            assert at is not None
            out.append(KnownUser(user=user, last_seen=at))
        return out

    async def register_user(self, tenant: str, user: str, at: datetime) -> None:
        stamp = to_iso(at)
        await self._write(lambda c: c.execute(
            "INSERT INTO tenant_users (tenant, user_id, last_seen) VALUES (?, ?, ?) "
            "ON CONFLICT(tenant, user_id) DO UPDATE SET "
            "last_seen = max(last_seen, excluded.last_seen)", (tenant, user, stamp)))

    async def user_count(self, tenant: str) -> int:
        row = await self._read(lambda c: c.execute(
            "SELECT count(*) FROM tenant_users WHERE tenant = ?", (tenant,)).fetchone())
        return int(row[0])

    async def erase_user(self, tenant: str, user: str) -> None:
        def run(c: sqlite3.Connection) -> None:
            for table in ("usage_ledger", "learning_ledger"):
                c.execute(f"UPDATE {table} SET user_id = NULL "
                          "WHERE tenant = ? AND user_id = ?", (tenant, user))
            c.execute("DELETE FROM tenant_users WHERE tenant = ? AND user_id = ?",
                      (tenant, user))

        await self._write(run)


def _window(tenant: str, user: str | None, since: date | None,
            until: date | None) -> tuple[str, list[Any]]:
    """The WHERE clause (and its arguments) of a tenant's rows, optionally one user's,
    between two UTC days inclusive (ISO strings compare in time order)."""
    where, args = "tenant = ?", [tenant]
    if user is not None:
        where += " AND user_id = ?"
        args.append(user)
    if since is not None:
        where += " AND at >= ?"
        args.append(since.isoformat())
    if until is not None:  # any time of that day (no date arithmetic: 9999-12-31 is valid)
        where += " AND at <= ?"
        args.append(until.isoformat() + "\uffff")
    return where, args
