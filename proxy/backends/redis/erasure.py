"""Removing data on Redis: "forget me" (everything held about a user, leaving a
content-free marker and the erasure's own audit event), the deletion of a tenant's shared
memory, and the sweep that ``clear`` and erasure run for memories the index has but the
id registry does not list.

Errors are the caller's to translate.
"""

from __future__ import annotations

import math
import time

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from proxy.backends.redis.audit import AuditStreams
from proxy.backends.redis.client import multi, transact
from proxy.backends.redis.index import MemoryIndex, namespace_filter
from proxy.backends.redis.keys import KeyLayout, shared_token, user_token
from proxy.backends.redis.memories import as_text
from proxy.backends.redis.users import UserRecords
from proxy.memory.records import utcnow
from proxy.memory.store import AuditEvent

log = structlog.get_logger("proxy.memory.redis")

SWEEP_PAGE = 1_000  # index rows a sweep reads (a user holds the quota's few hundred)


class AofPurge:
    """At most one AOF rewrite per ``period`` seconds, and only when an erasure owes one
    (docs/design.md#erasure). ``P:purge:owed`` (STRING) marks the debt; ``P:purge:slot``
    (STRING, expiring after ``period``) is taken by the process that starts a rewrite, so
    every gateway sharing the Redis together starts at most one per period. A server
    without AOF has nothing to rewrite; one that refuses ``BGREWRITEAOF`` (a managed Redis:
    unknown command, no permission) is logged once per process — the erasure stands."""

    def __init__(self, client: Redis, layout: KeyLayout, *, period: float) -> None:
        self._redis = client
        self._owed = f"{layout.prefix}:purge:owed"
        self._slot = f"{layout.prefix}:purge:slot"
        self._period = max(1, math.ceil(period))
        self._told: set[str] = set()  # what was logged once already

    async def owe(self) -> None:
        await self._redis.set(self._owed, "1")

    async def run(self) -> bool:
        """Start an AOF rewrite when one is owed and the period's slot is free. Whether
        one was started."""
        if not await self._redis.exists(self._owed):
            return False
        if not await self._redis.set(self._slot, repr(time.time()), nx=True,
                                     ex=self._period):
            return False  # one ran within the period: the debt waits for the next
        await self._redis.delete(self._owed)
        info = await self._redis.info("persistence")
        if not int(info.get("aof_enabled", 0)):
            self._once("redis_aof_off", "erased data stays in RDB snapshots (if any) "
                       "until the server's next save")
            return False
        try:
            await self._redis.bgrewriteaof()
        except ResponseError as exc:
            self._once("redis_aof_rewrite_refused", str(exc)[:200])
            return False
        log.info("redis_aof_rewrite_started", reason="erasure")
        return True

    def _once(self, event: str, detail: str) -> None:
        if event not in self._told:
            self._told.add(event)
            log.warning(event, detail=detail)


class Erasure:
    """Erasure, shared-memory deletion and sweeps under one key layout."""

    def __init__(self, client: Redis, layout: KeyLayout, *, index: MemoryIndex,
                 users: UserRecords, audit: AuditStreams) -> None:
        self._redis = client
        self._keys = layout
        self._index = index
        self._users = users
        self._audit = audit

    async def sweep(self, ns: str) -> int:
        """Delete memories of ``ns`` that the index has but the id registry does not list
        (none, unless something wrote memory hashes behind the store's back). Registered
        ones — e.g. added right after the clear — are left alone."""
        await self._index.ready()
        found = await self._index.find(namespace_filter([ns]), offset=0,
                                       limit=SWEEP_PAGE)
        if not found:
            return 0
        ids_key = self._keys.ids(ns)
        ids = [str(r["ix_id"]) for r in found]

        async def body(pipe: Pipeline) -> int:
            registered = await pipe.smismember(ids_key, ids)
            stray = [i for i, known in zip(ids, registered, strict=True) if not known]
            if not stray:
                return 0
            multi(pipe)
            pipe.unlink(*(self._keys.memory(ns, i) for i in stray),
                        *(self._keys.evidence(ns, i) for i in stray))
            await pipe.execute()
            log.warning("redis_clear_swept_unregistered", count=len(stray))
            return len(stray)

        return await transact(self._redis, [ids_key], body)

    async def erase_user(self, tenant: str, user: str, *, audit: AuditEvent) -> int:
        """Delete every key of the user's namespace (memories, evidence, profile,
        conversations, tombstones, batches, settings, audit stream, injection records), the
        user's entries of the tenant's audit stream and display-name sets; then stamp
        ``cleared_at`` (the content-free erasure marker) and log ``audit``. Returns the
        memories removed."""
        ns = user_token(tenant, user)
        ids_key, convs_key = self._keys.ids(ns), self._keys.conversations(ns)
        injections_key = self._keys.injections(ns)
        now = utcnow()

        async def body(pipe: Pipeline) -> int:
            ids = [as_text(i) for i in await pipe.smembers(ids_key)]
            conversations = [as_text(c) for c in await pipe.smembers(convs_key)]
            injections = [as_text(i) for i in await pipe.zrange(  # type: ignore[arg-type]
                injections_key, 0, -1)]
            multi(pipe)
            doomed = [self._keys.profile(ns), ids_key, convs_key, self._keys.summaries(ns),
                      self._keys.tombstones(ns), self._keys.batches(ns),
                      self._keys.settings(ns), self._keys.audit(ns),
                      self._keys.facts(ns), injections_key]
            # Conflicts and weekly profile snapshots (docs/design.md#conflicts).
            doomed += [self._keys.conflicts(ns), self._keys.profile_history(ns)]
            doomed += [self._keys.memory(ns, i) for i in ids]
            doomed += [self._keys.evidence(ns, i) for i in ids]
            doomed += [self._keys.conversation(ns, c) for c in conversations]
            doomed += [self._keys.injection(ns, i) for i in injections]
            pipe.unlink(*doomed)
            self._users.queue_cleared(pipe, ns, now)  # the content-free erasure marker
            await pipe.execute()
            return len(ids)

        profile = await self._users.get_profile(tenant, user)
        removed = await transact(self._redis, [ids_key, convs_key, injections_key], body)
        removed += await self.sweep(ns)
        await self._users.erase_names(tenant, user, profile.names if profile else ())
        await self._audit.erase_user(tenant, user)
        async with self._redis.pipeline(transaction=True) as pipe:
            self._audit.queue(pipe, [audit], ns)
            await pipe.execute()
        await self._audit.append([audit], written_ns=ns)
        return removed

    async def delete_shared(self, tenant: str, memory_id: str, *,
                            audit: AuditEvent | None = None) -> bool:
        """Delete the tenant's shared memory ``memory_id`` and its evidence, then log
        ``audit``; ``False`` when there is no such memory."""
        ns = shared_token(tenant)
        key = self._keys.memory(ns, memory_id)
        events = [audit] if audit is not None else []

        async def body(pipe: Pipeline) -> bool:
            if not await pipe.exists(key):
                return False
            multi(pipe)
            pipe.delete(key, self._keys.evidence(ns, memory_id))
            pipe.srem(self._keys.ids(ns), memory_id)
            await pipe.execute()
            return True

        deleted = await transact(self._redis, [key], body)
        if deleted:
            await self._audit.append(events)
        return deleted
