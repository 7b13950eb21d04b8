"""What the backends share when they write: the rules that make concurrent learning safe
(:func:`plan_apply`, :func:`fact_key`) and the folding of grouped counts
(:func:`state_counts`). Pure functions over the store contract's records
(:mod:`proxy.memory.store`); each backend runs them inside its own transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.memory.conflicts import Conflict
from proxy.memory.records import Memory
from proxy.memory.store import AuditEvent, ChangeSet
from proxy.memory.text import normalize

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
    conflicts: tuple[Conflict, ...] = ()


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
    conflicts = tuple(
        replace(c, retired_id=redirect.get(c.retired_id, c.retired_id),
                successor_id=redirect.get(c.successor_id, c.successor_id))
        for c in changes.conflicts)
    # A conflict needs both memories: one of a new memory the user deleted meanwhile goes.
    conflicts = tuple(c for c in conflicts if c.retired_id != c.successor_id
                      and {c.retired_id, c.successor_id} <= (set(out) | set(stored_hits)))
    return ApplyPlan(upserts=tuple(out.values()), evidence=evidence, counted=counted,
                     audit=audit, conflicts=conflicts)


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

