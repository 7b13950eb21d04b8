"""The storage contract every backend implements (SQLite embedded, Redis).

All reads and writes are scoped by namespace: a (tenant, user) pair, plus the tenant's
shared/system space where a call says so. No method returns another user's memories
(docs/design.md#identity). Backends raise :class:`StoreUnavailableError` when their server
or file fails, so callers can degrade memory without breaking chat.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from proxy.errors import MemoryProxyError, ProxyError
from proxy.memory.explain import InjectionRecord
from proxy.memory.records import ConversationRecord, Memory, Profile
from proxy.memory.text import load_segmenter_for, normalize, query_terms


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


@dataclass(frozen=True, slots=True)
class Candidate:
    """A memory found by recall with its per-method ranks (1 = best) and raw scores."""

    memory: Memory
    keyword_rank: int | None = None
    keyword_score: float | None = None
    vector_rank: int | None = None
    vector_score: float | None = None


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
    tenants), optionally one user, one ``source_channel``, created before a time, never
    accessed. Oldest first."""

    tenant: str | None = None
    user: str | None = None
    channel: str | None = None
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


class MemoryStore(Protocol):
    """Storage of memories, profiles, per-user settings and the audit log."""

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
    async def record_injections(self, records: Sequence[InjectionRecord], *, now: datetime,
                                retention: timedelta, per_user: int) -> None:
        """Store ``records`` (each under its own tenant and user), then drop every record
        of those users older than ``now - retention`` and all but their newest
        ``per_user``. Raises :class:`StoreUnavailableError`."""
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
        """Delete every personal memory and the profile of (tenant, user); records
        ``cleared_at`` so that learning queued before now is discarded
        (docs/design.md#deletion)."""
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


# Concurrent learning -------------------------------------------------------------------
# Several workers may consolidate batches of one user at once, each from what it read
# before the other wrote. The backends' ``apply`` makes that safe with the two rules below,
# inside their transaction (SQLite: the write lock; Redis: WATCH on the user's keys):
# hits of stored memories are the stored count plus each evidence pair this change set adds
# that was not stored yet (never a count read earlier), and a new active memory whose
# :func:`fact_key` equals an active stored one of the same user is merged into it instead
# of written as a second row.


def fact_key(memory: Memory) -> str:
    """The uniqueness key of an active memory within its user: its scope, normalised
    subject and normalised content, as 32 hex digits of SHA-256."""
    seed = "\x1f".join((memory.scope, normalize(memory.subject), normalize(memory.content)))
    return hashlib.sha256(seed.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    """What a backend's ``apply`` writes (see :func:`plan_apply`)."""

    upserts: tuple[Memory, ...]
    evidence: tuple[tuple[str, str], ...]
    # Stored memories whose ``hits`` grow by one per evidence pair the store did not hold.
    counted: frozenset[str]
    audit: tuple[AuditEvent, ...]


def plan_apply(changes: ChangeSet, upserts: Sequence[Memory], *,
               stored_hits: Mapping[str, int],
               duplicates: Mapping[str, Memory]) -> ApplyPlan:
    """The writes of one change set, given what the store holds now.

    ``upserts``: the change set's memories still wanted; ``stored_hits``: memory id →
    hits as stored now, for those of ``upserts`` already stored; ``duplicates``: id of a
    new memory → the active stored memory with the same :func:`fact_key` (found by the
    backend). A stored memory keeps its stored hits (the backend adds the new evidence);
    one without evidence in this change set keeps the larger of both counts. A duplicate
    is not written: the stored memory is refreshed (``last_seen_at``, ``updated_at``,
    score, tags) and takes its evidence, audit entries and ``superseded_by`` references.
    """
    redirect = {new: stored.id for new, stored in duplicates.items()}
    with_evidence = {mid for mid, _ in changes.evidence}
    out: dict[str, Memory] = {}
    for given in upserts:
        target = duplicates.get(given.id)
        if target is not None:
            base = out.get(target.id, target)
            out[target.id] = base.with_changes(
                last_seen_at=max(base.last_seen_at, given.last_seen_at),
                updated_at=max(base.updated_at, given.updated_at),
                score=max(base.score, given.score),
                tags=tuple(dict.fromkeys((*base.tags, *given.tags)))[:20])
            continue
        memory = given
        if memory.superseded_by in redirect:
            memory = memory.with_changes(superseded_by=redirect[memory.superseded_by])
        stored = stored_hits.get(memory.id)
        if stored is not None:
            hits = stored if memory.id in with_evidence else max(stored, memory.hits)
            memory = memory.with_changes(hits=hits)
        if memory.id in out:  # a duplicate refreshed it already: keep the refreshed times
            memory = memory.with_changes(last_seen_at=out[memory.id].last_seen_at)
        out[memory.id] = memory
    evidence = tuple(dict.fromkeys((redirect.get(mid, mid), key)
                                   for mid, key in changes.evidence))
    audit = tuple(replace(e, memory_id=redirect[e.memory_id])
                  if e.memory_id in redirect else e for e in changes.audit)
    counted = frozenset(stored_hits) | frozenset(d.id for d in duplicates.values())
    return ApplyPlan(upserts=tuple(out.values()), evidence=evidence, counted=counted,
                     audit=audit)


def state_counts(groups: Iterable[Sequence[Any]]) -> dict[str, int]:
    """Fold ``(category, enabled, retired, n)`` groups into the counts of
    :meth:`MemoryStore.count`: ``{"total": active, "retired", "disabled", <category>:
    active}`` (a retired memory counts as retired whether enabled or not)."""
    counts = {"total": 0, "retired": 0, "disabled": 0}
    for category, enabled, retired, n in groups:
        amount = int(n)
        if retired:
            counts["retired"] += amount
        elif not enabled:
            counts["disabled"] += amount
        else:
            counts["total"] += amount
            counts[str(category)] = counts.get(str(category), 0) + amount
    return counts


def scope_state_counts(groups: Iterable[Sequence[Any]]) -> dict[str, dict[str, int]]:
    """:func:`state_counts` per scope, from ``(scope, category, enabled, retired, n)``
    groups (:meth:`MemoryStore.tenant_counts`)."""
    by_scope: dict[str, list[Sequence[Any]]] = {}
    for group in groups:
        by_scope.setdefault(str(group[0]), []).append(group[1:])
    return {scope: state_counts(rows) for scope, rows in by_scope.items()}

