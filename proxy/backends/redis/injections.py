"""Injection records on Redis (docs/design.md#injection-records): each record a STRING
``P:inj:{ns}:<id>`` (the compact form of :func:`~proxy.memory.explain.stored`, with its
time; one written before that form holds the API's JSON and reads back alike) expiring
after the retention window, and the user's ZSET ``P:injs:{ns}`` of record ids by time,
which enforces the per-user cap and lets erasure find every record. Errors are the
caller's to translate."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from redis.asyncio import Redis

from proxy.backends.redis.keys import KeyLayout, user_token
from proxy.backends.redis.memories import as_text
from proxy.memory.explain import InjectionRecord, RecordRow, from_stored, timed_body


class InjectionRecords:
    def __init__(self, client: Redis, layout: KeyLayout) -> None:
        self._redis = client
        self._keys = layout

    async def write(self, records: Sequence[RecordRow], *, now: datetime,
                    retention: timedelta, per_user: int) -> None:
        """Store ``records``; per written user, drop ids older than ``now - retention``
        and all but the newest ``per_user`` (their records with them). Two round trips
        for the whole batch, whatever the number of users: one pipeline writes every
        user's records and reads each user's ids beyond the cap, a second drops those.
        Each user's commands run in order; another writer's interleaved between them can
        only add ids, so what is dropped was beyond the cap either way."""
        seconds = max(1, math.ceil(retention.total_seconds()))
        cutoff = (now - retention).timestamp()
        by_ns: dict[str, list[RecordRow]] = defaultdict(list)
        for record in records:
            by_ns[user_token(record[1], record[2])].append(record)
        if not by_ns:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for ns, mine in by_ns.items():
                index = self._keys.injections(ns)
                for r in mine:
                    pipe.set(self._keys.injection(ns, r[0]), timed_body(r), ex=seconds)
                pipe.zadd(index, {r[0]: r[4] for r in mine})
                pipe.zremrangebyscore(index, "-inf", f"({cutoff}")
                pipe.zrange(index, 0, -(per_user + 1))
                pipe.expire(index, seconds)
            replies = await pipe.execute()
        extras: list[tuple[str, list[str]]] = []
        at = 0
        for ns, mine in by_ns.items():
            at += len(mine) + 4  # its SETs, ZADD, ZREMRANGEBYSCORE, ZRANGE, EXPIRE
            extra = [as_text(i) for i in replies[at - 2]]
            if extra:
                extras.append((ns, extra))
        if extras:
            async with self._redis.pipeline(transaction=False) as pipe:
                for ns, extra in extras:
                    pipe.zrem(self._keys.injections(ns), *extra)
                    pipe.unlink(*(self._keys.injection(ns, i) for i in extra))
                await pipe.execute()

    async def get(self, tenant: str, user: str, injection_id: str, *,
                  since: datetime) -> InjectionRecord | None:
        raw = await self._redis.get(self._keys.injection(user_token(tenant, user),
                                                         injection_id))
        if raw is None:
            return None
        record = from_stored(tenant, user, injection_id, raw)
        return record if record.created_at >= since else None
