"""Injection records: which memories and profile fields went into one reply, and why
(docs/design.md#injection-records).

A record holds ids, profile field names, ranks, scores and reason words — never memory
text and never the prompt. The request path builds one as a small tuple list and hands
it to :class:`InjectionLog`, which the app flushes to the store in batches every second
(like the access counters), so no request waits on a store write. ``GET
/v1/memories/injections/{id}`` reads a record back; ``POST /v1/memories/preview`` shows the
items recall would inject now, recording nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import orjson
import structlog

from proxy.memory.records import (
    TAG_DECAY_PER_WEEK,
    WEEK_SECONDS,
    IdSequence,
    Memory,
    Profile,
    ScoredTag,
    from_iso,
    tag_order,
    to_iso,
)

if TYPE_CHECKING:
    from proxy.memory.recall import Ranked
    from proxy.memory.store import MemoryStore

log = structlog.get_logger("proxy.memory.explain")

Reason = Literal["keyword", "vector", "resident", "date", "conversation"]
# Profile tags shown per line of the block (proxy.memory.inject.MAX_PROFILE_TAGS).
PROFILE_TAGS = 6
# A date match (proxy.memory.when.time_match) decays exponentially and is never quite 0
# once the query names a date: "date" is a reason from 1 % of a full match on (about 4.6
# decay constants from the named period).
DATE_REASON = 0.01
# Records buffered while the store is away; past it the newest are dropped and counted.
MAX_PENDING = 10_000

# One item: (kind, memory id or profile field, score, reasons); its rank is its position.
Item = tuple[Literal["memory", "profile"], str, float, tuple[str, ...]]
_RESIDENT = ("resident",)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# tags tuple id → (the tuple, each tag's (score, at in µs since the epoch)): _tag_times.
_TAG_TIMES: dict[int, tuple[tuple[ScoredTag, ...], tuple[tuple[float, int], ...]]] = {}
_TAG_TIMES_KEPT = 1024
# Profile field names "traits[i]" / "topics[i]" for the first tags, made once (a profile
# holds at most this many of each in practice; a later index is formatted when met).
_NAMED_TAGS = 64
_TRAIT_FIELDS = tuple(f"traits[{i}]" for i in range(_NAMED_TAGS))
_TOPIC_FIELDS = tuple(f"topics[{i}]" for i in range(_NAMED_TAGS))
# A ranked memory's reasons by (keyword hit, vector hit, date match, context), in this
# order: one shared tuple per combination, so no request builds them.
_REASONS: dict[tuple[bool, ...], tuple[str, ...]] = {
    flags: tuple(word for word, on in zip(
        ("keyword", "vector", "date", "conversation"), flags, strict=True) if on)
    for flags in itertools.product((False, True), repeat=4)
}


class InjectionRecord(NamedTuple):
    """One reply's injection: ``id`` (ULID), the (tenant, user) it belongs to, when,
    the request's model, conversation id and channel, and its items best first.

    A named tuple, not a dataclass: one is built per reply that injects memory and kept
    until the next flush (up to a second); it is built in a fraction of a frozen
    dataclass's time, and its items — plain tuples of strings and floats — leave the
    cyclic collector's watch at its first pass (the collector untracks an exact tuple
    that holds only untracked values; the record itself, a subclass, stays watched until
    the flush drops it). ``bench/setting_ab.py`` measures what records cost a request."""

    id: str
    tenant: str
    user: str
    created_at: datetime
    model: str
    conversation_id: str | None
    channel: str
    items: tuple[Item, ...]

    def to_api(self) -> dict[str, Any]:
        """``{"id", "created_at", "request": {"model", "conversation_id", "channel"},
        "items": [{"kind", "memory_id" | "field", "rank" (1 = first), "score",
        "reasons"}]}``."""
        return {
            "id": self.id,
            "created_at": to_iso(self.created_at),
            "request": {"model": self.model, "conversation_id": self.conversation_id,
                        "channel": self.channel},
            "items": api_items(self.items),
        }

    @classmethod
    def from_api(cls, tenant: str, user: str, data: dict[str, Any]) -> InjectionRecord:
        """The record :meth:`to_api` wrote (the stored form)."""
        request = data["request"]
        items = tuple(
            ("memory", i["memory_id"], float(i["score"]), tuple(i["reasons"]))
            if i["kind"] == "memory"
            else ("profile", i["field"], float(i["score"]), tuple(i["reasons"]))
            for i in data["items"]
        )
        created = from_iso(data["created_at"])
        assert created is not None
        return cls(id=data["id"], tenant=tenant, user=user, created_at=created,
                   model=request["model"], conversation_id=request["conversation_id"],
                   channel=request["channel"], items=items)  # type: ignore[arg-type]


def stored(record: InjectionRecord, *, timed: bool = False) -> str:
    """The compact form a store keeps beside the record's id and owner: JSON
    ``[model, conversation_id, channel, [[kind, memory id or field, score, [reason…]]…]]``
    (items best first), with ``timed`` preceded by ``created_at`` (ISO 8601) for a store
    that keeps no time column. Writing it is one ``orjson`` call over the record's tuples,
    a fraction of the CPU of the API's JSON, whose dicts are built only when a record is
    read (``bench/injection_cost.py``)."""
    body = (record.model, record.conversation_id, record.channel, record.items)
    return orjson.dumps((to_iso(record.created_at), *body) if timed else body).decode()


# A record as it is queued and written: (id, tenant, user, created_at as ISO 8601
# (``to_iso``), created_at as POSIX seconds, body — :func:`stored`'s compact JSON). Built on
# the request path, so a queued record is a plain tuple of strings and a float: the cyclic
# collector stops watching it at its first pass. A queued record object and its item tuples
# stayed watched until the flush — some twenty objects per reply, which made collections
# of every generation more frequent, and records only ever reached the old generation
# that full collections walk (``bench/setting_ab.py``; docs/design.md#injection-records).
RecordRow = tuple[str, str, str, str, float, str]


def row(record: InjectionRecord) -> RecordRow:
    """``record`` as it is queued and written (:data:`RecordRow`)."""
    at = record.created_at
    return (record.id, record.tenant, record.user, to_iso(at) or "", at.timestamp(),
            stored(record))


def timed_body(queued: RecordRow) -> str:
    """The body with ``created_at`` first — ``stored(record, timed=True)`` — for a store
    that keeps no time column."""
    return '["' + queued[3] + '",' + queued[5][1:]


def from_stored(tenant: str, user: str, injection_id: str, raw: str | bytes, *,
                created_at: datetime | None = None) -> InjectionRecord:
    """The record :func:`stored` wrote (``created_at``: its time, unless it was
    ``timed``) — or, for a record written before the compact form, the API's JSON
    (:meth:`InjectionRecord.to_api`). Raises ``orjson.JSONDecodeError``, ``KeyError`` or
    ``ValueError`` on a value neither wrote."""
    data = orjson.loads(raw)
    if isinstance(data, dict):
        return InjectionRecord.from_api(tenant, user, data)
    if len(data) == 5:
        created_at = from_iso(data.pop(0))
    if created_at is None:
        raise ValueError("an injection record stored without its time")
    model, conversation_id, channel, rows = data
    items = tuple((kind, ref, float(score), tuple(reasons))
                  for kind, ref, score, reasons in rows)
    return InjectionRecord(id=injection_id, tenant=tenant, user=user, created_at=created_at,
                           model=model, conversation_id=conversation_id, channel=channel,
                           items=items)


def api_items(items: Sequence[Item]) -> list[dict[str, Any]]:
    """The items as the API shows them (rank 1 = first in the block's order)."""
    out = []
    for rank, (kind, ref, score, reasons) in enumerate(items, start=1):
        key = "memory_id" if kind == "memory" else "field"
        out.append({"kind": kind, key: ref, "rank": rank, "score": round(score, 4),
                    "reasons": list(reasons)})
    return out


def explain(memories: Sequence[Memory], ranked: Sequence[Ranked],
            profile: Profile | None, profile_lines: int, now: datetime) -> tuple[Item, ...]:
    """The items of one block: its profile fields (``style``, ``impression``,
    ``traits[i]``, ``topics[i]`` — ``i`` the tag's index in the stored profile — score the
    tag's effective score, 1.0 for style and impression; reason ``resident``), then its
    ``memories`` in ranking order: a ranked one scored by its final score with the
    reasons ranking computed (``keyword``/``vector`` search hit, ``date`` match ≥
    :data:`DATE_REASON`, ``conversation`` context > 0); one from the resident layer
    scored by its quality score, reason ``resident``. ``profile_lines``: how many profile
    lines the block kept.

    ``memories`` is the block's facts in the order the memory step chose them: the ranked
    ones in ``ranked``'s order (some maybe left out), then resident ones; so one walk
    along ``ranked`` names each."""
    items: list[Item] = []
    if profile is not None and profile_lines > 0:
        _add_profile_items(items, profile, profile_lines, now)
    if not memories:
        return tuple(items)
    walk = iter(ranked)
    r = next(walk, None)
    for memory in memories:
        while r is not None and r.memory.id != memory.id:
            r = next(walk, None)
        if r is None:
            score = memory.score if memory.score < 1.0 else 1.0  # max(0, min(1, score))
            items.append(("memory", memory.id, score if score > 0.0 else 0.0, _RESIDENT))
        else:
            items.append(("memory", memory.id, r.final, _REASONS[
                r.keyword, r.vector, r.when >= DATE_REASON, r.context > 0]))
            r = next(walk, None)
    return tuple(items)


def _add_profile_items(items: list[Item], profile: Profile, lines: int,
                       now: datetime) -> None:
    """Append the items of the block's first ``lines`` profile lines to ``items``: style,
    impression (one item each), then the top :data:`PROFILE_TAGS` traits and topics in
    :func:`tag_order` (one line each kind). A tag's
    effective score is :meth:`ScoredTag.effective_score`'s, computed from whole
    microseconds since the epoch kept per tags tuple (:func:`_tag_times`): the same
    float, without a ``timedelta`` per tag."""
    if profile.style:
        items.append(("profile", "style", 1.0, _RESIDENT))
        lines -= 1
    if profile.impression and lines > 0:
        items.append(("profile", "impression", 1.0, _RESIDENT))
        lines -= 1
    now_us = -1
    for name, names, tags in (("traits", _TRAIT_FIELDS, profile.traits),
                              ("topics", _TOPIC_FIELDS, profile.topics)):
        if lines <= 0:
            return
        if not tags:
            continue
        lines -= 1
        if now_us < 0:
            now_us = (now - _EPOCH) // _MICROSECOND
        times = _tag_times(tags)
        for i in tag_order(tags, now)[:PROFILE_TAGS]:
            score, at_us = times[i]
            weeks = (now_us - at_us) / 1_000_000 / WEEK_SECONDS
            ref = names[i] if i < _NAMED_TAGS else f"{name}[{i}]"
            items.append(("profile", ref,
                          score * TAG_DECAY_PER_WEEK ** (weeks if weeks > 0.0 else 0.0),
                          _RESIDENT))


def _tag_times(tags: tuple[ScoredTag, ...]) -> tuple[tuple[float, int], ...]:
    """``(score, at in whole microseconds since the epoch)`` of each tag, kept per tags
    tuple object (a user's decoded profile is memoised, so its tuples recur request after
    request; at most :data:`_TAG_TIMES_KEPT` tuples, then the memo starts over)."""
    kept = _TAG_TIMES.get(id(tags))
    if kept is not None and kept[0] is tags:
        return kept[1]
    times = tuple((t.score, (t.at - _EPOCH) // _MICROSECOND) for t in tags)
    if len(_TAG_TIMES) >= _TAG_TIMES_KEPT:
        _TAG_TIMES.clear()
    _TAG_TIMES[id(tags)] = (tags, times)
    return times


@dataclass(frozen=True, slots=True)
class Keeping:
    """How long records are kept (``memory.injection_retention_days``, default 7) and
    how many per user (``memory.injections_per_user``, default 1,000; oldest dropped)."""

    retention: timedelta = timedelta(days=7)
    per_user: int = 1000


@dataclass(slots=True)
class InjectionLog:
    """Buffers records so the hot path never writes them; :meth:`flush` stores them in
    one batch. A failed write keeps them for the next flush, within :data:`MAX_PENDING`
    (newest dropped, counted in ``dropped``)."""

    keeping: Keeping = field(default_factory=Keeping)
    pending: list[RecordRow] = field(default_factory=list)
    # Record ids: monotonic ULIDs of the record's time, so that this process's records
    # sort in the order they were made (the per-user cap drops the oldest).
    ids: IdSequence = field(default_factory=IdSequence)
    dropped: int = 0
    on_drop: Callable[[int], None] | None = None

    def add(self, record: InjectionRecord) -> None:
        """Queue ``record`` in its written form (:func:`row`)."""
        if len(self.pending) < MAX_PENDING:
            self.pending.append(row(record))
            return
        self.dropped += 1
        if self.on_drop is not None:
            self.on_drop(1)

    def holds(self, tenant: str, user: str, injection_id: str) -> bool:
        """Whether record ``injection_id`` of (``tenant``, ``user``) waits in this
        process's buffer, not yet written (a scan of at most :data:`MAX_PENDING` rows)."""
        return any(r[0] == injection_id and r[1] == tenant and r[2] == user
                   for r in self.pending)

    def discard(self, injection_id: str) -> None:
        """Drop a buffered record whose block was not sent after all (the retry without
        memory after a context overflow); one already written stays."""
        self.pending = [r for r in self.pending if r[0] != injection_id]

    def forget(self, tenant: str, user: str) -> None:
        """Drop the user's buffered records (erasure)."""
        self.pending = [r for r in self.pending if r[1] != tenant or r[2] != user]

    async def flush(self, store: MemoryStore, now: datetime) -> None:
        """Write the buffered records. Raises what the store raised (the records stay)."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        try:
            await store.record_injections(pending, now=now,
                                          retention=self.keeping.retention,
                                          per_user=self.keeping.per_user)
        except BaseException:
            merged = pending + self.pending
            self.pending = merged[:MAX_PENDING]
            self.dropped += len(merged) - len(self.pending)
            raise
