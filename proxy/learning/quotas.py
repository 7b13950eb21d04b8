"""Which memories go when a quota is exceeded (pure; docs/design.md#quotas).

Quotas: ``max_memory_per_user`` (500) per user, 40 facts per other person a user talks
about, 200 facts per group. Over a quota, retired memories go first (oldest retirement
first: they are kept for audit, not for recall), then active ones by lowest value:

    value = quality score + evidence strength + recency     (each in [0, 1])

with the same evidence and recency curves recall ranks by (``proxy.memory.recall``), and
manual memories never evicted while a learned one can go. Retention: memories older than
``retention_days`` that were never injected (``access_count == 0``) are purged.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from proxy.memory.recall import evidence_strength, recency
from proxy.memory.records import Memory

FACTS_PER_PERSON = 40  # facts per other person: docs/design.md#quotas
FACTS_PER_GROUP = 200  # long-term facts per group: docs/design.md#quotas
RECENCY_HALF_LIFE_DAYS = 30.0


def value(memory: Memory, now: datetime) -> float:
    """How much a memory is worth keeping (higher = keep)."""
    return (max(0.0, min(1.0, memory.score)) + evidence_strength(memory.hits)
            + recency(memory.last_seen_at, now, RECENCY_HALF_LIFE_DAYS))


def _victim_order(memories: Iterable[Memory], now: datetime) -> list[Memory]:
    retired = sorted((m for m in memories if not m.active),
                     key=lambda m: (m.superseded_at or m.updated_at, m.id))
    active = sorted((m for m in memories if m.active),
                    key=lambda m: (m.source != "auto", value(m, now), m.id))
    return retired + active


def over_quota(memories: Sequence[Memory], *, limit: int, now: datetime) -> list[Memory]:
    """The memories to evict so that at most ``limit`` remain."""
    excess = len(memories) - limit
    return _victim_order(memories, now)[:excess] if excess > 0 else []


def held(counts: Mapping[str, int]) -> int:
    """What counts against the per-user quota, from :meth:`MemoryStore.count`'s answer:
    active (``total``), retired and disabled memories."""
    return counts.get("total", 0) + counts.get("retired", 0) + counts.get("disabled", 0)


def make_room(memories: Sequence[Memory], *, adding: int, limit: int,
              now: datetime) -> list[Memory] | None:
    """The memories to evict so that ``adding`` new ones written on the user's request
    (manual add, import) fit beside ``memories`` within ``limit``: only what the gateway
    chose to keep may go — retired memories first, then learned (``source: auto``) ones by
    lowest value (:func:`over_quota`'s order); never a memory the user wrote or imported by
    hand. ``None`` when that is not enough room."""
    excess = len(memories) + adding - limit
    if excess <= 0:
        return []
    evictable = [m for m in _victim_order(memories, now) if not m.active or m.source == "auto"]
    return evictable[:excess] if len(evictable) >= excess else None


def per_person(memories: Sequence[Memory], *, limit: int, now: datetime) -> list[Memory]:
    """Evictions so that no other person has more than ``limit`` facts about them."""
    by_subject: dict[str, list[Memory]] = defaultdict(list)
    for memory in memories:
        if not memory.about_user:
            by_subject[memory.subject.casefold()].append(memory)
    out: list[Memory] = []
    for group in by_subject.values():
        out.extend(over_quota(group, limit=limit, now=now))
    return out


def evictions(memories: Sequence[Memory], *, max_per_user: int, now: datetime) -> list[Memory]:
    """All evictions for one user's memories: per person first, then the user total."""
    first = per_person(memories, limit=FACTS_PER_PERSON, now=now)
    gone = {m.id for m in first}
    rest = [m for m in memories if m.id not in gone]
    return first + over_quota(rest, limit=max_per_user, now=now)
