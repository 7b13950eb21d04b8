"""The memory record, the user profile and the conversation record.

Fields: docs/design.md#memory-record; lifecycle: evidence counting
(docs/design.md#evidence) and retire-not-delete (docs/design.md#contradictions). Times are
timezone-aware UTC ``datetime`` in Python and ISO 8601 on the wire.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson

from proxy.memory.categories import Category

Scope = Literal["personal", "shared", "system"]
Source = Literal["auto", "manual", "system"]
USER_SUBJECT = "user"
TITLE_MAX_CHARS = 30  # the extraction prompt asks for titles ≤ 30 characters
# Longest memory any source may store, in characters: manual memories (POST /v1/memories
# answers 400 beyond) and learned ones (the fact filters drop them as "too_long") alike.
MAX_CONTENT_CHARS = 4000
MAX_TITLE_CHARS = 200
PROFILE_CACHE_SIZE = 4096  # decoded profiles kept (a few KB each): the active users


# Crockford's base-32 (ULID's alphabet: no I, L, O or U) two characters at a time; a
# ULID's 128 bits are 130 bits in 26 characters, the first two bits zero.
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ID_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)
_ID_SHIFTS = tuple(range(120, -1, -10))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    """A sortable unique id: a ULID (26 Crockford base-32 characters: 48 bits of Unix
    milliseconds, then 80 random bits from ``os.urandom``), the string
    ``str(ulid.ULID())`` writes, encoded ten bits at a time from a table (about two thirds
    of that call's CPU). Ids made once per reply use :class:`IdSequence`."""
    value = time.time_ns() // 1_000_000 << 80 | int.from_bytes(os.urandom(10))
    return "".join([_ID_PAIRS[value >> shift & 1023] for shift in _ID_SHIFTS])


class IdSequence:
    """Monotonic ULIDs for ids one process makes at a high rate (injection records: one
    per reply that injects memory): ``ids(at)`` is 26 Crockford base-32 characters, 48
    bits of ``at``'s Unix milliseconds then 80 bits that count up by one per id from a
    random start — the ULID specification's monotonic form, so that ids of one process
    sort in the order they were made within a millisecond as well as across them, and
    ids of two processes (each its own random start, drawn from ``os.urandom``) meet
    with negligible odds. An id costs a third of :func:`new_id`'s CPU (no system call;
    the time's ten characters are made once per millisecond), measured in
    ``bench/injection_cost.py``. Not for ids a caller could exploit guessing: the next
    one of a process is its predecessor plus one."""

    __slots__ = ("_head", "_high", "_low", "_ms")

    _LOW_BITS = 40

    def __init__(self) -> None:
        self._ms = -1
        self._head = ""
        self._high = ""
        self._low = 0
        self._seed()

    def _seed(self) -> None:
        value = int.from_bytes(os.urandom(10))
        # The first 40 random bits stay (eight characters, made once); the last 40 count
        # up from a start in their lower half, so 2^39 ids fit before a new seed.
        high = value >> self._LOW_BITS
        self._high = "".join([_ID_PAIRS[high >> s & 1023] for s in (30, 20, 10, 0)])
        self._low = value & ((1 << (self._LOW_BITS - 1)) - 1)

    def __call__(self, at: datetime) -> str:
        ms = (at - _EPOCH) // _MILLISECOND
        if ms != self._ms:
            self._ms = ms
            self._head = "".join([_ID_PAIRS[ms >> s & 1023] for s in (40, 30, 20, 10, 0)])
        low = self._low = self._low + 1
        if low >> self._LOW_BITS:
            self._seed()
            low = self._low
        pairs = _ID_PAIRS
        return (self._head + self._high + pairs[low >> 30] + pairs[low >> 20 & 1023]
                + pairs[low >> 10 & 1023] + pairs[low & 1023])


def to_iso(value: datetime | None) -> str | None:
    """UTC ISO 8601 with microseconds always written, so stored strings sort by time."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def from_iso(value: str | None) -> datetime | None:
    if value is None:
        return None
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Namespace:
    """Whose memory: a tenant's user, or (``user=None``) the tenant's shared space."""

    tenant: str
    user: str | None


@dataclass(frozen=True, slots=True)
class Memory:
    """One memory (docs/design.md#memory-record). ``hits`` is the evidence count
    (docs/design.md#evidence)."""

    id: str
    tenant: str
    user_id: str | None
    content: str
    title: str = ""
    scope: Scope = "personal"
    category: Category = "user_preference"
    subcategory: str = ""
    tags: tuple[str, ...] = ()
    subject: str = USER_SUBJECT
    source: Source = "auto"
    source_conversation_id: str | None = None
    source_channel: str | None = None  # "private" | "group:<id>"; audit only, never injected
    score: float = 0.0
    embedding: tuple[float, ...] | None = None
    enabled: bool = True
    hits: int = 1
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    last_seen_at: datetime = field(default_factory=utcnow)
    access_count: int = 0
    last_access_at: datetime | None = None
    superseded_at: datetime | None = None
    superseded_by: str | None = None
    supersede_reason: str | None = None
    # The embedder model id ``embedding`` came from (``None``: no vector, or a vector stored
    # before model ids were kept — re-embedded by ``memory-proxy reindex``).
    embedding_model: str | None = None
    # An open conflict (docs/design.md#conflicts): the other memory of the pair, and
    # whether recall skips this one because the other has more evidence (then is newer).
    conflict_with: str | None = None
    conflict_yields: bool = False

    @property
    def active(self) -> bool:
        """Enabled and not retired: the only memories ever injected."""
        return self.enabled and self.superseded_at is None

    @property
    def about_user(self) -> bool:
        return self.subject == USER_SUBJECT

    def with_changes(self, **changes: Any) -> Memory:
        return replace(self, **changes)

    def to_api(self) -> dict[str, Any]:
        """JSON shape of the management API (docs/design.md#memory-record field names; no
        embedding vector)."""
        return {
            "object": "memory",
            "id": self.id,
            "tenant": self.tenant,
            "user_id": self.user_id,
            "scope": self.scope,
            "category": self.category,
            "subcategory": self.subcategory,
            "title": self.title,
            "content": self.content,
            "tags": list(self.tags),
            "subject": self.subject,
            "source": self.source,
            "source_conversation_id": self.source_conversation_id,
            "source_channel": self.source_channel,
            "score": self.score,
            "has_embedding": self.embedding is not None,
            "enabled": self.enabled,
            "hits": self.hits,
            "created_at": to_iso(self.created_at),
            "updated_at": to_iso(self.updated_at),
            "last_seen_at": to_iso(self.last_seen_at),
            "access_count": self.access_count,
            "last_access_at": to_iso(self.last_access_at),
            "superseded_at": to_iso(self.superseded_at),
            "superseded_by": self.superseded_by,
            "supersede_reason": self.supersede_reason,
            "conflict_with": self.conflict_with,
            "conflict_yields": self.conflict_yields,
        }


# A trait's or topic's score decays by this factor per week since it was last seen
# (docs/design.md#traits); ``WEEK_SECONDS``: a week.
TAG_DECAY_PER_WEEK = 0.9
WEEK_SECONDS = 7 * 86400


@dataclass(frozen=True, slots=True)
class ScoredTag:
    """A profile trait or topic: ``{text, score, hits, at}`` (docs/design.md#traits)."""

    text: str
    score: float
    hits: int
    at: datetime

    def effective_score(self, now: datetime, *,
                        decay_per_week: float = TAG_DECAY_PER_WEEK) -> float:
        """score × decay^(weeks since ``at``), applied lazily (:data:`TAG_DECAY_PER_WEEK`,
        docs/design.md#traits)."""
        weeks = max(0.0, (now - self.at).total_seconds() / WEEK_SECONDS)
        return self.score * math.pow(decay_per_week, weeks)

    def to_api(self) -> dict[str, Any]:
        return {"text": self.text, "score": self.score, "hits": self.hits, "at": to_iso(self.at)}


# tags tuple id → (the tuple, its latest ``at``, its order): see :func:`tag_order`.
_TAG_ORDERS: dict[int, tuple[tuple[ScoredTag, ...], datetime, tuple[int, ...]]] = {}
_TAG_ORDERS_KEPT = 1024


def tag_order(tags: tuple[ScoredTag, ...], now: datetime) -> tuple[int, ...]:
    """Indices of ``tags`` by effective score at ``now``, highest first (ties: by text,
    then position) — the order the block and the injection record list them in.

    Decay multiplies every tag's score by the same ``0.9 ^ (now / week)`` once ``now`` is
    past each tag's ``at``, so from then on the order no longer depends on ``now``: it is
    kept per tuple object (a user's decoded profile is memoised, so its tuples recur
    request after request) and reused while ``now`` is at or after the latest ``at``."""
    kept = _TAG_ORDERS.get(id(tags))
    if kept is not None and kept[0] is tags and now >= kept[1]:
        return kept[2]
    order = tuple(sorted(range(len(tags)),
                         key=lambda i: (-tags[i].effective_score(now), tags[i].text)))
    latest = max((t.at for t in tags), default=now)
    if latest <= now:
        if len(_TAG_ORDERS) >= _TAG_ORDERS_KEPT:
            _TAG_ORDERS.clear()
        _TAG_ORDERS[id(tags)] = (tags, latest, order)
    return order


@dataclass(frozen=True, slots=True)
class Profile:
    """The resident profile of one (tenant, user) (docs/design.md#memory-record)."""

    tenant: str
    user_id: str
    names: tuple[str, ...] = ()
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    message_count: int = 0
    style: str = ""
    impression: str = ""
    traits: tuple[ScoredTag, ...] = ()
    topics: tuple[ScoredTag, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.style or self.impression or self.traits or self.topics)

    def to_api(self, now: datetime | None = None) -> dict[str, Any]:
        moment = now or utcnow()
        return {
            "object": "profile",
            "tenant": self.tenant,
            "user_id": self.user_id,
            "names": list(self.names),
            "first_seen": to_iso(self.first_seen),
            "last_seen": to_iso(self.last_seen),
            "message_count": self.message_count,
            "style": self.style,
            "impression": self.impression,
            "traits": [
                {**t.to_api(), "effective_score": round(t.effective_score(moment), 4)}
                for t in self.traits
            ],
            "topics": [
                {**t.to_api(), "effective_score": round(t.effective_score(moment), 4)}
                for t in self.topics
            ],
        }


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """Score of a learned conversation and how far learning got
    (docs/design.md#memory-record)."""

    tenant: str
    user_id: str
    conversation_id: str
    score: float | None = None
    dimensions: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    learned_messages: int = 0
    updated_at: datetime = field(default_factory=utcnow)
    # Medium-term summary of what the conversation was about, fed
    # back to the next extraction as context; a user keeps at most MAX_SUMMARIES of them.
    summary: str = ""


MAX_SUMMARIES = 60  # summaries kept per user: docs/design.md#quotas


def profile_to_json(profile: Profile) -> str:
    """The stored JSON of a profile (both backends): names, first/last seen, message count,
    style, impression, and traits/topics as ``{text, score, hits, at}`` lists."""
    return orjson.dumps({
        "names": list(profile.names),
        "first_seen": to_iso(profile.first_seen),
        "last_seen": to_iso(profile.last_seen),
        "message_count": profile.message_count,
        "style": profile.style,
        "impression": profile.impression,
        "traits": [t.to_api() for t in profile.traits],
        "topics": [t.to_api() for t in profile.topics],
    }).decode()


@functools.lru_cache(maxsize=PROFILE_CACHE_SIZE)
def profile_from_json(tenant: str, user: str, raw: str | bytes) -> Profile:
    """Inverse of :func:`profile_to_json`; missing keys take the defaults.

    A pure function of its arguments returning a frozen value, so decodings are memoised
    (LRU, :data:`PROFILE_CACHE_SIZE`): every recall reads the user's profile and it
    changes only when learning writes it (gateway benchmark: ~0.1 ms a request saved)."""
    data = orjson.loads(raw)

    def tags(items: list[dict[str, Any]]) -> tuple[ScoredTag, ...]:
        out = []
        for item in items:
            at = from_iso(item["at"])
            assert at is not None
            out.append(ScoredTag(text=item["text"], score=float(item["score"]),
                                 hits=int(item["hits"]), at=at))
        return tuple(out)

    return Profile(
        tenant=tenant,
        user_id=user,
        names=tuple(data.get("names", ())),
        first_seen=from_iso(data.get("first_seen")),
        last_seen=from_iso(data.get("last_seen")),
        message_count=int(data.get("message_count", 0)),
        style=data.get("style", ""),
        impression=data.get("impression", ""),
        traits=tags(data.get("traits", [])),
        topics=tags(data.get("topics", [])),
    )
