""":class:`~proxy.memory.store.MemoryStore` on Redis 8 / Redis Stack (RediSearch + RedisVL).

Same semantics as :class:`~proxy.backends.sqlite.store.SqliteMemoryStore` (one contract test
suite runs against both). Key layout: :mod:`proxy.backends.redis.keys`; hash fields:
:mod:`proxy.backends.redis.codec`; index schema, versioning and migration:
:mod:`proxy.backends.redis.index`; memory hashes and vectors:
:mod:`proxy.backends.redis.memories`; learned change sets: :mod:`proxy.backends.redis.apply`;
user and tenant records: :mod:`proxy.backends.redis.users`,
:mod:`proxy.backends.redis.tenants`; erasure: :mod:`proxy.backends.redis.erasure`.

**Atomicity.** Every key of a (tenant, user) shares one Cluster hash tag, so each write is
one ``MULTI``/``EXEC`` on one slot. Read-then-write operations (``apply``, ``update``,
``delete``, ``clear``) use optimistic ``WATCH``: they read what they decide on, queue the
writes, and ``EXEC`` fails if a watched key changed meanwhile, in which case the whole
operation is retried (:func:`proxy.backends.redis.client.transact`). WATCH rather than a Lua
script keeps the encoding in typed Python, and conflicts are rare (two writers on the same
user at the same instant). Nothing a transaction queues can fail at run time (each key has
one type, values are encoded before ``MULTI``), so an ``EXEC`` applies everything.
``apply`` is at most once per batch key (:mod:`proxy.backends.redis.apply`).

**Audit log.** Redis Streams per user and per tenant (:mod:`proxy.backends.redis.audit`): a
user's events are appended inside the transaction that makes the change, the tenant copy
right after it.

**Deletion.** What a user deletes stays deleted, even against learning queued before the
deletion. ``delete`` removes the hash (hence its index entries) and its
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

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redisvl.query.filter import FilterExpression, Num, Tag

from proxy.backends.redis.apply import ChangeSetWriter
from proxy.backends.redis.audit import AuditStreams
from proxy.backends.redis.client import (
    OneAtATime,
    multi,
    require_resp2_bytes,
    transact,
    within,
)
from proxy.backends.redis.codec import stored_norm
from proxy.backends.redis.conflicts import ConflictRecords
from proxy.backends.redis.erasure import AofPurge, Erasure
from proxy.backends.redis.generations import (
    Generations,
    Prefetched,
    recall_corpus,
    refreshed_corpus,
)
from proxy.backends.redis.index import (
    INDEX_BUILD_WAIT_SECONDS,
    MemoryIndex,
    active_filter,
    all_of,
    channel_filter,
    namespace_filter,
    tag_is,
)
from proxy.backends.redis.injections import InjectionRecords
from proxy.backends.redis.keys import (
    SHARED_USER,
    KeyLayout,
    channel_token,
    namespace_token,
    shared_token,
    tenant_token,
    user_token,
)
from proxy.backends.redis.memories import MemoryHashes, as_text, terms_ready
from proxy.backends.redis.parts import RecordParts
from proxy.backends.redis.parts import store_unavailable as _unavailable
from proxy.backends.redis.synonyms import SynonymRecords
from proxy.backends.redis.tenants import TenantRecords
from proxy.backends.redis.users import UserRecords
from proxy.memory.records import ConversationRecord, Memory, Profile, to_iso, utcnow
from proxy.memory.store import (
    DEFAULT_PURGE_SECONDS,
    READ_TURN,
    AuditEvent,
    AuditFilter,
    Candidate,
    ChangeSet,
    ListQuery,
    PromptVersion,
    RecallCorpus,
    ScanQuery,
    SearchQuery,
    StoreUnavailableError,
    UserSettings,
    VectorUpdate,
    related_by_keywords,
)
from proxy.memory.text import query_terms
from proxy.memory.writes import scope_state_counts, state_counts
from proxy.settings import GLOBAL_NAMESPACE

log = structlog.get_logger("proxy.memory.redis")

# Seconds a user's switches may take to read (on the request path: the chat's learning
# header; tenant settings are bounded by proxy.tenants): one key read, sub-millisecond on
# a healthy Redis; a quarter second leaves room for a loaded one and bounds what a Redis
# that stopped answering costs each chat.
SETTINGS_READ_SECONDS = 0.25


class RedisMemoryStore(RecordParts):
    """:class:`~proxy.memory.store.MemoryStore` on one ``redis.asyncio`` client (RESP2,
    bytes — see :func:`proxy.backends.redis.client.connect`), which the caller owns and closes.

    ``key_prefix`` starts every key (``storage.key_prefix``); ``vector_dim`` is the
    embedding dimension of the vector index (``None``: keyword search only).
    """

    def __init__(self, client: Redis, *, key_prefix: str = "mp",
                 vector_dim: int | None = None,
                 index_build_wait_seconds: float = INDEX_BUILD_WAIT_SECONDS,
                 purge_seconds: float = DEFAULT_PURGE_SECONDS) -> None:
        require_resp2_bytes(client)
        self._redis = client
        self._keys = KeyLayout(key_prefix)
        self._index = MemoryIndex(client, self._keys, vector_dim,
                                  build_wait_seconds=index_build_wait_seconds)
        self._audit = AuditStreams(client, self._keys)
        self._users = UserRecords(client, self._keys)
        self._tenants = TenantRecords(client, self._keys)
        self._hashes = MemoryHashes(client, self._keys)
        self._conflicts = ConflictRecords(client, self._keys)
        self._injections = InjectionRecords(client, self._keys)
        self._changes = ChangeSetWriter(client, self._keys, hashes=self._hashes,
                                        users=self._users, audit=self._audit)
        self._erasure = Erasure(client, self._keys, index=self._index, users=self._users,
                                audit=self._audit)
        self._purge = AofPurge(client, self._keys, period=purge_seconds)
        self._turns = OneAtATime()
        self._generations = Generations(client, self._keys)
        self._prefetched = Prefetched(self._generations, self._keys)
        self._synonyms = SynonymRecords(client, self._keys)

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
            await self._index.ready()

    async def ping(self) -> None:
        with _unavailable("ping"):
            await self._redis.ping()
            await self._index.ready()

    async def maintain(self) -> None:
        """Nothing to do: the Query Engine merges and garbage-collects its own index."""

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
        # One command at a time per request (:data:`READ_TURN`, :class:`OneAtATime`): a
        # request's searches, profile and resident reads share one pool connection.
        with _unavailable("search"):
            async with self._turns.turn(READ_TURN.get()):
                await self._index.ready()
                keyword = await self._index.keyword(query.terms, where, query.limit) \
                    if query.terms and query.limit > 0 else []
                nearest = await self._index.nearest(vector, where, query.limit) \
                    if use_vector and vector is not None and query.limit > 0 else []
                keys = list(dict.fromkeys([h.key for h in keyword] + [h.key for h in nearest]))
                memories = dict(zip(keys, await self._hashes.fetch(keys), strict=True))
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

    def _recall_namespaces(self, tenant: str, user: str) -> list[str]:
        return [user_token(tenant, user), shared_token(tenant), shared_token(GLOBAL_NAMESPACE)]

    incremental_corpus = True  # from the change logs (MemoryStore)

    async def recall_generations(self, tenant: str, user: str) -> tuple[int, ...]:
        """In a request's turn, with its profile in the same round trip (:class:`~proxy.
        backends.redis.generations.Prefetched`)."""
        turn, namespaces = READ_TURN.get(), self._recall_namespaces(tenant, user)
        with _unavailable("recall_generations"):
            async with self._turns.turn(turn):
                if turn is None:
                    return await self._generations.read(namespaces)
                return await self._prefetched.generations(turn, tenant, user, namespaces)

    async def recall_corpus(self, tenant: str, user: str, *,
                            since: RecallCorpus | None = None) -> RecallCorpus:
        """With ``since``: only the memories the change logs name after its generations
        are read (:func:`~proxy.backends.redis.generations.refreshed_corpus`), taking
        this request's read turn; everything when the logs cannot tell."""
        namespaces = self._recall_namespaces(tenant, user)
        with _unavailable("recall_corpus"):
            if since is not None:
                async with self._turns.turn(READ_TURN.get()):
                    found = await refreshed_corpus(self._generations, self._keys,
                                                   self._hashes, namespaces, since)
                if found is not None:
                    return found
            return await recall_corpus(self._generations, self._index, self._hashes,
                                       namespaces)

    async def _bump(self, *namespaces: str) -> None:
        """Move the generations of ``namespaces`` after a write whose own transaction
        does not (the erasure module's sweeps and shared deletion)."""
        await self._hashes.changes.bump(*namespaces, client=self._redis)

    async def resident(
        self, tenant: str, user: str, *, limit: int, channels: tuple[str | None, ...] | None
    ) -> list[Memory]:
        if limit <= 0:
            return []
        where = all_of(namespace_filter([user_token(tenant, user)]), active_filter(),
                       tag_is("ix_about", "1"), channel_filter(channels))
        with _unavailable("resident"):
            async with self._turns.turn(READ_TURN.get()):
                await self._index.ready()
                return await self._hashes.load(await self._index.top_by_evidence(where,
                                                                                 limit))

    async def get_profile(self, tenant: str, user: str) -> Profile | None:
        """In a request's turn, with its recall generations in the same round trip."""
        turn = READ_TURN.get()
        with _unavailable("get_profile"):
            async with self._turns.turn(turn):
                if turn is None:
                    return await self._users.get_profile(tenant, user)
                raw = await self._prefetched.profile(
                    turn, tenant, user, self._recall_namespaces(tenant, user))
        return self._users.parsed_profile(tenant, user, raw)

    async def record_access(self, tenant: str, counts: Mapping[str, int], at: datetime) -> None:
        if not counts:
            return
        stamp = to_iso(at) or ""
        ids = list(counts)
        where = tag_is("ix_tenant", tenant_token(tenant)) & tag_is("ix_id", ids)
        with _unavailable("record_access"):
            await self._index.ready()
            rows = await self._index.find(where, offset=0, limit=2 * len(ids))
            if not rows:
                return
            await self._hashes.record_access(
                [(row["id"], counts[row["ix_id"]]) for row in rows], stamp)

    # management ------------------------------------------------------------------------
    async def get(self, tenant: str, user: str | None, memory_id: str) -> Memory | None:
        key = self._keys.memory(namespace_token(tenant, user), memory_id)
        with _unavailable("get"):
            found = await self._hashes.load([key])
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
            await self._index.ready()
            if not query.text and not query.after:
                rows = await self._index.find(where, offset=query.offset, limit=query.limit)
                return await self._hashes.load([r["id"] for r in rows])
            # A text filter or a cursor is applied over the namespace's rows.
            terms = [t.lower() for t in query_terms(
                query.text, limit=8, subwords=False) or [query.text]] if query.text else []
            keys = await self._index.matching(where, terms=terms, after=query.after)
            return await self._hashes.load(keys[query.offset:query.offset + query.limit])

    async def count(self, tenant: str, user: str) -> dict[str, int]:
        with _unavailable("count"):
            await self._index.ready()
            groups = await self._index.state_counts(
                namespace_filter([user_token(tenant, user)]))
        return state_counts(groups)

    async def add(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        await terms_ready([memory])
        ns = namespace_token(memory.tenant, memory.user_id)
        events = [audit] if audit is not None else []
        with _unavailable("add"):
            async with self._redis.pipeline(transaction=True) as pipe:
                self._hashes.queue_upsert(pipe, memory)
                self._audit.queue(pipe, events, ns)
                await pipe.execute()
            await self._audit.append(events, written_ns=ns)
        return memory

    async def update(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        await terms_ready([memory])
        ns = namespace_token(memory.tenant, memory.user_id)
        key = self._keys.memory(ns, memory.id)
        events = [audit] if audit is not None else []

        async def body(pipe: Pipeline) -> None:
            if not await pipe.exists(key):
                raise KeyError(memory.id)
            multi(pipe)
            self._hashes.queue_upsert(pipe, memory)
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
            self._hashes.changes.queue(pipe, ns, [memory_id])
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
            ids = [as_text(i) for i in await pipe.smembers(ids_key)]
            conversations = [as_text(c) for c in await pipe.smembers(convs_key)]
            multi(pipe)
            doomed = [self._keys.profile(ns), ids_key, convs_key, self._keys.summaries(ns),
                      self._keys.facts(ns)]
            # Derived from the memories and the profile (docs/design.md#deletion).
            doomed += [self._keys.conflicts(ns), self._keys.profile_history(ns)]
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
            swept = await self._erasure.sweep(ns)
            if swept:
                await self._bump(ns)
        return removed + swept

    # learning --------------------------------------------------------------------------
    async def related(self, tenant: str, user: str, text: str, *, limit: int) -> list[Memory]:
        return await related_by_keywords(self, tenant, user, text, limit=limit)

    async def apply(self, changes: ChangeSet) -> bool:
        with _unavailable("apply"):
            return await self._changes.apply(changes)

    async def scan(self, query: ScanQuery) -> list[Memory]:
        parts: list[FilterExpression] = [Tag("ix_user") != SHARED_USER]
        if query.tenant is not None:
            parts.append(tag_is("ix_tenant", tenant_token(query.tenant)))
        if query.user is not None and query.tenant is not None:
            parts.append(namespace_filter([user_token(query.tenant, query.user)]))
        if query.channel is not None:
            parts.append(tag_is("ix_chan", channel_token(query.channel)))
        if query.source is not None:
            parts.append(tag_is("source", query.source))
        if query.created_before is not None:
            parts.append(Num("ix_created") < query.created_before.timestamp())
        with _unavailable("scan"):
            await self._index.ready()
            rows = await self._index.find(all_of(*parts), offset=0, limit=query.limit,
                                          oldest_first=True)
            memories = await self._hashes.load([r["id"] for r in rows])
        if query.user is not None:
            memories = [m for m in memories if m.user_id == query.user]
        if query.never_accessed:
            memories = [m for m in memories if m.access_count == 0]
        # Ids are ULIDs (creation order) for everything the gateway writes; created_at
        # decides for records imported with their own times.
        return sorted(memories, key=lambda m: (m.created_at, m.id))


    async def bind_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        with _unavailable("bind_names"):
            await self._users.bind_names(tenant, user, names)

    async def users_named(self, tenant: str, name: str) -> list[str]:
        with _unavailable("users_named"):
            return await self._users.users_named(tenant, name)

    async def names_of(self, tenant: str, user: str) -> list[str]:
        with _unavailable("names_of"):
            return await self._users.names_of(tenant, user)

    async def save_prompt(self, tenant: str, kind: str, text: str, actor: str,
                          at: datetime) -> PromptVersion:
        with _unavailable("save_prompt"):
            return await self._tenants.save_prompt(tenant, kind, text=text, actor=actor,
                                                   at=at)

    async def prompt_versions(self, tenant: str, kind: str, *,
                              limit: int = 20) -> list[PromptVersion]:
        with _unavailable("prompt_versions"):
            return await self._tenants.prompt_versions(tenant, kind, limit=limit)

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
        """Read on the request path: under :data:`SETTINGS_READ_SECONDS`."""
        with _unavailable("get_user_settings"):
            async with within(SETTINGS_READ_SECONDS, "store get_user_settings"):
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

    # admin governance --------------------------------------------------------------------
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
            await self._index.ready()
            groups = await self._index.scope_counts(tag_is("ix_tenant", tenant_token(tenant)))
        return scope_state_counts(groups)


    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        """Bounded by its caller (:class:`proxy.tenants.TenantSettings`)."""
        with _unavailable("get_tenant_settings"):
            return await self._tenants.get_settings(tenant)

    async def put_tenant_settings(self, tenant: str, overrides: Mapping[str, object]
                                  ) -> None:
        with _unavailable("put_tenant_settings"):
            await self._tenants.put_settings(tenant, overrides)

    async def change_tenant_settings(
        self, tenant: str, change: Callable[[dict[str, object]], dict[str, object]]
    ) -> tuple[dict[str, object], dict[str, object]]:
        with _unavailable("change_tenant_settings"):
            return await self._tenants.change_settings(tenant, change)

    # erasure -----------------------------------------------------------------------------
    async def erase_user(self, tenant: str, user: str, *, audit: AuditEvent) -> int:
        with _unavailable("erase_user"):
            await self._synonyms.erase_user(tenant, user)
            removed = await self._erasure.erase_user(tenant, user, audit=audit)
            await self._bump(user_token(tenant, user))  # what its sweep removed too
            await self._purge.owe()
        try:
            await self.purge_erased()
        except StoreUnavailableError as exc:  # owed still: the periodic purge retries
            log.warning("redis_erasure_purge_failed", error=str(exc)[:300])
        return removed

    async def purge_erased(self) -> bool:
        """:meth:`~proxy.memory.store.MemoryStore.purge_erased`: an AOF rewrite
        (:class:`~proxy.backends.redis.erasure.AofPurge`)."""
        with _unavailable("purge_erased"):
            return await self._purge.run()

    async def delete_shared(self, tenant: str, memory_id: str, *,
                            audit: AuditEvent | None = None) -> bool:
        with _unavailable("delete_shared"):
            deleted = await self._erasure.delete_shared(tenant, memory_id, audit=audit)
            if deleted:
                await self._bump(shared_token(tenant))
        return deleted

    # vectors kept consistent with the embedder (memory-proxy reindex) -------------------
    async def stale_vectors(self, model: str, *, limit: int,
                            cursor: str = "") -> tuple[list[Memory], str]:
        with _unavailable("stale_vectors"):
            return await self._hashes.stale_vectors(model, limit=limit, cursor=cursor)

    async def set_vectors(self, updates: Sequence[VectorUpdate]) -> int:
        written = 0
        for u in updates:
            with _unavailable("set_vectors"):
                written += await self._hashes.set_vector(u)
        return written

