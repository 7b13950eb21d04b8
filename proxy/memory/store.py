"""The storage contract every backend implements (SQLite embedded, Redis).

All reads and writes are scoped by namespace: a (tenant, user) pair, plus the tenant's
shared/system space where a call says so. No method returns another user's memories
(docs/design.md#identity). Backends raise :class:`StoreUnavailableError` when their server
or file fails, so callers can degrade memory without breaking chat.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Protocol

from proxy.errors import MemoryProxyError, ProxyError
from proxy.memory.conflicts import Conflict, ProfileWeek
from proxy.memory.explain import InjectionRecord, RecordRow
from proxy.memory.records import ConversationRecord, Memory, Profile, Source
from proxy.memory.synonyms import SynonymStore
from proxy.memory.text import load_segmenter_for, query_terms


class StoreUnavailableError(MemoryProxyError):
    """The memory store cannot be reached or failed; memory degrades, chat goes on. A
    request that needs the store is answered 503 ``store_unavailable`` with Retry-After 5
    (seconds: long enough for a locked SQLite file or a Redis restart)."""

    log_event = "memory_store_unavailable"

    def reply(self) -> ProxyError:
        return ProxyError(
            "The memory store is unavailable; try again shortly.", status_code=503,
            error_type="service_unavailable", code="store_unavailable",
            headers={"Retry-After": "5"},
        )


# The reads one request starts at once (profile, searches, resident memories) carry one
# token: a backend whose connections are pooled may run reads of the same token one after
# another, so a request holds one connection at a time while different requests run side
# by side. ``None`` (a read outside a request's recall): no turn is taken.
READ_TURN: ContextVar[object | None] = ContextVar("memory_proxy_read_turn", default=None)


class StoreBusyError(StoreUnavailableError):
    """The store is reachable but had no free connection within its bounded wait."""


# storage.erasure_purge_seconds' default (proxy/settings/storage.py): at most one purge of
# erased data every 10 minutes.
DEFAULT_PURGE_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """A hot-path recall query over active (enabled, non-retired) memories.

    ``terms``: keyword terms from :func:`proxy.memory.text.query_terms`;
    ``embedding``: query vector when an embedder is configured;
    ``channels``: restrict personal memories by ``source_channel`` (``None`` = any);
    ``include_shared``: also search the tenant's shared memories and the system memories
    of the global namespace (:data:`~proxy.settings.GLOBAL_NAMESPACE`).
    """

    tenant: str
    user: str
    terms: tuple[str, ...]
    limit: int = 30
    embedding: tuple[float, ...] | None = None
    channels: tuple[str | None, ...] | None = None
    include_shared: bool = True
    # The vector search only compares vectors of this model (and legacy vectors stored
    # without a model id); ``None`` = any model of the query's dimension.
    embedding_model: str | None = None


@dataclass(slots=True)
class Candidate:
    """A memory found by recall with its per-method ranks (1 = best) and raw scores.

    Not frozen, but never changed once built: recall builds one per hit of every query
    (~60 a request), and a frozen dataclass's ``__init__`` costs four times a plain
    one's (0.61 vs 0.15 µs with five fields, CPython 3.11)."""

    memory: Memory
    keyword_rank: int | None = None
    keyword_score: float | None = None
    vector_rank: int | None = None
    vector_score: float | None = None


@dataclass(frozen=True, slots=True)
class Bm25:
    """A store's keyword scorer (Okapi BM25), so the in-process recall index
    (:mod:`proxy.memory.index`) scores as the store's own search does.

    ``idf_form``: ``"fts5"`` — ln((N − n + ½)/(n + ½)), at least 1e-6 (SQLite FTS5's
    ``bm25()``) — or ``"plus_one"`` — ln(1 + (N − n + ½)/(n + ½)) (RediSearch's
    ``BM25STD``); ``extra_length``: tokens a document holds beside its terms (SQLite's
    namespace column counts in its length: 1)."""

    k1: float = 1.2
    b: float = 0.75
    idf_form: Literal["fts5", "plus_one"] = "fts5"
    extra_length: int = 0

    def idf(self, documents: int, matching: int) -> float:
        """IDF of a term found in ``matching`` of ``documents`` documents."""
        ratio = (documents - matching + 0.5) / (matching + 0.5)
        if self.idf_form == "plus_one":
            return math.log(1.0 + ratio)
        value = math.log(ratio) if ratio > 0 else 0.0
        return value if value > 0 else 1e-6


@dataclass(frozen=True, slots=True)
class KeywordStatistics:
    """BM25 statistics of a store's whole keyword index, as its scorer uses them:
    ``documents`` indexed, ``total_length`` of all their lengths, and per term of the
    corpus the number of documents holding it."""

    documents: int
    total_length: int
    frequencies: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class RecallCorpus:
    """What chat recall searches for one (tenant, user) — the user's active memories,
    the tenant's shared and the system ones — as of ``generations``
    (:meth:`MemoryStore.recall_generations`, read before or with the memories), with the
    store's keyword scorer and the vector dimension it searches (``None``: any).
    ``statistics``: the store's own BM25 statistics when its scorer uses the whole index
    (SQLite); ``None``: the corpus's own."""

    generations: tuple[int, ...]
    memories: tuple[Memory, ...]
    bm25: Bm25
    vector_dim: int | None = None
    statistics: KeywordStatistics | None = None


@dataclass(frozen=True, slots=True)
class ListQuery:
    """Management listing of one user's memories (newest first)."""

    tenant: str
    user: str
    include_retired: bool = False
    include_disabled: bool = True
    category: str | None = None
    text: str | None = None
    limit: int = 100
    offset: int = 0
    # ``enabled`` keeps only enabled (True) or disabled (False) memories;
    # ``source`` one source; ``after`` is a cursor: only ids below it (ids are ULIDs, so
    # "older than that memory"); ``scope`` "shared"/"system" lists the tenant's memories of
    # that scope (no user) instead of the user's.
    enabled: bool | None = None
    source: str | None = None
    after: str | None = None
    scope: Literal["personal", "shared", "system"] = "personal"


@dataclass(frozen=True, slots=True)
class UserSettings:
    """Per-user switches (docs/design.md#learning-switches)."""

    enable_personal_learning: bool = True
    show_learning_indicator: bool = True
    cleared_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One learning-log row (docs/design.md#audit)."""

    tenant: str
    user_id: str | None
    action: Literal[
        "scored", "skipped", "extracted", "created", "merged", "retired", "edited",
        "deleted", "cleared", "promoted", "evicted", "purged", "failed", "rejected",
        "profile_updated", "settings_changed", "disabled", "enabled", "imported", "erased",
        "searched", "viewed",  # reads through the MCP tools (search_memories, get_profile)
        "conflict_opened", "conflict_confirmed", "conflict_reversed",  # docs/design.md#conflicts
    ]
    actor: Literal["auto", "user", "admin"]
    at: datetime
    conversation_id: str | None = None
    memory_id: str | None = None
    reason: str = ""
    detail: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """Everything one learning batch changes, applied atomically and at most once.

    ``batch_key`` makes the apply idempotent: a redelivered batch is a no-op.
    ``upserts`` are whole records after consolidation; ``evidence`` lists the
    (memory id, evidence key) pairs this batch adds — a pair already stored does not count
    again, so hits grow once per distinct source (docs/design.md#evidence).
    ``learned_from`` is when the batch's oldest message was said: the store checks, inside
    the same transaction, that the user did not clear their memory since (then nothing is
    applied) and drops new memories whose text the user deleted since (a deletion
    that races a learning job in flight still wins: docs/design.md#deletion).
    """

    tenant: str
    user_id: str
    batch_key: str
    upserts: tuple[Memory, ...] = ()
    evidence: tuple[tuple[str, str], ...] = ()
    profile: Profile | None = None
    conversation: ConversationRecord | None = None
    audit: tuple[AuditEvent, ...] = ()
    deletes: tuple[str, ...] = ()
    learned_from: datetime | None = None
    # Conflicts written (insert or replace by id; docs/design.md#conflicts), kept only
    # while both of their memories are written or stored; ``snapshot``: the week of the
    # profile over time this batch writes (the user's oldest weeks beyond
    # :data:`~proxy.memory.conflicts.HISTORY_WEEKS` are dropped).
    conflicts: tuple[Conflict, ...] = ()
    snapshot: ProfileWeek | None = None


@dataclass(frozen=True, slots=True)
class VectorUpdate:
    """A vector for one memory (:meth:`MemoryStore.set_vectors`): ``content`` is the text
    it was computed from, ``model`` the embedder's model id."""

    tenant: str
    user_id: str | None
    memory_id: str
    content: str
    embedding: tuple[float, ...]
    model: str


@dataclass(frozen=True, slots=True)
class ScanQuery:
    """Maintenance listing across users (quotas, retention): memories of a tenant (or all
    tenants), optionally one user, one ``source_channel``, one ``source`` (``auto``:
    learned ones only), created before a time, never accessed. Oldest first."""

    tenant: str | None = None
    user: str | None = None
    channel: str | None = None
    source: Source | None = None
    created_before: datetime | None = None
    never_accessed: bool = False
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class PromptVersion:
    """One saved version of an admin-edited learning prompt (``text`` empty = back to the
    configured / built-in prompt)."""

    tenant: str
    kind: Literal["scoring", "extraction"]
    version: int
    text: str
    actor: str
    at: datetime


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Filters of ``GET /v1/admin/audit`` (all optional, combined with AND): one user, one
    action, one actor (``auto``/``user``/``admin``), one conversation, and events at or
    after ``since`` / before ``until``."""

    user: str | None = None
    action: str | None = None
    actor: str | None = None
    conversation: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def matches(self, event: AuditEvent) -> bool:
        """Whether ``event`` passes every filter (backends that filter in Python)."""
        return ((self.user is None or event.user_id == self.user)
                and (self.action is None or event.action == self.action)
                and (self.actor is None or event.actor == self.actor)
                and (self.conversation is None or event.conversation_id == self.conversation)
                and (self.since is None or event.at >= self.since)
                and (self.until is None or event.at < self.until))


class MemoryStore(SynonymStore, Protocol):
    """Storage of memories, profiles, per-user settings and the audit log."""

    # True when ``recall_corpus(since=...)`` reads only what changed since: a recall whose
    # index is behind then refreshes it before searching; otherwise it searches the store
    # and the index rebuilds in the background (docs/design.md#recall-index).
    incremental_corpus: bool

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` when the store cannot serve requests."""
        ...

    async def maintain(self) -> None:
        """Periodic upkeep of the search index (``storage.index_maintenance_seconds``), off
        the request path; a no-op where the engine keeps its own index compact."""
        ...

    # hot path --------------------------------------------------------------
    async def search(self, query: SearchQuery) -> list[Candidate]:
        """Keyword (and vector, when ``query.embedding``) candidates, best first."""
        ...

    async def recall_generations(self, tenant: str, user: str) -> tuple[int, ...]:
        """The write generations of the owners chat recall reads for (tenant, user) —
        the user, the tenant's shared space, the system memories — in that order: one
        small read. Each moves on every write of an owner's memories other than access
        statistics, in the write's own transaction, and never returns to a value it had."""
        ...

    async def recall_corpus(self, tenant: str, user: str, *,
                            since: RecallCorpus | None = None) -> RecallCorpus:
        """Every active memory chat recall may return for (tenant, user) and the
        generations they are at (see :class:`RecallCorpus`). ``since``: a corpus this
        store returned for the same (tenant, user) before; a store that knows which
        memories changed after its generations reads only those and keeps the rest (the
        unchanged memories are ``since``'s own objects), others read everything."""
        ...

    async def resident(
        self, tenant: str, user: str, *, limit: int, channels: tuple[str | None, ...] | None
    ) -> list[Memory]:
        """Top active personal memories about the user by (hits, last_seen_at) desc."""
        ...

    async def get_profile(self, tenant: str, user: str) -> Profile | None: ...

    async def record_access(self, tenant: str, counts: Mapping[str, int], at: datetime) -> None:
        """``access_count += n`` and ``last_access_at = at`` for each injected memory id."""
        ...

    # injection records (docs/design.md#injection-records) --------------------------------
    async def record_injections(self, records: Sequence[RecordRow], *, now: datetime,
                                retention: timedelta, per_user: int) -> None:
        """Store ``records`` — each in its written form (:func:`proxy.memory.explain.row`),
        under its own tenant and user — then drop every record of those users older than
        ``now - retention`` and all but their newest ``per_user``. Raises
        :class:`StoreUnavailableError`."""
        ...

    async def get_injection(self, tenant: str, user: str, injection_id: str, *,
                            since: datetime) -> InjectionRecord | None:
        """The record ``injection_id`` of (tenant, user) created at or after ``since``;
        ``None`` for one of another user or tenant, an older one, or none."""
        ...

    # management ------------------------------------------------------------
    async def get(self, tenant: str, user: str | None, memory_id: str) -> Memory | None:
        """One memory of (tenant, user) — or of the tenant's shared space when ``user`` is
        ``None`` — or ``None`` when it does not exist there."""
        ...

    async def list_memories(self, query: ListQuery) -> list[Memory]: ...

    async def count(self, tenant: str, user: str) -> dict[str, int]:
        """Active memory counts per category, plus ``"total"`` and ``"retired"``."""
        ...

    async def add(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory: ...

    async def update(self, memory: Memory, *, audit: AuditEvent | None = None) -> Memory:
        """Replace a stored memory (same id and namespace). Raises ``KeyError`` if absent."""
        ...

    async def delete(
        self, tenant: str, user: str, memory_id: str, *, audit: AuditEvent | None = None
    ) -> bool:
        """Hard-delete one memory and its index entries; leaves a tombstone so that
        learning queued earlier does not bring it back (docs/design.md#deletion)."""
        ...

    async def clear(self, tenant: str, user: str, *, audit: AuditEvent | None = None) -> int:
        """Delete every personal memory and the profile of (tenant, user) with what was
        derived from them — the user's conflicts and weekly profile snapshots; records
        ``cleared_at`` so that learning queued before now is discarded. Returns the number
        of memories deleted (docs/design.md#deletion)."""
        ...

    # learning --------------------------------------------------------------
    async def related(self, tenant: str, user: str, text: str, *, limit: int) -> list[Memory]:
        """Active memories of the user most related to ``text`` (keyword, then evidence)."""
        ...

    async def apply(self, changes: ChangeSet) -> bool:
        """Apply a learning batch atomically. ``False`` when ``batch_key`` was applied
        before, or the user cleared their memory after ``learned_from`` (nothing changes)."""
        ...

    async def scan(self, query: ScanQuery) -> list[Memory]:
        """Memories for maintenance (see :class:`ScanQuery`), personal ones only."""
        ...

    async def tombstoned(self, tenant: str, user: str, norms: Sequence[str]) -> dict[str, datetime]:
        """Deletion times of the given normalised contents that the user deleted."""
        ...

    async def put_profile(self, profile: Profile) -> None: ...

    async def get_conversation(
        self, tenant: str, user: str, conversation_id: str
    ) -> ConversationRecord | None: ...

    async def bind_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        """Record that ``user`` goes by these display names (the OpenAI ``name`` field of
        their own messages) — the directory group learning resolves speakers with."""
        ...

    async def users_named(self, tenant: str, name: str) -> list[str]:
        """Users of the tenant known by ``name`` (case- and width-insensitive)."""
        ...

    async def names_of(self, tenant: str, user: str) -> list[str]:
        """The display names (normalised) bound to ``user``, sorted: what erasure looks
        for in group buffers. Redis lists names bound since this was kept."""
        ...

    async def get_user_settings(self, tenant: str, user: str) -> UserSettings: ...

    async def put_user_settings(self, tenant: str, user: str, settings: UserSettings) -> None: ...

    async def audit(self, events: Sequence[AuditEvent]) -> None: ...

    async def save_prompt(self, tenant: str, kind: str, text: str, actor: str,
                          at: datetime) -> PromptVersion:
        """Store a new version of a tenant's prompt (numbered from 1)."""
        ...

    async def prompt_versions(self, tenant: str, kind: str, *,
                              limit: int = 20) -> list[PromptVersion]:
        """The tenant's versions of a prompt, newest first."""
        ...

    async def audit_log(
        self, tenant: str, user: str | None, *, limit: int = 100, before_id: int | None = None
    ) -> list[tuple[int, AuditEvent]]: ...

    # conflicts and the profile over time (docs/design.md#conflicts) ---------------------
    async def list_conflicts(self, tenant: str, user: str, *, statuses: frozenset[str],
                             limit: int = 500) -> list[Conflict]:
        """The user's conflicts whose status is in ``statuses``, newest first."""
        ...

    async def list_tenant_conflicts(self, tenant: str, *, statuses: frozenset[str],
                                    limit: int = 500) -> list[Conflict]:
        """The conflicts whose status is in ``statuses`` of every user of ``tenant`` (each
        carrying its ``user_id``; no other tenant's), newest first, at most ``limit``.
        Redis reads the users of the tenant's users index (those who chatted or wrote
        memories: ``Ledger.users``)."""
        ...

    async def get_conflict(self, tenant: str, user: str,
                           conflict_id: str) -> Conflict | None: ...

    async def profile_history(self, tenant: str, user: str) -> list[ProfileWeek]:
        """The user's stored weekly profile snapshots, oldest first."""
        ...

    # erasure ------------------------------------------------------------------------
    async def erase_user(self, tenant: str, user: str, *, audit: AuditEvent) -> int:
        """"Forget me": delete everything stored about (tenant, user) — memories (retired
        too) with their embeddings, evidence and deletion tombstones, the profile,
        conversation records and summaries, applied-batch keys, name bindings and the
        user's audit events (in the tenant's log too) — then keep only a content-free
        erasure marker (``UserSettings`` at defaults with ``cleared_at`` = now, so a
        learning batch already claimed writes nothing back, see :class:`ChangeSet`) and
        ``audit`` as the one tombstone event. Returns the number of memories deleted.
        Other users and the tenant's shared memories are untouched."""
        ...

    async def purge_erased(self) -> bool:
        """Make erased data leave the database files (docs/design.md#erasure), at most once
        per ``storage.erasure_purge_seconds`` and only when an erasure owes it: SQLite
        merges the keyword index and truncates the WAL, Redis rewrites its AOF
        (``BGREWRITEAOF``; a server that refuses it is logged once and the erasure stands).
        :meth:`erase_user` calls it; the gateway calls it periodically for the erasures
        whose purge had to wait. Whether a purge ran (Redis: was started)."""
        ...


    # admin governance ----------------------------------------------------------------
    async def audit_search(self, tenant: str, where: AuditFilter, *, limit: int = 100,
                           before_id: int | None = None) -> list[tuple[int, AuditEvent]]:
        """The tenant's learning log filtered by ``where``, newest first, at most ``limit``
        events with ids below the cursor ``before_id``."""
        ...

    async def audit_counts(self, tenant: str, *, since: datetime
                           ) -> dict[tuple[str, str, str], int]:
        """Events of the tenant's log at or after ``since``, counted per
        ``(UTC day YYYY-MM-DD, action, actor)``."""
        ...

    async def tenant_counts(self, tenant: str) -> dict[str, dict[str, int]]:
        """The tenant's memories per scope (``personal``, ``shared``, ``system`` — system
        only for the global namespace), each ``{"total": active, "retired", "disabled",
        <category>: active}``."""
        ...

    async def get_tenant_settings(self, tenant: str) -> dict[str, object]:
        """The tenant's run-time settings overrides (dotted name → value), ``{}`` if none."""
        ...

    async def put_tenant_settings(self, tenant: str, overrides: Mapping[str, object]
                                  ) -> None:
        """Replace the tenant's run-time settings overrides."""
        ...

    async def change_tenant_settings(
        self, tenant: str, change: Callable[[dict[str, object]], dict[str, object]]
    ) -> tuple[dict[str, object], dict[str, object]]:
        """Replace the tenant's overrides with ``change(current)`` atomically: no other
        write of them lands between the read and the write, so two concurrent changes
        (two accepted synonyms, two settings patches) both stay. SQLite: one write
        transaction; Redis: ``WATCH``/``MULTI``, ``change`` called again on the new value
        when another writer came first. ``change`` must be pure (it may run more than
        once); what it raises propagates and nothing is written. Returns ``(before,
        after)``."""
        ...

    async def delete_shared(self, tenant: str, memory_id: str, *,
                            audit: AuditEvent | None = None) -> bool:
        """Hard-delete one memory of the tenant's shared space (no user: shared memories,
        or system ones in the global namespace) with its index entries; ``False`` when no
        such memory is there."""
        ...

    # vectors kept consistent with the embedder (memory-proxy reindex) -------------------
    async def stale_vectors(self, model: str, *, limit: int,
                            cursor: str = "") -> tuple[list[Memory], str]:
        """One page of a walk over every tenant's active memories (personal and shared):
        those without a vector of ``model`` — none at all, one of another model, or one
        stored without a model id — and the cursor of the next page (``""``: the walk is
        over). A page looks at about ``limit`` memories, so it may hold none that are
        stale while the cursor goes on; a memory may come twice (re-embedding is
        idempotent). Start with ``cursor=""``."""
        ...

    async def set_vectors(self, updates: Sequence[VectorUpdate]) -> int:
        """Store each update's vector and model id on its memory when the memory still
        exists with the content the vector was computed from (else skipped: whoever
        changed it stores a new vector). ``updated_at`` and the audit log are unchanged.
        Returns how many were written."""
        ...


async def related_by_keywords(
    store: MemoryStore, tenant: str, user: str, text: str, *, limit: int
) -> list[Memory]:
    """The backends' shared :meth:`MemoryStore.related`: the user's active memories that
    keyword search finds for ``text`` (best first), topped up with their resident memories
    (most evidence, then most recent) up to ``limit``."""
    if limit <= 0:
        return []
    await load_segmenter_for(text)
    found = await store.search(SearchQuery(
        tenant=tenant, user=user, terms=tuple(query_terms(text)), limit=limit,
        include_shared=False,
    ))
    memories = [c.memory for c in sorted(found, key=lambda c: c.keyword_rank or 0)]
    if len(memories) < limit:
        seen = {m.id for m in memories}
        for memory in await store.resident(tenant, user, limit=limit, channels=None):
            if memory.id not in seen and len(memories) < limit:
                memories.append(memory)
    return memories
