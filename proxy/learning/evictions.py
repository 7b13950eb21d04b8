"""Memories the worker deletes on its own: over quota, and past retention unused.

Each deletion is one audited change set per owner, without a tombstone: an evicted or
expired memory may be learned again when it is said again. The quota rules themselves are
:mod:`proxy.learning.quotas`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from proxy.learning import quotas
from proxy.learning.events import Counter
from proxy.memory.records import Memory, new_id
from proxy.memory.store import AuditEvent, ChangeSet, MemoryStore, ScanQuery
from proxy.settings import GROUP_PREFIX, LearningSettings
from proxy.tenants import TenantSettings


class Evictions:
    """Quota eviction after a batch, and the retention sweep of maintenance."""

    def __init__(self, *, store: MemoryStore, settings: LearningSettings,
                 tenants: TenantSettings | None, clock: Callable[[], datetime],
                 count: Counter) -> None:
        self._store = store
        self._settings = settings
        self._tenants = tenants
        self._clock = clock
        self._count = count

    async def enforce_quotas(self, tenant: str, user: str, channel: str, *,
                             max_per_user: int | None = None) -> None:
        """Evict over-quota memories of ``user`` (and of the group, for group channels):
        per-user total (``max_per_user``, default ``learning.max_memory_per_user``),
        per-person facts, per-group facts (see :mod:`quotas`)."""
        max_per_user = max_per_user or self._settings.max_memory_per_user
        now = self._clock()
        counts = await self._store.count(tenant, user)
        stored = quotas.held(counts)
        victims: list[Memory] = []
        if stored > min(max_per_user, quotas.FACTS_PER_PERSON):
            mine = await self._store.scan(ScanQuery(
                tenant=tenant, user=user, limit=stored + 100))
            victims += quotas.evictions(mine, max_per_user=max_per_user, now=now)
        if channel.startswith(GROUP_PREFIX):
            in_group = await self._store.scan(ScanQuery(
                tenant=tenant, channel=channel, limit=quotas.FACTS_PER_GROUP * 4))
            victims += quotas.over_quota(in_group, limit=quotas.FACTS_PER_GROUP, now=now)
        await self.delete(victims, action="evicted", reason="over quota")

    async def sweep_retention(self, *, limit: int = 500) -> int:
        """Purge learned memories (``source: auto``) older than ``retention_days`` that were
        never injected (memory the gateway chose to keep that has never been of use is not
        kept for ever; docs/design.md#retention). A memory the user wrote or imported stays
        until the user deletes it, whatever its ``created_at``. Returns how many went.

        A tenant's run-time ``learning.retention_days`` counts for its memories: the scan
        across tenants uses the config's value (a tenant with a longer one keeps its
        memories), and each tenant this process holds settings of with a shorter one gets
        a scan of its own."""
        now = self._clock()
        expired = await self._store.scan(ScanQuery(
            created_before=now - timedelta(days=self._settings.retention_days),
            never_accessed=True, source="auto", limit=limit))
        if self._tenants is not None:
            kept = []
            for memory in expired:
                days = (await self._tenants.get(memory.tenant)).learning.retention_days
                if memory.created_at < now - timedelta(days=days):
                    kept.append(memory)
            expired = kept
            for config in self._tenants.cached():
                days = config.learning.retention_days
                if days < self._settings.retention_days:
                    expired += await self._store.scan(ScanQuery(
                        tenant=config.tenant, created_before=now - timedelta(days=days),
                        never_accessed=True, source="auto", limit=limit))
        unique = list({m.id: m for m in expired}.values())
        await self.delete(unique, action="purged", reason="retention: never used")
        return len(unique)

    async def delete(self, victims: list[Memory], *, action: str, reason: str) -> None:
        """Delete memories per owner, one audited change set each (no tombstone: an
        evicted or expired memory may be learned again if it is said again)."""
        by_owner: dict[tuple[str, str], list[Memory]] = {}
        for memory in {m.id: m for m in victims}.values():
            if memory.user_id is not None:
                by_owner.setdefault((memory.tenant, memory.user_id), []).append(memory)
        now = self._clock()
        for (tenant, user), memories in by_owner.items():
            await self._store.apply(ChangeSet(
                tenant=tenant, user_id=user, batch_key=f"{action}:{new_id()}",
                deletes=tuple(m.id for m in memories),
                audit=tuple(AuditEvent(tenant=tenant, user_id=user, action=action,  # type: ignore[arg-type]
                                       actor="auto", at=now, memory_id=m.id, reason=reason)
                            for m in memories),
            ))
            self._count(action, "memories")
