""":class:`~proxy.ledger.Ledger` on Redis: aggregate counters, no rows.

Each usage or learning record adds (``HINCRBY``) to two hashes: the user's
(``<prefix>:usage:{u…}`` / ``<prefix>:learning:{u…}``, in the user's hash slot — see
:mod:`proxy.backends.redis.keys`) and the tenant's (``…:{t…}``). Records without a user count
for the tenant only. Fields: ``requests``, ``prompt_tokens``, ``completion_tokens`` and,
for usage, ``memory_tokens``, ``memories_injected``, ``recall_tokens`` (query embeddings
of a remote embedder) and ``estimated`` (records whose tokens were estimated). Totals are
therefore O(1) to read, at the cost of the per-request history the SQLite ledger keeps.
One flush is one pipeline (not a transaction: the two
hashes live in different slots); a failure raises
:class:`~proxy.memory.store.StoreUnavailableError`.

Per-day and per-model figures (``GET /v1/admin/usage``, ``/v1/admin/stats``) live in one
hash per tenant and UTC day, ``<prefix>:day:{t…}:<YYYY-MM-DD>``, whose fields are JSON
arrays: ``["u", user, model, metric]`` (metric ``requests`` / ``prompt`` / ``completion``
/ ``memory``, and ``recall`` when a request's query embeddings were billed) for chat and
``["l", user, model, purpose]`` (prompt + completion tokens) for learning; ``user`` is
``null`` for records without one. ``<prefix>:days:{t…}`` lists the days that have such a
hash, and :data:`DAY_TTL_SECONDS` bounds how long one is kept.
The tenant → users index is ``<prefix>:users:{t…}`` (a sorted set of score 0, read in
id order with ``ZRANGEBYLEX``) beside ``<prefix>:seen:{t…}`` (user → latest usage or
memory-write time, only ever moved forward). It is filled by usage rows and
:meth:`RedisLedger.register_user` from the time they were written: users who only wrote
memories before that are not in it (SQLite's migration 11 adds them; Redis has no
migrations) until they chat or write again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

import orjson
from redis.asyncio import Redis

from proxy.backends.redis.client import require_resp2_bytes, unavailable_on_redis_error
from proxy.backends.redis.keys import KeyLayout, tenant_token, user_token
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

# Add a user to the tenant → users index and move their last-seen time forward, never
# back (ISO strings of to_iso sort by time): KEYS users, seen; ARGV user, time.
_SEEN_LUA = """
redis.call('ZADD', KEYS[1], 0, ARGV[1])
local current = redis.call('HGET', KEYS[2], ARGV[1])
if (not current) or current < ARGV[2] then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return 1
"""
# Per-day counters are kept 400 days (a year of daily figures plus a month of slack).
DAY_TTL_SECONDS = 400 * 86400
_EPOCH = date(1970, 1, 1)
_LIFETIME_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "memory_tokens",
                    "memories_injected", "estimated")


class RedisLedger:
    """Usage and learning ledgers as counters in Redis (module docstring)."""

    def __init__(self, client: Redis, *, key_prefix: str = "mp") -> None:
        require_resp2_bytes(client)
        self._redis = client
        self._keys = KeyLayout(key_prefix)
        self._seen = client.register_script(_SEEN_LUA)

    def _owners(self, tenant: str, user: str | None) -> list[str]:
        tokens = [tenant_token(tenant)]
        if user is not None:
            tokens.append(user_token(tenant, user))
        return tokens

    async def _add(self, sums: dict[str, Counter[str]],
                   days: dict[tuple[str, str], Counter[str]] | None = None,
                   seen: dict[tuple[str, str], str] | None = None) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, fields in sums.items():
                for name, amount in fields.items():
                    pipe.hincrby(key, name, amount)
            for (tenant, day), fields in (days or {}).items():
                tok = tenant_token(tenant)
                key = self._keys.day(tok, day)
                for name, amount in fields.items():
                    pipe.hincrby(key, name, amount)
                pipe.expire(key, DAY_TTL_SECONDS)
                pipe.zadd(self._keys.days(tok),
                          {day: (date.fromisoformat(day) - _EPOCH).days})
            for (tenant, user), at in (seen or {}).items():
                tok = tenant_token(tenant)
                await self._seen(keys=[self._keys.tenant_users(tok), self._keys.last_seen(tok)],
                                 args=[user, at], client=pipe)
            await pipe.execute()

    async def record_usage(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        sums: dict[str, Counter[str]] = {}
        days: dict[tuple[str, str], Counter[str]] = {}
        seen: dict[tuple[str, str], str] = {}
        for r in records:
            for token in self._owners(r.tenant, r.user_id):
                sums.setdefault(self._keys.usage(token), Counter()).update({
                    "requests": 1, "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                    "memory_tokens": r.memory_tokens,
                    "memories_injected": r.memories_injected, "estimated": int(r.estimated),
                    "recall_tokens": r.recall_tokens,
                })
            day = days.setdefault((r.tenant, _day(r.at)), Counter())
            for metric, amount in (("requests", 1), ("prompt", r.prompt_tokens),
                                   ("completion", r.completion_tokens),
                                   ("memory", r.memory_tokens)):
                day[_field("u", r.user_id, r.model, metric)] += amount
            if r.recall_tokens:  # a field only where a remote embedder billed recall
                day[_field("u", r.user_id, r.model, "recall")] += r.recall_tokens
            if r.user_id is not None:
                stamp = to_iso(r.at) or ""
                seen[(r.tenant, r.user_id)] = max(seen.get((r.tenant, r.user_id), ""), stamp)
        with unavailable_on_redis_error("usage ledger write"):
            await self._add(sums, days, seen)

    async def record_learning(self, records: Sequence[LearningUsage]) -> None:
        if not records:
            return
        sums: dict[str, Counter[str]] = {}
        days: dict[tuple[str, str], Counter[str]] = {}
        for r in records:
            for token in self._owners(r.tenant, r.user_id):
                sums.setdefault(self._keys.learning(token), Counter()).update({
                    "requests": 1, "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                })
            days.setdefault((r.tenant, _day(r.at)), Counter())[
                _field("l", r.user_id, r.model, r.purpose)] += \
                r.prompt_tokens + r.completion_tokens
        with unavailable_on_redis_error("learning ledger write"):
            await self._add(sums, days)

    async def _totals(self, key: str) -> Totals:
        with unavailable_on_redis_error("ledger read"):
            raw = await self._redis.hmget(key, ["requests", "prompt_tokens",
                                                "completion_tokens", "memory_tokens",
                                                "recall_tokens"])
        values = [int(v) if v is not None else 0 for v in raw]
        return Totals(values[0], values[1], values[2], values[3], values[4])

    async def usage_totals(self, tenant: str, user: str | None = None) -> Totals:
        token = tenant_token(tenant) if user is None else user_token(tenant, user)
        return await self._totals(self._keys.usage(token))

    async def learning_totals(self, tenant: str, user: str | None = None) -> Totals:
        token = tenant_token(tenant) if user is None else user_token(tenant, user)
        return await self._totals(self._keys.learning(token))

    # per-day / per-model reports and the tenant → users index ----------------------------
    async def _days(self, tenant: str, since: date | None, until: date | None
                    ) -> list[tuple[str, dict[bytes, bytes]]]:
        """``(day, counters)`` of the tenant's days in the window, oldest first."""
        tok = tenant_token(tenant)
        low = "-inf" if since is None else (since - _EPOCH).days
        high = "+inf" if until is None else (until - _EPOCH).days
        with unavailable_on_redis_error("ledger read"):
            days = [_text(d) for d in
                    await self._redis.zrangebyscore(self._keys.days(tok), low, high)]
            async with self._redis.pipeline(transaction=False) as pipe:
                for day in days:
                    pipe.hgetall(self._keys.day(tok, day))
                hashes: list[dict[bytes, bytes]] = await pipe.execute()
        return list(zip(days, hashes, strict=True))

    async def usage_report(
        self, tenant: str, *, group_by: GroupBy, user: str | None = None,
        since: date | None = None, until: date | None = None,
    ) -> list[UsageRow]:
        rows: dict[str | None, dict[str, Any]] = {}
        for day, counters in await self._days(tenant, since, until):
            for raw, amount in counters.items():
                kind, who, model, metric = orjson.loads(raw)
                if user is not None and who != user:
                    continue
                key = {"user": who, "model": model, "day": day}[group_by]
                row = rows.setdefault(key, {"requests": 0, "prompt": 0, "completion": 0,
                                            "memory": 0, "recall": 0, "learning": {}})
                if kind == "u":
                    row[metric] += int(amount)
                else:
                    row["learning"][metric] = row["learning"].get(metric, 0) + int(amount)
        return [UsageRow(key=k, **rows[k])
                for k in sorted(rows, key=lambda k: (k is not None, k or ""))]

    async def daily(self, tenant: str, *, since: date, until: date) -> list[DailyUsage]:
        found: dict[str, DailyUsage] = {}
        for day, counters in await self._days(tenant, since, until):
            chat = learning = recall = 0
            users: set[str] = set()
            for raw, amount in counters.items():
                kind, who, _model, metric = orjson.loads(raw)
                if kind == "l":
                    learning += int(amount)
                elif metric in ("prompt", "completion"):
                    chat += int(amount)
                elif metric == "recall":
                    recall += int(amount)
                elif metric == "requests" and who is not None:
                    users.add(who)
            found[day] = DailyUsage(day=date.fromisoformat(day), user_tokens=chat,
                                    learning_tokens=learning, active_users=len(users),
                                    recall_tokens=recall)
        out = []
        day_ = since
        while day_ <= until:
            out.append(found.get(day_.isoformat(), DailyUsage(day=day_)))
            day_ += timedelta(days=1)
        return out

    async def users(self, tenant: str, *, after: str | None = None,
                    limit: int = 100) -> list[KnownUser]:
        if limit <= 0:
            return []
        tok = tenant_token(tenant)
        low = b"(" + after.encode() if after else b"-"
        with unavailable_on_redis_error("ledger read"):
            names = await self._redis.zrangebylex(self._keys.tenant_users(tok), low, b"+",
                                                  start=0, num=limit)
            stamps = await self._redis.hmget(self._keys.last_seen(tok), names) \
                if names else []
        out = []
        for name, stamp in zip(names, stamps, strict=True):
            at = from_iso(_text(stamp)) if stamp else None
            if at is not None:
                out.append(KnownUser(user=_text(name), last_seen=at))
        return out

    async def register_user(self, tenant: str, user: str, at: datetime) -> None:
        tok = tenant_token(tenant)
        with unavailable_on_redis_error("ledger write"):
            await self._seen(keys=[self._keys.tenant_users(tok), self._keys.last_seen(tok)],
                             args=[user, to_iso(at) or ""])

    async def user_count(self, tenant: str) -> int:
        with unavailable_on_redis_error("ledger read"):
            return int(await self._redis.zcard(self._keys.tenant_users(tenant_token(tenant))))

    async def erase_user(self, tenant: str, user: str) -> None:
        """The user's lifetime hashes go (the tenant's keep their share); in each per-day
        hash the user's fields are added to the matching no-user fields and removed."""
        tok, mine = tenant_token(tenant), user_token(tenant, user)
        with unavailable_on_redis_error("ledger erase"):
            days = [_text(d) for d in
                    await self._redis.zrange(self._keys.days(tok), 0, -1)]
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(self._keys.usage(mine), self._keys.learning(mine))
                pipe.zrem(self._keys.tenant_users(tok), user)
                pipe.hdel(self._keys.last_seen(tok), user)
                for day in days:
                    pipe.hgetall(self._keys.day(tok, day))
                replies = await pipe.execute()
            counters: list[dict[bytes, bytes]] = replies[3:]
            async with self._redis.pipeline(transaction=False) as pipe:
                for day, fields in zip(days, counters, strict=True):
                    key = self._keys.day(tok, day)
                    for raw, amount in fields.items():
                        kind, who, model, metric = orjson.loads(raw)
                        if who == user:
                            pipe.hincrby(key, _field(kind, None, model, metric), int(amount))
                            pipe.hdel(key, raw)
                await pipe.execute()


def _day(at: Any) -> str:
    """The UTC day of a record time, ``YYYY-MM-DD``."""
    return (to_iso(at) or "")[:10]


def _field(kind: str, user: str | None, model: str, metric: str) -> str:
    """A per-day counter's field name (module docstring)."""
    return orjson.dumps([kind, user, model, metric]).decode()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
