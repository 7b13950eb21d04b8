"""Conflicts a person settles and the profile over time: their records and pure rules.

**Conflicts** (docs/design.md#conflicts). Every retirement by contradiction is recorded as
a pair: the memory retired (or, for an open conflict, the one that would be) and its
successor. Two kinds:

- ``supersede``: learning retired a memory because a later fact superseded it; status
  ``unconfirmed`` until a person confirms (``confirmed``) or reverses it (``reversed``:
  the old fact is active again, the new one retired).
- ``contradicts``: the learning model was unsure and named the memory in the extraction
  answer's ``contradicts`` field; nothing is retired, status ``open``. Until a person
  settles it, recall injects only the one of the pair with more evidence, then the newer,
  an enabled one always before a disabled one (:func:`mark_pair` sets ``conflict_yields``
  on the other, a flag recall reads from the record it already holds). ``confirmed``:
  the successor stands and the old one is retired; ``reversed``: the old one stands and
  the successor is retired.

**Profile over time** (docs/design.md#profile-over-time). One :class:`ProfileWeek` per
user and ISO week (``2026-W48``): the traits and topics with their effective scores when
learning last changed the profile that week, at most :data:`HISTORY_WEEKS` kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson

from proxy.memory.records import Memory, Profile, ScoredTag, from_iso, to_iso

ConflictKind = Literal["supersede", "contradicts"]
ConflictStatus = Literal["open", "unconfirmed", "confirmed", "reversed"]
# ``GET /v1/memories/conflicts?status=``: open = awaiting a person (open conflicts and
# unconfirmed automatic retirements, the default), settled, or all.
STATUS_FILTERS: dict[str, frozenset[str]] = {
    "open": frozenset({"open", "unconfirmed"}),
    "settled": frozenset({"confirmed", "reversed"}),
    "all": frozenset({"open", "unconfirmed", "confirmed", "reversed"}),
}
HISTORY_WEEKS = 104  # weekly snapshots kept per user (two years), docs/design.md
# Conflicts kept per user, the oldest dropped (twice the 500-memory quota:
# docs/design.md#conflicts).
MAX_CONFLICTS = 1000
HISTORY_TAGS = 12  # traits and topics per snapshot: the profile's own caps
SCORE_DIGITS = 4  # effective scores are rounded as GET /v1/profile shows them


@dataclass(frozen=True, slots=True)
class Conflict:
    """One pair of contradicting memories of (tenant, user): ``retired_id`` (retired by
    the conflict, or to be) and ``successor_id``; times are UTC."""

    id: str
    tenant: str
    user_id: str
    kind: ConflictKind
    status: ConflictStatus
    retired_id: str
    successor_id: str
    reason: str
    created_at: datetime
    settled_at: datetime | None = None
    settled_by: str | None = None  # "user" | "admin"

    @property
    def settled(self) -> bool:
        return self.status in ("confirmed", "reversed")

    def to_json(self) -> str:
        """The stored JSON of the conflict (both backends)."""
        return orjson.dumps({
            "id": self.id, "kind": self.kind, "status": self.status,
            "retired_id": self.retired_id, "successor_id": self.successor_id,
            "reason": self.reason, "created_at": to_iso(self.created_at),
            "settled_at": to_iso(self.settled_at), "settled_by": self.settled_by,
        }).decode()

    def to_api(self, retired: Memory, successor: Memory) -> dict[str, Any]:
        """``{"id", "object": "memory.conflict", "kind", "status", "reason", "retired",
        "successor", "created_at", "settled_at", "settled_by"}`` with both memories as the
        memory API's JSON objects."""
        return {
            "id": self.id, "object": "memory.conflict", "kind": self.kind,
            "status": self.status, "reason": self.reason, "user_id": self.user_id,
            "retired": retired.to_api(), "successor": successor.to_api(),
            "created_at": to_iso(self.created_at), "settled_at": to_iso(self.settled_at),
            "settled_by": self.settled_by,
        }


def conflict_from_json(tenant: str, user: str, raw: str | bytes) -> Conflict:
    """Inverse of :meth:`Conflict.to_json`."""
    data = orjson.loads(raw)
    created = from_iso(data["created_at"])
    assert created is not None
    return Conflict(
        id=data["id"], tenant=tenant, user_id=user, kind=data["kind"],
        status=data["status"], retired_id=data["retired_id"],
        successor_id=data["successor_id"], reason=data.get("reason", ""),
        created_at=created, settled_at=from_iso(data.get("settled_at")),
        settled_by=data.get("settled_by"),
    )


def overflow(stored: Iterable[tuple[str, str]], *, keep: int = MAX_CONFLICTS) -> list[str]:
    """Ids of the conflicts beyond the newest ``keep`` among ``(created_at ISO, id)``."""
    ordered = sorted(stored, reverse=True)
    return [cid for _, cid in ordered[keep:]]


def stronger(a: Memory, b: Memory) -> Memory:
    """The memory of a pair recall keeps: an active one (enabled, not retired) over one a
    person disabled, then more evidence (``hits``), then the newer (``created_at``, then
    the larger id — ids are time-ordered). docs/design.md#conflicts: disabling the
    stronger releases the weaker, as deleting it does; enabling it again restores the
    choice."""
    return max((a, b), key=lambda m: (m.active, m.hits, m.created_at, m.id))


def mark_pair(a: Memory, b: Memory) -> tuple[Memory, Memory]:
    """``a`` and ``b`` marked as the two sides of an open conflict: each names the other
    in ``conflict_with``, and the weaker (:func:`stronger`) gets ``conflict_yields``."""
    keep = stronger(a, b)
    return (a.with_changes(conflict_with=b.id, conflict_yields=keep is not a),
            b.with_changes(conflict_with=a.id, conflict_yields=keep is not b))


def unmarked(memory: Memory) -> Memory:
    """``memory`` without a conflict mark."""
    return memory.with_changes(conflict_with=None, conflict_yields=False)


def retire(old: Memory, *, by: str, at: datetime, reason: str) -> Memory:
    """``old`` retired as superseded by the memory ``by`` (unmarked)."""
    return unmarked(old).with_changes(enabled=False, superseded_at=at, superseded_by=by,
                                      supersede_reason=reason, updated_at=at)


def restore(memory: Memory, *, at: datetime) -> Memory:
    """``memory`` active again (no longer retired, enabled, unmarked)."""
    return unmarked(memory).with_changes(enabled=True, superseded_at=None,
                                         superseded_by=None, supersede_reason=None,
                                         updated_at=at)


def settle(conflict: Conflict, retired: Memory, successor: Memory, *, reverse: bool,
           at: datetime, actor: str) -> tuple[Conflict, tuple[Memory, Memory]]:
    """The conflict settled by a person and the memories that change.

    Returns the settled conflict and both memories as they are now ``(retired,
    successor)``. ``reverse=False`` (confirm): the successor stands — an open conflict
    retires the old memory now, an automatic retirement stays as it is. ``reverse=True``:
    the old memory is active again and the successor is retired (superseded by the old
    one). Raises ``ValueError`` for a conflict already settled."""
    if conflict.settled:
        raise ValueError("conflict already settled")
    done = replace(conflict, status="reversed" if reverse else "confirmed",
                   settled_at=at, settled_by=actor)
    if reverse:
        return done, (restore(retired, at=at), retire(
            successor, by=retired.id, at=at, reason=f"reversed by the {actor}"))
    if conflict.kind == "contradicts":
        return done, (retire(retired, by=successor.id, at=at,
                             reason=f"contradicted, confirmed by the {actor}"),
                      unmarked(successor))
    return done, (retired, successor)


# Profile over time ---------------------------------------------------------------------

def iso_week(moment: datetime) -> str:
    """The ISO 8601 week of ``moment`` in UTC, as ``YYYY-Www`` (``2026-W48``); such
    strings sort in time order."""
    year, week, _ = moment.astimezone(UTC).isocalendar()
    return f"{year}-W{week:02d}"


def parse_week(text: str) -> str:
    """A week bound of ``GET /v1/profile/history``: ``YYYY-Www`` or an ISO 8601 date or
    time (its week). Raises ``ValueError`` for anything else."""
    value = text.strip()
    if len(value) in (7, 8) and value[4:6] in ("-W", "-w"):
        year, week = int(value[:4]), int(value[6:])
        datetime.fromisocalendar(year, week, 1)  # raises for a week that does not exist
        return f"{year}-W{week:02d}"
    parsed = from_iso(value)
    if parsed is None:
        raise ValueError(value)
    return iso_week(parsed)


@dataclass(frozen=True, slots=True)
class WeightedTag:
    """A trait or topic of a snapshot: its text and effective score then."""

    text: str
    score: float


@dataclass(frozen=True, slots=True)
class ProfileWeek:
    """The traits and topics of (tenant, user) in one ISO ``week``, best first."""

    tenant: str
    user_id: str
    week: str
    traits: tuple[WeightedTag, ...] = ()
    topics: tuple[WeightedTag, ...] = ()
    at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def to_json(self) -> str:
        """The stored JSON of the snapshot (both backends)."""
        return orjson.dumps({
            "week": self.week, "at": to_iso(self.at),
            "traits": [[t.text, t.score] for t in self.traits],
            "topics": [[t.text, t.score] for t in self.topics],
        }).decode()

    def to_api(self) -> dict[str, Any]:
        """``{"week", "traits": [{"text", "score"}], "topics": [{"text", "score"}]}``."""
        return {
            "week": self.week,
            "traits": [{"text": t.text, "score": t.score} for t in self.traits],
            "topics": [{"text": t.text, "score": t.score} for t in self.topics],
        }


def week_from_json(tenant: str, user: str, raw: str | bytes) -> ProfileWeek:
    """Inverse of :meth:`ProfileWeek.to_json`."""
    data = orjson.loads(raw)
    at = from_iso(data.get("at")) or datetime.now(UTC)
    return ProfileWeek(
        tenant=tenant, user_id=user, week=data["week"], at=at,
        traits=tuple(WeightedTag(str(t), float(s)) for t, s in data.get("traits", [])),
        topics=tuple(WeightedTag(str(t), float(s)) for t, s in data.get("topics", [])),
    )


def _weighted(tags: Iterable[ScoredTag], now: datetime) -> tuple[WeightedTag, ...]:
    scored = [WeightedTag(t.text, round(t.effective_score(now), SCORE_DIGITS)) for t in tags]
    scored.sort(key=lambda t: (-t.score, t.text))
    return tuple(scored[:HISTORY_TAGS])


def snapshot(profile: Profile | None, *, tenant: str, user: str,
             now: datetime) -> ProfileWeek:
    """The week of ``now`` from ``profile`` (effective scores at ``now``, best first); a
    user without a profile gets the week with empty lists."""
    return ProfileWeek(
        tenant=tenant, user_id=user, week=iso_week(now), at=now,
        traits=() if profile is None else _weighted(profile.traits, now),
        topics=() if profile is None else _weighted(profile.topics, now),
    )


def next_week(week: str) -> str:
    """The ISO week after ``week`` (``YYYY-Www``), across year ends (52 or 53 weeks)."""
    year, number = int(week[:4]), int(week[6:])
    return iso_week(datetime.fromisocalendar(year, number, 1).replace(tzinfo=UTC)
                    + timedelta(weeks=1))


def history(stored: Iterable[ProfileWeek], live: ProfileWeek, *, since: str | None,
            until: str | None) -> list[ProfileWeek]:
    """The weeks between ``since`` and ``until`` (inclusive ``YYYY-Www`` bounds, ``None``:
    open), oldest first, the current week being ``live`` (the live profile) instead of
    what was stored for it.

    Every week from the first stored snapshot on is listed: a week without a snapshot
    (nothing was learned that week) repeats the last one before it, traits, topics and
    scores as stored (docs/design.md#profile-over-time: a profile does not go blank
    because the user did not chat). Weeks before the first snapshot are absent, so a
    range starting earlier starts at it; a user with nothing stored gets the live week
    only."""
    weeks = {w.week: w for w in stored if w.week != live.week}
    weeks[live.week] = live
    keys = sorted(weeks)
    out: list[ProfileWeek] = []
    week, shown = keys[0], weeks[keys[0]]
    while week <= keys[-1] and (until is None or week <= until):
        known = weeks.get(week)
        shown = known if known is not None else replace(shown, week=week)
        if since is None or week >= since:
            out.append(shown)
        week = next_week(week)
    return out
