"""Injection items: the reasons ranking computed travel with each ranked memory, resident
facts and profile fields are named as such, and the block's trims are honoured."""

from __future__ import annotations

import gc
import random
import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from ulid import ULID

from proxy.memory.explain import (
    InjectionLog,
    InjectionRecord,
    api_items,
    explain,
    from_stored,
    row,
    stored,
    timed_body,
)
from proxy.memory.inject import fit_block
from proxy.memory.recall import QueryHits, RankWeights, rank
from proxy.memory.records import IdSequence, Profile, ScoredTag, from_iso, new_id
from proxy.memory.store import StoreUnavailableError
from proxy.memory.when import mentioned_periods
from proxy.settings import MemorySettings
from tests.memory.test_recall import NOW, kw, mem, vec

WEIGHTS = RankWeights(feedback=0)
EN = MemorySettings().templates["en"]


def reasons(items: tuple[object, ...]) -> dict[str, tuple[str, ...]]:
    return {item[1]: item[3] for item in items}  # type: ignore[index]


def test_ranked_memories_carry_the_reasons_ranking_computed() -> None:
    on_day = mem("day", created=datetime(2024, 6, 3, tzinfo=UTC),
                 seen=datetime(2024, 6, 3, tzinfo=UTC), conv="c1")
    long_before = datetime(2022, 1, 1, tzinfo=UTC)
    sibling = mem("sib", conv="c1", created=long_before, seen=long_before)
    dense = mem("dense", vec=(1.0, 0.0), created=long_before, seen=long_before)
    hits = [QueryHits([kw(on_day, 1, 5.0), kw(sibling, 2, 1.0), vec(dense, 1)],
                      vector=(1.0, 0.0))]
    ranked = rank(hits, now=NOW, weights=WEIGHTS, limit=10,
                  periods=mentioned_periods("on 3 June 2024"))
    items = explain([r.memory for r in ranked], ranked, None, 0, NOW)
    why = reasons(items)
    assert why["day"] == ("keyword", "date", "conversation")
    assert why["sib"] == ("keyword", "conversation")
    assert why["dense"] == ("vector",)
    # Each item's score is the final ranking score, best first.
    assert [i[2] for i in items] == [r.final for r in ranked]
    # Without a date in the query or a context weight, neither reason appears.
    plain = rank(hits, now=NOW, weights=replace(WEIGHTS, context=0), limit=10)
    assert reasons(explain([r.memory for r in plain], plain, None, 0, NOW))["day"] == \
        ("keyword",)


def test_resident_facts_and_profile_fields_are_named() -> None:
    resident = mem("res", score=0.8)
    tags = tuple(ScoredTag(f"t{i}", score=i / 10, hits=1, at=NOW) for i in range(8))
    profile = Profile(tenant="t", user_id="u", style="terse", traits=tags,
                      topics=(ScoredTag("tea", 0.5, 1, NOW),))
    items = explain([resident], [], profile, 3, NOW)
    fields = [i[1] for i in items if i[0] == "profile"]
    # style, then the six strongest traits (by index in the profile), then the topic.
    assert fields == ["style", *(f"traits[{i}]" for i in range(7, 1, -1)), "topics[0]"]
    assert items[-1] == ("memory", "res", 0.8, ("resident",))
    assert all(i[3] == ("resident",) for i in items)
    # A block that kept only its first profile line names only that line's field.
    assert [i[1] for i in explain([], [], profile, 1, NOW)] == ["style"]
    assert explain([], [], profile, 0, NOW) == ()


def test_a_tag_far_down_a_long_profile_is_named_by_its_index() -> None:
    """Field names hold the tag's index in the stored profile however long it is: in a
    profile of 100 traits and topics the strongest are the last, named ``traits[99]``…"""
    tags = tuple(ScoredTag(f"t{i}", score=i / 100, hits=1, at=NOW) for i in range(100))
    profile = Profile(tenant="t", user_id="u", traits=tags, topics=tags)
    fields = [i[1] for i in explain([], [], profile, 2, NOW)]
    assert fields == [*(f"traits[{i}]" for i in range(99, 93, -1)),
                      *(f"topics[{i}]" for i in range(99, 93, -1))]


def test_profile_order_follows_effective_scores_as_time_passes() -> None:
    """Traits are listed by effective score at the moment of the request. A trait dated
    after that moment keeps its whole score until then while the others decay, so the
    order turns as time passes — the record and the block follow it, for the very same
    profile object asked again later."""
    later = NOW + timedelta(weeks=10)
    tags = (ScoredTag("decaying", 0.5, 1, NOW), ScoredTag("dated ahead", 0.45, 1, later))
    profile = Profile(tenant="t", user_id="u", traits=tags)

    def order(moment: datetime) -> list[str]:
        return [i[1] for i in explain([], [], profile, 1, moment)]

    def block(moment: datetime) -> str:
        return fit_block(template=EN, profile=profile, facts=[], budget_tokens=500,
                         count=len, now=moment).text

    assert order(NOW) == ["traits[0]", "traits[1]"]  # 0.5 against 0.45
    assert "decaying, dated ahead" in block(NOW)
    assert order(later) == ["traits[1]", "traits[0]"]  # 0.5 × 0.9¹⁰ ≈ 0.17 against 0.45
    assert "dated ahead, decaying" in block(later)
    assert order(later + timedelta(weeks=30)) == ["traits[1]", "traits[0]"]
    assert order(NOW) == ["traits[0]", "traits[1]"]  # an earlier moment: ordered afresh


def test_profile_order_is_the_effective_score_order_at_every_moment() -> None:
    """For tags of all ages, asked at moment after moment on the same profile, the
    items are the six highest effective scores at that moment, each with its score."""
    rng = random.Random(7)
    tags = tuple(ScoredTag(f"t{i}", round(rng.random(), 2), 1,
                           NOW - timedelta(days=rng.randrange(0, 400)))
                 for i in range(12))
    profile = Profile(tenant="t", user_id="u", traits=tags)
    for weeks in (0, 1, 5, 26, 52, 104):
        moment = NOW + timedelta(weeks=weeks)
        expected = sorted(range(len(tags)),
                          key=lambda i: (-tags[i].effective_score(moment), tags[i].text))[:6]
        items = explain([], [], profile, 1, moment)
        assert [i[1] for i in items] == [f"traits[{i}]" for i in expected]
        assert [i[2] for i in items] == [tags[i].effective_score(moment) for i in expected]


def test_the_stored_form_round_trips_without_text() -> None:
    items = (("profile", "traits[1]", 0.5, ("resident",)),
             ("memory", "m1", 0.91234, ("keyword", "vector")))
    record = InjectionRecord(id="01ARZ3NDEKTSV4RRFFQ69G5FAV", tenant="t", user="u",
                             created_at=NOW, model="m", conversation_id="c", channel="private",
                             items=items)
    data = record.to_api()
    assert data["items"] == api_items(items)
    assert data["items"][1] == {"kind": "memory", "memory_id": "m1", "rank": 2,
                                "score": 0.9123, "reasons": ["keyword", "vector"]}
    back = InjectionRecord.from_api("t", "u", data)
    assert back.to_api() == data
    assert back.created_at == NOW


class FlakyStore:
    """Records what it is asked to write; fails while ``down``."""

    def __init__(self) -> None:
        self.down = True
        self.written: list[str] = []

    async def record_injections(self, records: Any, **_: Any) -> None:
        if self.down:
            raise StoreUnavailableError("down")
        self.written += [r[0] for r in records]


def record(injection_id: str, user: str = "u") -> InjectionRecord:
    return InjectionRecord(id=injection_id, tenant="t", user=user, created_at=NOW, model="m",
                           conversation_id=None, channel="private", items=())


async def test_the_buffer_keeps_records_until_a_write_succeeds_and_forgets_on_erasure() -> None:
    log, store = InjectionLog(), FlakyStore()
    log.add(record("a"))
    log.add(record("b", user="erased"))
    log.add(record("c"))
    log.discard("c")  # its reply went out without memory
    with pytest.raises(StoreUnavailableError):
        await log.flush(store, NOW)  # type: ignore[arg-type]
    assert [r[0] for r in log.pending] == ["a", "b"]
    log.forget("t", "erased")
    store.down = False
    await log.flush(store, NOW)  # type: ignore[arg-type]
    assert store.written == ["a"]
    assert log.pending == []


def test_the_compact_stored_form_round_trips_and_the_api_form_still_reads() -> None:
    items = (("profile", "style", 1.0, ("resident",)),
             ("memory", "m1", 0.91234, ("keyword", "date")),
             ("memory", "m2", 0.5, ("resident",)))
    original = InjectionRecord(id="01ARZ3NDEKTSV4RRFFQ69G5FAV", tenant="t", user="u",
                               created_at=NOW, model="m", conversation_id="c",
                               channel="private", items=items)
    kept = stored(original)
    assert kept == ('["m","c","private",[["profile","style",1.0,["resident"]],'
                    '["memory","m1",0.91234,["keyword","date"]],'
                    '["memory","m2",0.5,["resident"]]]]')
    assert from_stored("t", "u", original.id, kept, created_at=NOW) == original
    assert from_stored("t", "u", original.id, stored(original, timed=True)) == original
    # A record written as the API's JSON (before the compact form) reads back alike.
    legacy = orjson.dumps(original.to_api())
    assert from_stored("t", "u", original.id, legacy).to_api() == original.to_api()
    with pytest.raises(ValueError, match="without its time"):
        from_stored("t", "u", original.id, kept)
    with pytest.raises(orjson.JSONDecodeError):
        from_stored("t", "u", original.id, "not json", created_at=NOW)


def test_record_ids_are_ulids_unique_and_in_time_order() -> None:
    before = datetime.now(UTC)
    ids = [new_id() for _ in range(2000)]
    after = datetime.now(UTC)
    assert len(set(ids)) == len(ids)
    for value in ids[:50]:
        parsed = ULID.from_str(value)
        assert str(parsed) == value  # the canonical 26-character form
        assert before - timedelta(milliseconds=1) <= parsed.datetime <= after
    time.sleep(0.002)
    assert new_id()[:10] > max(ids)[:10]  # a later millisecond sorts after
    assert all(re.fullmatch(r"[0-7][0-9A-HJKMNP-TV-Z]{25}", value) for value in ids)


def test_a_sequence_makes_ulids_of_the_given_moment_in_the_order_made() -> None:
    """Record ids (one sequence per process): the canonical ULID of the record's moment
    to the millisecond, strictly increasing in the order made — four to a millisecond
    too, where random ids would fall in any order — and the time leads, so an id made
    later for an earlier moment sorts first. Another sequence starts elsewhere."""
    ids = IdSequence()
    moments = [NOW + timedelta(microseconds=250 * i) for i in range(40)]
    made = [ids(at) for at in moments]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    for value, at in zip(made, moments, strict=True):
        parsed = ULID.from_str(value)
        assert str(parsed) == value
        assert parsed.datetime == at.replace(microsecond=at.microsecond // 1000 * 1000)
    assert ids(NOW - timedelta(milliseconds=1)) < made[0]
    assert IdSequence()(NOW)[10:] != ids(NOW)[10:]


def test_a_queued_record_is_its_written_form_and_leaves_the_collectors_watch() -> None:
    """The log queues a record as the stores write it — id, owner, time (ISO 8601 and
    POSIX seconds) and the compact body, which reads back as the record — in a plain tuple
    the cyclic collector stops watching at its first pass, where the record object itself
    (a named tuple) stays watched: a second of queued replies must not pile up in the
    collector's generations."""
    items = (("profile", "traits[0]", 0.5, ("resident",)),
             ("memory", "m1", 0.91234, ("keyword",)))
    record = InjectionRecord(id="01ARZ3NDEKTSV4RRFFQ69G5FAV", tenant="t", user="u",
                             created_at=NOW + timedelta(microseconds=7), model="m",
                             conversation_id=None, channel="private", items=items)
    log = InjectionLog()
    log.add(record)
    queued = log.pending[0]
    assert queued == row(record)
    assert queued[:3] == ("01ARZ3NDEKTSV4RRFFQ69G5FAV", "t", "u")
    assert from_iso(queued[3]) == record.created_at
    assert queued[4] == record.created_at.timestamp()
    assert from_stored("t", "u", record.id, queued[5], created_at=record.created_at) == record
    assert timed_body(queued) == stored(record, timed=True)
    gc.collect()
    assert not gc.is_tracked(queued)
    assert gc.is_tracked(record)
