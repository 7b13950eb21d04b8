"""The parts of :class:`~proxy.backends.redis.store.RedisMemoryStore` that only hand a
call to a record class of their own: conflicts and the weekly profile
(:mod:`proxy.backends.redis.conflicts`), candidate synonyms
(:mod:`proxy.backends.redis.synonyms`) and injection records
(:mod:`proxy.backends.redis.injections`). Each call translates Redis errors into
:class:`~proxy.memory.store.StoreUnavailableError`, as the store's own methods do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta

from redisvl.exceptions import RedisVLError

from proxy.backends.redis.client import unavailable_on_redis_error
from proxy.backends.redis.conflicts import ConflictRecords
from proxy.backends.redis.index import IndexMismatchError
from proxy.backends.redis.injections import InjectionRecords
from proxy.backends.redis.synonyms import SynonymRecords
from proxy.memory.conflicts import Conflict, ProfileWeek
from proxy.memory.explain import InjectionRecord, RecordRow
from proxy.memory.synonyms import SynonymCandidate, SynonymExample, SynonymStatus


def store_unavailable(operation: str) -> contextlib.AbstractContextManager[None]:
    """The Redis store's error translation (its own methods and these parts):
    :func:`~proxy.backends.redis.client.unavailable_on_redis_error` for redis, RedisVL and
    index-mismatch errors, naming ``store <operation>``."""
    return unavailable_on_redis_error(f"store {operation}", (RedisVLError, IndexMismatchError))



class RecordParts:
    """Mixed into the Redis store, which sets the three record attributes."""

    _conflicts: ConflictRecords
    _synonyms: SynonymRecords
    _injections: InjectionRecords

    async def record_injections(self, records: Sequence[RecordRow], *, now: datetime,
                                retention: timedelta, per_user: int) -> None:
        with store_unavailable("record_injections"):
            await self._injections.write(records, now=now, retention=retention,
                                         per_user=per_user)

    async def get_injection(self, tenant: str, user: str, injection_id: str, *,
                            since: datetime) -> InjectionRecord | None:
        with store_unavailable("get_injection"):
            return await self._injections.get(tenant, user, injection_id, since=since)

    # conflicts and the profile over time (proxy.backends.redis.conflicts) -------------
    async def list_conflicts(self, tenant: str, user: str, *, statuses: frozenset[str],
                             limit: int = 500) -> list[Conflict]:
        with store_unavailable("list_conflicts"):
            return await self._conflicts.listed(tenant, user, statuses, limit)

    async def list_tenant_conflicts(self, tenant: str, *, statuses: frozenset[str],
                                    limit: int = 500) -> list[Conflict]:
        with store_unavailable("list_tenant_conflicts"):
            return await self._conflicts.tenant_listed(tenant, statuses, limit)

    async def get_conflict(self, tenant: str, user: str,
                           conflict_id: str) -> Conflict | None:
        with store_unavailable("get_conflict"):
            return await self._conflicts.get(tenant, user, conflict_id)

    async def profile_history(self, tenant: str, user: str) -> list[ProfileWeek]:
        with store_unavailable("profile_history"):
            return await self._conflicts.weeks(tenant, user)

    # candidate synonyms (proxy.backends.redis.synonyms) ------------------------------------
    async def count_synonyms(self, tenant: str, user: str,
                             examples: Sequence[SynonymExample]) -> None:
        with store_unavailable("count_synonyms"):
            await self._synonyms.count(tenant, user, examples)

    async def synonym_candidates(self, tenant: str, *, status: SynonymStatus | None,
                                 limit: int) -> list[SynonymCandidate]:
        with store_unavailable("synonym_candidates"):
            return await self._synonyms.candidates(tenant, status=status, limit=limit)

    async def decide_synonym(self, tenant: str, candidate: str, *, status: SynonymStatus,
                             actor: str, at: datetime) -> SynonymCandidate | None:
        with store_unavailable("decide_synonym"):
            return await self._synonyms.decide(tenant, candidate, status=status, actor=actor,
                                               at=at)
