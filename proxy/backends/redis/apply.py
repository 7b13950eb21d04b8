"""Applying a learning batch's :class:`~proxy.memory.store.ChangeSet` on Redis, at most
once, in one optimistic transaction on the user's hash slot.

**At most once.** :meth:`ChangeSetWriter.apply` watches the namespace's ``batches`` sorted
set, returns ``False`` when the batch key is in it, and adds the key inside the same
transaction; a concurrent apply of the same batch aborts the ``EXEC`` and, on retry, sees
the key. Batch keys are kept :data:`APPLIED_BATCH_RETENTION_SECONDS` (SQLite keeps them
forever).

**Deletions win.** What the user deleted (or cleared) after the batch's messages were
said is not written back: tombstones and ``cleared_at`` are read under WATCH, so a
deletion racing the apply aborts and retries it.

Errors are the caller's to translate.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.audit import AuditStreams
from proxy.backends.redis.client import multi, transact
from proxy.backends.redis.codec import memory_from_hash
from proxy.backends.redis.keys import KeyLayout, user_token
from proxy.backends.redis.memories import MemoryHashes, as_text, opt_text, terms_ready
from proxy.backends.redis.users import UserRecords
from proxy.memory.conflicts import (
    HISTORY_WEEKS,
    MAX_CONFLICTS,
    ProfileWeek,
    conflict_from_json,
    overflow,
)
from proxy.memory.records import Memory, from_iso, to_iso, utcnow
from proxy.memory.store import AuditEvent, ChangeSet
from proxy.memory.text import normalize
from proxy.memory.writes import ApplyPlan, fact_key, plan_apply

# Batch keys are redelivered only while their learning job lives: at most
# ``learning.max_attempts`` leases of ``learning.lease_seconds`` plus backoff — minutes.
# 30 days matches the default ``learning.seen_message_ttl_days``, after which the queue
# forgets messages anyway.
APPLIED_BATCH_RETENTION_SECONDS = 30 * 86400


def check_namespace(changes: ChangeSet) -> None:
    """Raise ``ValueError`` (before anything is written) when a change set touches
    another namespace than its own."""
    def mismatch(tenant: str, user: str | None) -> bool:
        return tenant != changes.tenant or user != changes.user_id

    if any(mismatch(m.tenant, m.user_id) for m in changes.upserts) or (
        changes.profile is not None
        and mismatch(changes.profile.tenant, changes.profile.user_id)
    ) or (
        changes.conversation is not None
        and mismatch(changes.conversation.tenant, changes.conversation.user_id)
    ):
        raise ValueError("a change set may only touch its own namespace")


def queue_conflicts(pipe: Pipeline, keys: KeyLayout, ns: str, plan: ApplyPlan, *,
                    snapshot: ProfileWeek | None, weeks: list[str],
                    dropped: list[str]) -> None:
    """Queue the plan's conflicts (``dropped``: the oldest ones deleted to stay within
    :data:`MAX_CONFLICTS`) and the profile snapshot (``weeks``: the snapshot weeks stored
    now; those beyond the newest :data:`HISTORY_WEEKS` are dropped)."""
    if dropped:
        pipe.hdel(keys.conflicts(ns), *dropped)
    if plan.conflicts:
        pipe.hset(keys.conflicts(ns), mapping={c.id: c.to_json() for c in plan.conflicts})
    if snapshot is not None:
        pipe.hset(keys.profile_history(ns), snapshot.week, snapshot.to_json())
        dropped = sorted({*weeks, snapshot.week})[:-HISTORY_WEEKS]
        if dropped:
            pipe.hdel(keys.profile_history(ns), *dropped)


class ChangeSetWriter:
    """Applies change sets under one key layout (memories, evidence, profile,
    conversation record and audit events of one user)."""

    def __init__(self, client: Redis, layout: KeyLayout, *, hashes: MemoryHashes,
                 users: UserRecords, audit: AuditStreams) -> None:
        self._redis = client
        self._keys = layout
        self._hashes = hashes
        self._users = users
        self._audit = audit

    async def apply(self, changes: ChangeSet) -> bool:
        """Write ``changes`` unless their batch was applied already (``False``) or the
        user cleared their memory since its messages (``False``); ``True`` when written.
        Raises ``ValueError`` when the set touches another namespace."""
        check_namespace(changes)
        await terms_ready(changes.upserts)
        ns = user_token(changes.tenant, changes.user_id)
        batches, ids_key = self._keys.batches(ns), self._keys.ids(ns)
        now = utcnow().timestamp()

        settings_key, tombs_key = self._keys.settings(ns), self._keys.tombstones(ns)
        summaries_key = self._keys.summaries(ns)
        facts_key = self._keys.facts(ns)

        async def body(pipe: Pipeline) -> bool:
            if await pipe.zscore(batches, changes.batch_key) is not None:
                return False
            upserts = await self._still_wanted(pipe, changes, ns)
            if upserts is None:
                return False
            plan = await self._plan(pipe, changes, upserts, ns)
            increments: dict[str, int] = {}
            for memory_id, key in plan.evidence:
                if memory_id in plan.counted and not await pipe.sismember(
                        self._keys.evidence(ns, memory_id), key):
                    increments[memory_id] = increments.get(memory_id, 0) + 1
            dropped = [] if changes.conversation is None else \
                await self._users.summaries_to_drop(pipe, changes.conversation)
            # Evidence counts only for memories of this namespace (stored or written now).
            written = {m.id for m in plan.upserts}
            others = sorted({mid for mid, _ in plan.evidence} - written)
            known = set(written)
            if others:
                flags = await pipe.smismember(ids_key, others)
                known |= {mid for mid, flag in zip(others, flags, strict=True) if flag}
            weeks, over = await self._stored_extras(pipe, ns, changes, plan)
            multi(pipe)
            pipe.zadd(batches, {changes.batch_key: now})
            # Only a change of what recall reads moves the recall index on: memories
            # written, hits counted, deletes (a profile or summary alone does not).
            self._hashes.changes.queue(
                pipe, ns, [*(m.id for m in plan.upserts), *increments, *changes.deletes])
            pipe.zremrangebyscore(batches, "-inf", now - APPLIED_BATCH_RETENTION_SECONDS)
            for memory in plan.upserts:
                # Hits: the stored count read under WATCH plus the new evidence pairs.
                self._hashes.queue_upsert(pipe, memory.with_changes(
                    hits=memory.hits + increments.pop(memory.id, 0)), log=False)
                if memory.active:
                    pipe.hset(facts_key, fact_key(memory), memory.id)
            for memory_id, extra in increments.items():  # stored, not rewritten
                pipe.hincrby(self._keys.memory(ns, memory_id), "hits", extra)
            for memory_id, evidence_key in plan.evidence:
                if memory_id in known:
                    pipe.sadd(self._keys.evidence(ns, memory_id), evidence_key)
            for memory_id in changes.deletes:
                pipe.delete(self._keys.memory(ns, memory_id),
                            self._keys.evidence(ns, memory_id))
                pipe.srem(ids_key, memory_id)
            if changes.profile is not None:
                self._users.queue_profile(pipe, changes.profile)
            if changes.conversation is not None:
                self._users.queue_conversation(pipe, changes.conversation, dropped)
            self._audit.queue(pipe, plan.audit, ns)
            queue_conflicts(pipe, self._keys, ns, plan, snapshot=changes.snapshot,
                            weeks=weeks, dropped=over)
            await pipe.execute()
            audit[:] = plan.audit
            return True

        audit: list[AuditEvent] = list(changes.audit)
        applied = await transact(
            self._redis, [batches, ids_key, settings_key, tombs_key, summaries_key,
                          facts_key], body)
        if applied:
            await self._audit.append(audit, written_ns=ns)
        return applied

    async def _stored_extras(self, pipe: Pipeline, ns: str, changes: ChangeSet,
                             plan: ApplyPlan) -> tuple[list[str], list[str]]:
        """The snapshot weeks stored (read only when the change set writes one) and the
        ids of the user's oldest conflicts beyond :data:`MAX_CONFLICTS` once the plan's
        are written (read only when the count says so)."""
        weeks = [] if changes.snapshot is None else \
            [as_text(w) for w in await pipe.hkeys(self._keys.profile_history(ns))]
        key, adding = self._keys.conflicts(ns), len(plan.conflicts)
        if not adding or int(await pipe.hlen(key)) + adding <= MAX_CONFLICTS:
            return weeks, []
        stored = [conflict_from_json("", "", raw) for raw in await pipe.hvals(key)]
        return weeks, overflow(((to_iso(c.created_at) or "", c.id) for c in stored
                                if c.id not in {n.id for n in plan.conflicts}),
                               keep=MAX_CONFLICTS - adding)

    async def _plan(self, pipe: Pipeline, changes: ChangeSet, upserts: list[Memory],
                    ns: str) -> ApplyPlan:
        """:func:`~proxy.memory.writes.plan_apply` with the stored hits and duplicates read
        under WATCH (their memory keys are watched too: a change aborts and retries)."""
        keys = [self._keys.memory(ns, m.id) for m in upserts]
        if keys:
            await pipe.watch(*keys)
        stored_hits: dict[str, int] = {}
        for memory, key in zip(upserts, keys, strict=True):
            raw = await pipe.hget(key, "hits")
            if raw is not None:
                stored_hits[memory.id] = int(raw)
        retiring = {m.id for m in upserts if not m.active}
        duplicates: dict[str, Memory] = {}
        for memory in upserts:
            if memory.id in stored_hits or not memory.active:
                continue
            key = fact_key(memory)
            found = await pipe.hget(self._keys.facts(ns), key)
            if found is None:
                continue
            stored_id = as_text(found)
            if stored_id == memory.id or stored_id in retiring:
                continue
            stored_key = self._keys.memory(ns, stored_id)
            await pipe.watch(stored_key)
            data = await pipe.hgetall(stored_key)
            if not data:
                continue
            stored = memory_from_hash(data)
            if stored.active and stored.user_id == changes.user_id \
                    and fact_key(stored) == key:
                duplicates[memory.id] = stored
        return plan_apply(changes, upserts, stored_hits=stored_hits, duplicates=duplicates)

    async def _still_wanted(self, pipe: Pipeline, changes: ChangeSet,
                            ns: str) -> list[Memory] | None:
        """The upserts that may still be written given deletions since ``learned_from``
        (``None``: the user cleared their memory since) — read under WATCH, so a deletion
        racing this apply aborts and retries it."""
        if changes.learned_from is None:
            return list(changes.upserts)
        since = changes.learned_from
        cleared = from_iso(opt_text(await pipe.hget(self._keys.settings(ns), "cleared_at")))
        if cleared is not None and cleared >= since:
            return None
        fresh = [m for m in changes.upserts
                 if not await pipe.sismember(self._keys.ids(ns), m.id)]
        if not fresh:
            return list(changes.upserts)
        norms = [normalize(m.content) for m in fresh]
        deleted = await self._users.tombstoned_in(pipe, ns, norms)
        dropped = {m.id for m, n in zip(fresh, norms, strict=True)
                   if n in deleted and deleted[n] >= since}
        return [m for m in changes.upserts if m.id not in dropped]

