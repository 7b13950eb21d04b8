""":class:`~proxy.memory.store.MemoryStore` on Redis 8 / Redis Stack (RediSearch + RedisVL).

Same semantics as :class:`~proxy.backends.sqlite.store.SqliteMemoryStore` (one contract test
suite runs against both). Key layout: :mod:`proxy.backends.redis.keys`; hash fields:
:mod:`proxy.backends.redis.codec`; index schema, versioning and migration:
:mod:`proxy.backends.redis.index`.

**Atomicity.** Every key of a (tenant, user) shares one Cluster hash tag, so each write is
one ``MULTI``/``EXEC`` on one slot. Read-then-write operations (``apply``, ``update``,
``delete``, ``clear``) use optimistic ``WATCH``: they read what they decide on, queue the
writes, and ``EXEC`` fails if a watched key changed meanwhile, in which case the whole
operation is retried (:func:`proxy.backends.redis.client.transact`). WATCH rather than a Lua
script keeps the encoding in typed Python, and conflicts are rare (two writers on the same
user at the same instant). Nothing a transaction queues can fail at run time (each key has
one type, values are encoded before ``MULTI``), so an ``EXEC`` applies everything.

**At most once.** ``apply`` watches the namespace's ``batches`` sorted set, returns
``False`` when the batch key is in it, and adds the key inside the same transaction; a
concurrent apply of the same batch aborts the ``EXEC`` and, on retry, sees the key. Batch
keys are kept :data:`APPLIED_BATCH_RETENTION_SECONDS` (SQLite keeps them forever).

**Audit log.** Redis Streams per user and per tenant (:mod:`proxy.backends.redis.audit`): a
user's events are appended inside the transaction that makes the change, the tenant copy
right after it.

**Deletion (case B32).** ``delete`` removes the hash (hence its index entries) and its
evidence, and records a tombstone; ``clear`` removes every memory, evidence set,
conversation record and the profile listed in the namespace's registries in one
transaction, then sweeps the index for any memory of the user that escaped the registry.

Every ``redis``/``redisvl`` failure surfaces as
:class:`~proxy.memory.store.StoreUnavailableError` (memory degrades; chat goes on). Reads
of the hot path use the search index, so the index must be present: it is created lazily
on first use (or by :meth:`RedisMemoryStore.prepare` at startup), so the gateway starts
while Redis is down and recovers when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import string
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError
from redisvl.exceptions import RedisVLError
from redisvl.query.filter import FilterExpression, Num, Tag

from proxy.backends.redis.audit import AuditStreams
from proxy.backends.redis.client import multi, require_resp2_bytes, transact
from proxy.backends.redis.codec import (
    EMBEDDING_FIELD_PREFIX,
    VECTOR_MODEL_FIELD,
    embedding_field,
    memory_from_hash,
    memory_to_hash,
    stored_norm,
)
from proxy.backends.redis.index import (
    INDEX_BUILD_WAIT_SECONDS,
    IndexMismatchError,
    MemoryIndex,
    active_filter,
    all_of,
    channel_filter,
    namespace_filter,
    tag_is,
)
from proxy.backends.redis.keys import (
    SHARED_USER,
    KeyLayout,
    channel_token,
    namespace_token,
    shared_token,
    tenant_token,
    user_token,
)
from proxy.backends.redis.users import UserRecords
from proxy.memory.records import (
    ConversationRecord,
    Memory,
    Profile,
    from_iso,
    to_iso,
    utcnow,
)
from proxy.memory.store import (
    ApplyPlan,
    AuditEvent,
    AuditFilter,
    Candidate,
    ChangeSet,
    ListQuery,
    PromptVersion,
    ScanQuery,
    SearchQuery,
    StoreUnavailableError,
    UserSettings,
    VectorUpdate,
    fact_key,
    plan_apply,
    related_by_keywords,
    scope_state_counts,
    state_counts,
)
from proxy.memory.text import load_segmenter_for, normalize, query_terms
from proxy.settings import GLOBAL_NAMESPACE

log = structlog.get_logger("proxy.memory.redis")

# Batch keys are redelivered only while their learning job lives: at most
# ``learning.max_attempts`` leases of ``learning.lease_seconds`` plus backoff — minutes.
# 30 days matches the default ``learning.seen_message_ttl_days``, after which the queue
# forgets messages anyway.
APPLIED_BATCH_RETENTION_SECONDS = 30 * 86400
LIST_SCAN_PAGE = 1_000  # rows per FT.SEARCH page when a text filter is applied in Python

# access_count += n only if the memory still exists: a bare HINCRBY on a memory deleted
# meanwhile would create a stray hash that no registry lists.
_RECORD_ACCESS_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'access_count', ARGV[1])
  redis.call('HSET', KEYS[1], 'last_access_at', ARGV[2])
  return 1
end
return 0
"""

_ASCII_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


@contextlib.contextmanager
def _unavailable(operation: str) -> Iterator[None]:
    try:
        yield
    except (RedisError, RedisVLError, IndexMismatchError) as exc:
        raise StoreUnavailableError(f"redis store {operation} failed: {exc}") from exc


def _like(haystack: str, needle: str) -> bool:
    """SQLite ``haystack LIKE '%needle%'``: substring, case-insensitive for ASCII only."""
    return needle.translate(_ASCII_FOLD) in haystack.translate(_ASCII_FOLD)


class RedisMemoryStore:
    """:class:`~proxy.memory.store.MemoryStore` on one ``redis.asyncio`` client (RESP2,
    bytes — see :func:`proxy.backends.redis.client.connect`), which the caller owns and closes.

    ``key_prefix`` starts every key (``storage.key_prefix``); ``vector_dim`` is the
    embedding dimension of the vector index (``None``: keyword search only).
    """

    def __init__(self, client: Redis, *, key_prefix: str = "mp",
                 vector_dim: int | None = None,
                 index_build_wait_seconds: float = INDEX_BUILD_WAIT_SECONDS) -> None:
        require_resp2_bytes(client)
        self._redis = client
        self._keys = KeyLayout(key_prefix)
        self._index = MemoryIndex(client, self._keys, vector_dim,
                                  build_wait_seconds=index_build_wait_seconds)
        self._audit = AuditStreams(client, self._keys)
        self._users = UserRecords(client, self._keys)
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._touch = client.register_script(_RECORD_ACCESS_LUA)

    @property
    def index_name(self) -> str:
        """The configured index (``<prefix>_mem_v<version>_d<dim>``)."""
        return self._index.name

    @property
    def serving_index(self) -> str:
        """The index queries use now: the configured one, or its predecessor while the
        configured one is being built."""
        return self._index.serving

    async def prepare(self) -> None:
        """Create or migrate the search index now (see :mod:`proxy.backends.redis.index`).
        Raises :class:`StoreUnavailableError` when Redis is unreachable or refuses."""
        with _unavailable("index setup"):
            await self._ensure_index()

    async def _ensure_index(self) -> None:
        if self._ready:
            await self._index.maintain()
            return
        async with self._ready_lock:
            if not self._ready:
                await self._index.ensure()
                self._ready = True

    async def ping(self) -> None:
        with _unavailable("ping"):
            await self._redis.ping()
            await self._ensure_index()

    async def maintain(self) -> None:
        """Nothing to do: the Query Engine merges and garbage-collects its own index."""

    # helpers ---------------------------------------------------------------------------
    async def _fetch(self, keys: Sequence[str]) -> list[Memory | None]:
        """The memories at ``keys``, aligned with them; ``None`` where a key was deleted
        meanwhile (or holds no readable memory — logged)."""
        if not keys:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(key)
            raw: list[dict[bytes | str, bytes | str]] = await pipe.execute()
        out: list[Memory | None] = []
        for key, data in zip(keys, raw, strict=True):
            memory = None
            if data:
                try:
                    memory = memory_from_hash(data)
                except (ValueError, KeyError) as exc:
                    log.warning("redis_memory_unreadable", key=key, error=str(exc))
            out.append(memory)
        return out

    async def _load(self, keys: Sequence[str]) -> list[Memory]:
        return [m for m in await self._fetch(keys) if m is not None]

    def _queue_upsert(self, pipe: Pipeline, memory: Memory) -> None:
        ns = namespace_token(memory.tenant, memory.user_id)
        key = self._keys.memory(ns, memory.id)
        pipe.delete(key)  # replaces the whole record: no stale optional or vector field
        pipe.hset(key, mapping=memory_to_hash(memory))  # type: ignore[arg-type]
        pipe.sadd(self._keys.ids(ns), memory.id)

    # hot path --------------------------------------------------------------------------
    async def search(self, query: SearchQuery) -> list[Candidate]:
        tokens = [user_token(query.tenant, query.user)]
        if query.include_shared:
            tokens += [shared_token(query.tenant), shared_token(GLOBAL_NAMESPACE)]
        where = all_of(namespace_filter(tokens), active_filter(),
                       channel_filter(query.channels))
        vector = query.embedding
        use_vector = (vector is not None and self._index.vector_dim is not None
                      and len(vector) == self._index.vector_dim
                      and math.hypot(*vector) > 0)
        with _unavailable("search"):
            await self._ensure_index()
            keyword_task = self._index.keyword(query.terms, where, query.limit) \
                if query.terms and query.limit > 0 else _nothing()
            vector_task = self._index.nearest(vector, where, query.limit) \
                if use_vector and vector is not None and query.limit > 0 else _nothing()
            keyword, nearest = await asyncio.gather(keyword_task, vector_task)
            keys = list(dict.fromkeys([h.key for h in keyword] + [h.key for h in nearest]))
            memories = dict(zip(keys, await self._fetch(keys), strict=True))
        found: dict[str, Candidate] = {}
        for rank, hit in enumerate(keyword, start=1):
            memory = memories.get(hit.key)
            if memory is not None:
                found[memory.id] = Candidate(memory, keyword_rank=rank,
                                             keyword_score=hit.score)
        if query.embedding_model is not None:  # vectors of another model are not comparable
            nearest = [h for h in nearest if (m := memories.get(h.key)) is not None
                       and m.embedding_model in (None, query.embedding_model)]
        for rank, hit in enumerate(nearest, start=1):
            memory = memories.get(hit.key)
            if memory is None:
                continue
            previous = found.get(memory.id)
            found[memory.id] = Candidate(
                memory,
                keyword_rank=previous.keyword_rank if previous else None,
                keyword_score=previous.keyword_score if previous else None,
                vector_rank=rank, vector_score=hit.score,
            )
        return list(found.values())

    async def resident(
        self, tenant: str, user: str, *, limit: int, channels: tuple[str | None, ...] | None
    ) -> list[Memory]:
        if limit <= 0:
            return []
        where = all_of(namespace_filter([user_token(tenant, user)]), active_filter(),
                       tag_is("ix_about", "1"), channel_filter(channels))
        with _unavailable("resident"):
            await self._ensure_index()
            return await self._load(await self._index.top_by_evidence(where, limit))

    async def get_profile(self, tenant: str, user: str) -> Profile | None:
        with _unavailable("get_profile"):
            return await self._users.get_profile(tenant, user)

    async def record_access(self, tenant: str, counts: Mapping[str, int], at: datetime) -> None:
        if not counts:
            return
        stamp = to_iso(at) or ""
        ids = list(counts)
        where = tag_is("ix_tenant", tenant_token(tenant)) & tag_is("ix_id", ids)
        with _unavailable("record_access"):
            await self._ensure_index()
            rows = await self._index.find(where, offset=0, limit=2 * len(ids))
            if not rows:
                return
            async with self._redis.pipeline(transaction=False) as pipe:
                for row in rows:
                    await self._touch(keys=[row["id"]], args=[counts[row["ix_id"]], stamp],
                                      client=pipe)
                await pipe.execute()

    # management ------------------------------------------------------------------------
    async def get(self, tenant: str, user: str | None, memory_id: str) -> Memory | None:
        key = self._keys.memory(namespace_token(tenant, user), memory_id)
        with _unavailable("get"):
            found = await self._load([key])
        if not found or found[0].tenant != tenant or found[0].user_id != user:
            return None
        return found[0]

    async def list_memories(self, query: ListQuery) -> list[Memory]:
        if query.limit <= 0:
            return []
        if query.scope == "personal":
            where = namespace_filter([user_token(query.tenant, query.user)])
        else:
            where = namespace_filter([shared_token(query.tenant)]) & \
                tag_is("scope", query.scope)
        if not query.include_retired:
            where = where & tag_is("ix_retired", "0")
        if not query.include_disabled:
            where = where & tag_is("enabled", "1")
        if query.enabled is not None:
            where = where & tag_is("enabled", "1" if query.enabled else "0")
        if query.source:
            where = where & tag_is("source", query.source)
        if query.category:
            where = where & tag_is("category", query.category)
        with _unavailable("list"):
            await self._ensure_index()
            if not query.text and not query.after:
                rows = await self._index.find(where, offset=query.offset, limit=query.limit)
                return await self._load([r["id"] for r in rows])
            # A text filter or a cursor is applied here, over the namespace's rows (a
            # user holds at most the quota's few hundred, plus retired ones).
            terms = [t.lower() for t in query_terms(query.text, limit=8) or [query.text]] \
                if query.text else []
            keys: list[str] = []
            offset = 0
            while True:
                rows = await self._index.find(where, offset=offset, limit=LIST_SCAN_PAGE,
                                              fields=("ix_id", "norm", "title"))
                for row in rows:
                    if query.after and str(row.get("ix_id", "")) >= query.after:
                        continue
                    norm, title = str(row.get("norm", "")), str(row.get("title", ""))
                    if all(_like(norm, t) or _like(title, t) for t in terms):
                        keys.append(row["id"])
                if len(rows) < LIST_SCAN_PAGE:
                    break
                offset += LIST_SCAN_PAGE
            return await self._load(keys[query.offset:query.offset + query.limit])

    async def count(self, tenant: str, user: str) -> dict[str, int]:
        with _unavailable("count"):
            await self._ensure_index()
            groups = await self._index.state_counts(
                namespace_filter([user_token(tenant, user)]))
        return state_counts(groups)

    async def add(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        await _terms_ready([memory])
        ns = namespace_token(memory.tenant, memory.user_id)
        events = [audit] if audit is not None else []
        with _unavailable("add"):
            async with self._redis.pipeline(transaction=True) as pipe:
                self._queue_upsert(pipe, memory)
                self._audit.queue(pipe, events, ns)
                await pipe.execute()
            await self._audit.append(events, written_ns=ns)
        return memory

    async def update(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        await _terms_ready([memory])
        ns = namespace_token(memory.tenant, memory.user_id)
        key = self._keys.memory(ns, memory.id)
        events = [audit] if audit is not None else []

        async def body(pipe: Pipeline) -> None:
            if not await pipe.exists(key):
                raise KeyError(memory.id)
            multi(pipe)
            self._queue_upsert(pipe, memory)
            self._audit.queue(pipe, events, ns)
            await pipe.execute()

        with _unavailable("update"):
            await transact(self._redis, [key], body)
            await self._audit.append(events, written_ns=ns)
        return memory

    async def delete(
        self, tenant: str, user: str, memory_id: str, *, audit: AuditEvent | None = None
    ) -> bool:
        ns = user_token(tenant, user)
        key = self._keys.memory(ns, memory_id)
        events = [audit] if audit is not None else []
        now = utcnow()

        async def body(pipe: Pipeline) -> bool:
            data = await pipe.hgetall(key)
            norm = stored_norm(data) if data else None
            if norm is None:
                return False
            multi(pipe)
            pipe.delete(key, self._keys.evidence(ns, memory_id))
            pipe.srem(self._keys.ids(ns), memory_id)
            self._users.queue_tombstone(pipe, ns, norm, now)
            self._audit.queue(pipe, events, ns)
            await pipe.execute()
            return True

        with _unavailable("delete"):
            deleted = await transact(self._redis, [key], body)
            if deleted:
                await self._audit.append(events, written_ns=ns)
        return deleted

    async def clear(self, tenant: str, user: str, *, audit: AuditEvent | None = None) -> int:
        ns = user_token(tenant, user)
        ids_key, convs_key = self._keys.ids(ns), self._keys.conversations(ns)
        events = [audit] if audit is not None else []
        now = utcnow()

        async def body(pipe: Pipeline) -> int:
            ids = [_text(i) for i in await pipe.smembers(ids_key)]
            conversations = [_text(c) for c in await pipe.smembers(convs_key)]
            multi(pipe)
            doomed = [self._keys.profile(ns), ids_key, convs_key, self._keys.summaries(ns),
                      self._keys.facts(ns)]
            doomed += [self._keys.memory(ns, i) for i in ids]
            doomed += [self._keys.evidence(ns, i) for i in ids]
            doomed += [self._keys.conversation(ns, c) for c in conversations]
            pipe.unlink(*doomed)
            self._users.queue_cleared(pipe, ns, now)
            self._audit.queue(pipe, events, ns)
            await pipe.execute()
            return len(ids)

        with _unavailable("clear"):
            removed = await transact(self._redis, [ids_key, convs_key], body)
            await self._audit.append(events, written_ns=ns)
            removed += await self._sweep(ns)
        return removed

    async def _sweep(self, ns: str) -> int:
        """Delete memories of ``ns`` that the index has but the id registry does not list
        (none, unless something wrote memory hashes behind the store's back). Registered
        ones — e.g. added right after the clear — are left alone."""
        await self._ensure_index()
        found = await self._index.find(namespace_filter([ns]), offset=0,
                                       limit=LIST_SCAN_PAGE)
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

    # learning --------------------------------------------------------------------------
    async def related(self, tenant: str, user: str, text: str, *, limit: int) -> list[Memory]:
        return await related_by_keywords(self, tenant, user, text, limit=limit)

    async def apply(self, changes: ChangeSet) -> bool:
        _check_namespace(changes)
        await _terms_ready(changes.upserts)
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
            multi(pipe)
            pipe.zadd(batches, {changes.batch_key: now})
            pipe.zremrangebyscore(batches, "-inf", now - APPLIED_BATCH_RETENTION_SECONDS)
            for memory in plan.upserts:
                # Hits: the stored count read under WATCH plus the new evidence pairs.
                self._queue_upsert(pipe, memory.with_changes(
                    hits=memory.hits + increments.pop(memory.id, 0)))
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
            await pipe.execute()
            audit[:] = plan.audit
            return True

        audit: list[AuditEvent] = list(changes.audit)
        with _unavailable("apply"):
            applied = await transact(
                self._redis, [batches, ids_key, settings_key, tombs_key, summaries_key,
                              facts_key], body)
            if applied:
                await self._audit.append(audit, written_ns=ns)
        return applied

    async def _plan(self, pipe: Pipeline, changes: ChangeSet, upserts: list[Memory],
                    ns: str) -> ApplyPlan:
        """:func:`~proxy.memory.store.plan_apply` with the stored hits and duplicates read
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
            stored_id = _text(found)
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
        racing this apply aborts and retries it (case B32)."""
        if changes.learned_from is None:
            return list(changes.upserts)
        since = changes.learned_from
        cleared = from_iso(_opt_text(await pipe.hget(self._keys.settings(ns), "cleared_at")))
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

    async def scan(self, query: ScanQuery) -> list[Memory]:
        parts: list[FilterExpression] = [Tag("ix_user") != SHARED_USER]
        if query.tenant is not None:
            parts.append(tag_is("ix_tenant", tenant_token(query.tenant)))
        if query.user is not None and query.tenant is not None:
            parts.append(namespace_filter([user_token(query.tenant, query.user)]))
        if query.channel is not None:
            parts.append(tag_is("ix_chan", channel_token(query.channel)))
        if query.created_before is not None:
            parts.append(Num("ix_created") < query.created_before.timestamp())
        with _unavailable("scan"):
            await self._ensure_index()
            rows = await self._index.find(all_of(*parts), offset=0, limit=query.limit,
                                          oldest_first=True)
            memories = await self._load([r["id"] for r in rows])
        if query.user is not None:
            memories = [m for m in memories if m.user_id == query.user]
        if query.never_accessed:
            memories = [m for m in memories if m.access_count == 0]
        # Ids are ULIDs (creation order) for everything the gateway writes; created_at
        # decides for records imported with their own times.
        return sorted(memories, key=lambda m: (m.created_at, m.id))

    async def bind_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        keys = {normalize(n) for n in names if normalize(n)}
        if not keys:
            return
        name_keys = [self._keys.names(tenant_token(tenant), key) for key in keys]
        with _unavailable("bind_names"):
            async with self._redis.pipeline(transaction=False) as pipe:
                for name_key in name_keys:
                    pipe.sadd(name_key, user)
                pipe.sadd(self._keys.user_names(user_token(tenant, user)), *name_keys)
                await pipe.execute()

    async def users_named(self, tenant: str, name: str) -> list[str]:
        key = normalize(name)
        if not key:
            return []
        with _unavailable("users_named"):
            members = await self._redis.smembers(self._keys.names(tenant_token(tenant), key))
        return sorted(_text(m) for m in members)

    async def save_prompt(self, tenant: str, kind: str, text: str, actor: str,
                          at: datetime) -> PromptVersion:
        entry = orjson.dumps({"text": text, "actor": actor, "at": to_iso(at)})
        with _unavailable("save_prompt"):
            version = await self._redis.rpush(self._keys.prompts(tenant_token(tenant), kind),
                                              entry)
        return PromptVersion(tenant=tenant, kind=kind, version=int(version),  # type: ignore[arg-type]
                             text=text, actor=actor, at=at)

    async def prompt_versions(self, tenant: str, kind: str, *,
                              limit: int = 20) -> list[PromptVersion]:
        key = self._keys.prompts(tenant_token(tenant), kind)
        with _unavailable("prompt_versions"):
            total = int(await self._redis.llen(key))
            raw = await self._redis.lrange(key, max(0, total - limit), total - 1)
        out = []
        for offset, item in enumerate(raw):
            data = orjson.loads(item)
            at = from_iso(data["at"])
            assert at is not None
            out.append(PromptVersion(tenant=tenant, kind=kind,  # type: ignore[arg-type]
                                     version=max(0, total - limit) + offset + 1,
                                     text=data["text"], actor=data["actor"], at=at))
        return out[::-1]

    async def tombstoned(
        self, tenant: str, user: str, norms: Sequence[str]
    ) -> dict[str, datetime]:
        with _unavailable("tombstoned"):
            return await self._users.tombstoned(tenant, user, norms)

    async def put_profile(self, profile: Profile) -> None:
        with _unavailable("put_profile"):
            await self._users.put_profile(profile)

    async def get_conversation(
        self, tenant: str, user: str, conversation_id: str
    ) -> ConversationRecord | None:
        with _unavailable("get_conversation"):
            return await self._users.get_conversation(tenant, user, conversation_id)

    async def get_user_settings(self, tenant: str, user: str) -> UserSettings:
        with _unavailable("get_user_settings"):
            return await self._users.get_settings(tenant, user)

    async def put_user_settings(self, tenant: str, user: str, settings: UserSettings) -> None:
        with _unavailable("put_user_settings"):
            await self._users.put_settings(tenant, user, settings)

    async def audit(self, events: Sequence[AuditEvent]) -> None:
        with _unavailable("audit"):
            await self._audit.append(events)

    async def audit_log(
        self, tenant: str, user: str | None, *, limit: int = 100, before_id: int | None = None
    ) -> list[tuple[int, AuditEvent]]:
        with _unavailable("audit_log"):
            return await self._audit.read(tenant, user, limit=limit, before_id=before_id)

    # issue 13: admin governance ----------------------------------------------------------
    async def audit_search(self, tenant: str, where: AuditFilter, *, limit: int = 100,
                           before_id: int | None = None) -> list[tuple[int, AuditEvent]]:
        with _unavailable("audit_search"):
            return await self._audit.search(tenant, where, limit=limit, before_id=before_id)

    async def audit_counts(self, tenant: str, *, since: datetime
                           ) -> dict[tuple[str, str, str], int]:
        with _unavailable("audit_counts"):
            return await self._audit.counts(tenant, since_ms=int(since.timestamp() * 1000))

    async def tenant_counts(self, tenant: str) -> dict[str, dict[str, int]]:
        with _unavailable("tenant_counts"):
            await self._ensure_index()
            groups = await self._index.scope_counts(tag_is("ix_tenant", tenant_token(tenant)))
        return scope_state_counts(groups)

    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        with _unavailable("get_tenant_settings"):
            raw = await self._redis.get(self._keys.tenant_settings(tenant_token(tenant)))
        return {} if raw is None else dict(orjson.loads(raw))

    async def put_tenant_settings(self, tenant: str, overrides: Mapping[str, object]
                                  ) -> None:
        with _unavailable("put_tenant_settings"):
            await self._redis.set(self._keys.tenant_settings(tenant_token(tenant)),
                                  orjson.dumps(dict(overrides)))

    # issue 12: erasure ---------------------------------------------------------------
    async def erase_user(self, tenant: str, user: str, *, audit: AuditEvent) -> int:
        ns = user_token(tenant, user)
        ids_key, convs_key = self._keys.ids(ns), self._keys.conversations(ns)
        now = utcnow()

        async def body(pipe: Pipeline) -> int:
            ids = [_text(i) for i in await pipe.smembers(ids_key)]
            conversations = [_text(c) for c in await pipe.smembers(convs_key)]
            multi(pipe)
            doomed = [self._keys.profile(ns), ids_key, convs_key, self._keys.summaries(ns),
                      self._keys.tombstones(ns), self._keys.batches(ns),
                      self._keys.settings(ns), self._keys.audit(ns),
                      self._keys.facts(ns)]
            doomed += [self._keys.memory(ns, i) for i in ids]
            doomed += [self._keys.evidence(ns, i) for i in ids]
            doomed += [self._keys.conversation(ns, c) for c in conversations]
            pipe.unlink(*doomed)
            self._users.queue_cleared(pipe, ns, now)  # the content-free erasure marker
            await pipe.execute()
            return len(ids)

        with _unavailable("erase_user"):
            profile = await self._users.get_profile(tenant, user)
            removed = await transact(self._redis, [ids_key, convs_key], body)
            removed += await self._sweep(ns)
            await self._erase_names(tenant, user, profile.names if profile else ())
            await self._audit.erase_user(tenant, user)
            async with self._redis.pipeline(transaction=True) as pipe:
                self._audit.queue(pipe, [audit], ns)
                await pipe.execute()
            await self._audit.append([audit], written_ns=ns)
        return removed

    async def _erase_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        """Remove ``user`` from the display-name sets listed under the user, and from
        those of ``names`` (the profile's names: bindings made before the per-user list
        was kept)."""
        listed = self._keys.user_names(user_token(tenant, user))
        keys = {_text(k) for k in await self._redis.smembers(listed)}
        keys |= {self._keys.names(tenant_token(tenant), normalize(n))
                 for n in names if normalize(n)}
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.srem(key, user)
            pipe.unlink(listed)
            await pipe.execute()

    async def delete_shared(self, tenant: str, memory_id: str, *,
                            audit: AuditEvent | None = None) -> bool:
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

        with _unavailable("delete_shared"):
            deleted = await transact(self._redis, [key], body)
            if deleted:
                await self._audit.append(events)
        return deleted


    # vectors kept consistent with the embedder (memory-proxy reindex) -------------------
    async def stale_vectors(self, model: str, *, limit: int,
                            cursor: str = "") -> tuple[list[Memory], str]:
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in self._keys.prefix)
        with _unavailable("stale_vectors"):
            following, keys = await self._redis.scan(
                int(cursor) if cursor.isdigit() else 0, match=f"{pattern}:m:*",
                count=max(1, limit), _type="HASH")
            memories = await self._load([_text(k) for k in keys])
        stale = [m for m in memories if m.active and (
            m.embedding is None or m.embedding_model != model)]
        return sorted(stale, key=lambda m: m.id), "" if int(following) == 0 else str(following)

    async def set_vectors(self, updates: Sequence[VectorUpdate]) -> int:
        written = 0
        for u in updates:
            key = self._keys.memory(namespace_token(u.tenant, u.user_id), u.memory_id)
            field = embedding_field(len(u.embedding))
            vector = np.asarray(u.embedding, np.float32).tobytes()

            async def body(pipe: Pipeline, key: str = key, u: VectorUpdate = u,
                           field: str = field, vector: bytes = vector) -> int:
                current = await pipe.hmget(key, ["content"])
                if current[0] is None or _text(current[0]) != u.content:
                    return 0
                names = [_text(n) for n in await pipe.hkeys(key)]
                multi(pipe)
                others = [n for n in names if n.startswith(EMBEDDING_FIELD_PREFIX)
                          and n != field]
                if others:
                    pipe.hdel(key, *others)
                pipe.hset(key, mapping={field: vector, VECTOR_MODEL_FIELD: u.model})
                await pipe.execute()
                return 1

            with _unavailable("set_vectors"):
                written += await transact(self._redis, [key], body)
        return written


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opt_text(value: bytes | str | None) -> str | None:
    return None if value is None else _text(value)


async def _terms_ready(memories: Sequence[Memory]) -> None:
    """Indexing segments CJK text: load the dictionary off the event loop first."""
    await load_segmenter_for(*(f"{m.title}\n{m.content}\n{' '.join(m.tags)}"
                               for m in memories))


async def _nothing() -> list[Any]:
    return []


def _check_namespace(changes: ChangeSet) -> None:
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
