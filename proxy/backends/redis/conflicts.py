"""Reads of conflicts and weekly profile snapshots on Redis (docs/design.md#conflicts,
docs/design.md#profile-over-time): the user's ``conflicts`` and ``phist`` hashes
(:mod:`proxy.backends.redis.keys`); the apply writes them
(:func:`proxy.backends.redis.apply.queue_conflicts`). Errors are the caller's to translate.
"""

from __future__ import annotations

import heapq

from redis.asyncio import Redis

from proxy.backends.redis.keys import KeyLayout, tenant_token, user_token
from proxy.backends.redis.memories import as_text
from proxy.memory.conflicts import Conflict, ProfileWeek, conflict_from_json, week_from_json

USERS_PER_ROUND = 200  # users whose conflict hashes one round trip reads (tenant listing)


class ConflictRecords:
    """The user's conflicts and snapshots under one key layout."""

    def __init__(self, client: Redis, layout: KeyLayout) -> None:
        self._redis = client
        self._keys = layout

    async def listed(self, tenant: str, user: str, statuses: frozenset[str],
                   limit: int) -> list[Conflict]:
        """Conflicts of those statuses, newest first, at most ``limit``."""
        raw = await self._redis.hvals(self._keys.conflicts(user_token(tenant, user)))
        found = [c for c in (conflict_from_json(tenant, user, r) for r in raw)
                 if c.status in statuses]
        found.sort(key=lambda c: (c.created_at, c.id), reverse=True)
        return found[:max(0, limit)]

    async def tenant_listed(self, tenant: str, statuses: frozenset[str],
                            limit: int) -> list[Conflict]:
        """Conflicts of those statuses of every user of the tenant's users index
        (``P:users:{t…}``: every user who chatted or wrote memories, the users learning
        can give conflicts to), newest first, at most ``limit``. Reads the users in id
        order, :data:`USERS_PER_ROUND` conflict hashes per round trip, keeping the newest
        ``limit`` seen so far."""
        if limit <= 0 or not statuses:
            return []
        key, low = self._keys.tenant_users(tenant_token(tenant)), b"-"
        kept: list[Conflict] = []
        while True:
            users = [as_text(u) for u in await self._redis.zrangebylex(
                key, low, b"+", start=0, num=USERS_PER_ROUND)]
            if not users:
                return kept
            async with self._redis.pipeline(transaction=False) as pipe:
                for user in users:
                    pipe.hvals(self._keys.conflicts(user_token(tenant, user)))
                hashes = await pipe.execute()
            found = [c for user, raw in zip(users, hashes, strict=True) for c in
                     (conflict_from_json(tenant, user, r) for r in raw)
                     if c.status in statuses]
            kept = heapq.nlargest(limit, [*kept, *found],
                                  key=lambda c: (c.created_at, c.id))
            low = b"(" + users[-1].encode()

    async def get(self, tenant: str, user: str, conflict_id: str) -> Conflict | None:
        raw = await self._redis.hget(self._keys.conflicts(user_token(tenant, user)),
                                     conflict_id)
        return None if raw is None else conflict_from_json(tenant, user, raw)

    async def weeks(self, tenant: str, user: str) -> list[ProfileWeek]:
        """The stored snapshots, oldest first."""
        raw = await self._redis.hvals(self._keys.profile_history(user_token(tenant, user)))
        return sorted((week_from_json(tenant, user, r) for r in raw), key=lambda w: w.week)
