"""Consolidation records conflicts (docs/design.md#conflicts) and profile snapshots
(docs/design.md#profile-over-time); the pure rules of settling and of the weeks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from proxy.learning.answers import ProfileUpdate
from proxy.learning.consolidate import consolidate
from proxy.memory.conflicts import (
    Conflict,
    ProfileWeek,
    WeightedTag,
    history,
    iso_week,
    mark_pair,
    next_week,
    parse_week,
    settle,
    snapshot,
    stronger,
)
from proxy.memory.records import Profile, ScoredTag
from tests.fakes import cand
from tests.learning.test_consolidate import NOW, context, stored


def test_a_supersede_is_recorded_as_an_unconfirmed_pair() -> None:
    """A fact that supersedes a memory retires it and records the pair (kind supersede,
    status unconfirmed) with the new memory as successor; no mark is left."""
    old = stored("Loves spicy food")
    changes = consolidate(context([old]), [cand("Dislikes spicy food", supersedes=("m1",))],
                          profile=None, profile_update=None, user_messages=1)
    (pair,) = changes.conflicts
    new = next(m for m in changes.upserts if m.id != old.id)
    assert (pair.kind, pair.status) == ("supersede", "unconfirmed")
    assert (pair.retired_id, pair.successor_id) == (old.id, new.id)
    assert all(m.conflict_with is None for m in changes.upserts)


def test_a_repeat_marked_as_superseding_records_no_conflict() -> None:
    """A restatement that the model marks as superseding is evidence: no pair."""
    old = stored("Lives in Lisbon with two cats")
    changes = consolidate(context([old]), [cand("Lives in Lisbon with two cats",
                                                supersedes=("m1",))],
                          profile=None, profile_update=None, user_messages=1)
    assert changes.conflicts == ()


def test_contradicts_opens_a_conflict_without_retiring() -> None:
    """A fact naming a memory in ``contradicts`` is stored new; both stay active, marked
    as each other's conflict, and the one with less evidence yields."""
    old = stored("Works at the harbour office", hits=3)
    changes = consolidate(context([old]), [cand("Works at the central office",
                                                contradicts=("m1",))],
                          profile=None, profile_update=None, user_messages=1)
    (pair,) = changes.conflicts
    by_id = {m.id: m for m in changes.upserts}
    assert (pair.kind, pair.status) == ("contradicts", "open")
    assert all(m.active for m in by_id.values())
    assert by_id[old.id].conflict_with == pair.successor_id
    assert by_id[old.id].conflict_yields is False
    assert by_id[pair.successor_id].conflict_with == old.id
    assert by_id[pair.successor_id].conflict_yields is True
    assert "conflict_opened" in [e.action for e in changes.audit]


def test_contradicts_of_another_subject_or_unknown_id_opens_nothing() -> None:
    """``contradicts`` naming a memory about another person, or an id not listed, opens
    no conflict and marks nothing."""
    about_anna = stored("Anna works at the harbour office", subject="Anna")
    changes = consolidate(context([about_anna]), [
        cand("Works at the central office", contradicts=("m1", "m9"))],
        profile=None, profile_update=None, user_messages=1)
    assert changes.conflicts == ()
    assert all(m.conflict_with is None for m in changes.upserts)


def test_new_evidence_moves_the_yield_to_the_other_memory() -> None:
    """When the yielding memory of an open conflict gains more evidence than the other,
    the marks swap: recall then keeps it instead."""
    kept = stored("Works at the harbour office", 1, hits=2)
    weaker = stored("Works at the central office", 2, hits=2)
    kept, weaker = mark_pair(kept, weaker.with_changes(created_at=NOW - timedelta(days=10)))
    assert weaker.conflict_yields
    ctx = context([kept, weaker])
    changes = consolidate(ctx, [cand("Works at the central office")], profile=None,
                          profile_update=None, user_messages=1)
    by_id = {m.id: m for m in changes.upserts}
    assert by_id[weaker.id].hits == 3
    assert by_id[weaker.id].conflict_yields is False
    assert by_id[kept.id].conflict_yields is True


def test_retiring_one_side_releases_the_other() -> None:
    """A memory of an open conflict superseded by a third fact: the other one is no
    longer marked, so recall may inject it."""
    a = stored("Works at the harbour office", 1, hits=5)
    b = stored("Works at the central office", 2)
    a, b = mark_pair(a, b)
    changes = consolidate(context([a, b]), [cand("Works from home now",
                                                 supersedes=("m1",))],
                          profile=None, profile_update=None, user_messages=1)
    by_id = {m.id: m for m in changes.upserts}
    assert not by_id[a.id].active
    assert (by_id[b.id].conflict_with, by_id[b.id].conflict_yields) == (None, False)


@pytest.mark.parametrize(("hits", "days", "keeps"), [
    ((3, 1), (9, 1), "a"),   # more evidence wins even when older
    ((1, 3), (1, 9), "b"),
    ((2, 2), (9, 1), "b"),   # equal evidence: the newer
    ((2, 2), (1, 9), "a"),
])
def test_the_stronger_memory_has_more_evidence_then_is_newer(
        hits: tuple[int, int], days: tuple[int, int], keeps: str) -> None:
    """Which memory of a pair recall keeps."""
    a = stored("A fact", 1, hits=hits[0]).with_changes(created_at=NOW - timedelta(days=days[0]))
    b = stored("B fact", 2, hits=hits[1]).with_changes(created_at=NOW - timedelta(days=days[1]))
    assert stronger(a, b) is (a if keeps == "a" else b)


def test_settling_an_open_conflict() -> None:
    """Confirm retires the old memory (superseded by the new one) and clears the marks;
    reverse retires the new one and keeps the old; a settled conflict cannot be settled
    again."""
    old, new = mark_pair(stored("Lives in Porto", 1, hits=2), stored("Lives in Braga", 2))
    opened = Conflict(id="c1", tenant="t", user_id="u", kind="contradicts", status="open",
                      retired_id=old.id, successor_id=new.id, reason="", created_at=NOW)
    done, (retired, successor) = settle(opened, old, new, reverse=False, at=NOW,
                                        actor="user")
    assert done.status == "confirmed"
    assert done.settled_by == "user"
    assert not retired.active
    assert retired.superseded_by == new.id
    assert successor.active
    assert successor.conflict_with is None
    done, (kept, dropped) = settle(opened, old, new, reverse=True, at=NOW, actor="admin")
    assert done.status == "reversed"
    assert kept.active
    assert kept.conflict_with is None
    assert not kept.conflict_yields
    assert not dropped.active
    assert dropped.superseded_by == old.id
    with pytest.raises(ValueError, match="settled"):
        settle(done, kept, dropped, reverse=False, at=NOW, actor="user")


def test_profile_update_writes_the_weeks_snapshot() -> None:
    """A batch that updates the profile carries the week's snapshot with effective
    scores, best first; a batch without a profile update carries none."""
    profile = Profile(tenant="t", user_id="u", traits=(
        ScoredTag("curious", 1.0, 1, NOW - timedelta(weeks=1)),), first_seen=NOW)
    changes = consolidate(context([]), [], profile=profile, user_messages=1,
                          profile_update=ProfileUpdate(style=None, impression=None,
                                                       traits=("patient",),
                                                       topics=("hiking",)))
    assert changes.snapshot is not None
    assert changes.snapshot.week == iso_week(NOW)
    assert [(t.text, t.score) for t in changes.snapshot.traits] == \
        [("patient", 1.0), ("curious", 0.9)]
    assert [t.text for t in changes.snapshot.topics] == ["hiking"]
    quiet = consolidate(context([]), [], profile=profile, profile_update=None,
                        user_messages=1)
    assert quiet.snapshot is None


@pytest.mark.parametrize(("text", "week"), [
    ("2026-W48", "2026-W48"), ("2026-w05", "2026-W05"), ("2026-01-01", "2026-W01"),
    ("2024-12-30T10:00:00Z", "2025-W01"), ("2020-W53", "2020-W53"),
])
def test_week_bounds_parse(text: str, week: str) -> None:
    """ISO weeks and ISO dates or times name a week."""
    assert parse_week(text) == week


@pytest.mark.parametrize("text", ["2026-W54", "2025-W53", "last week", "2026-13-01", ""])
def test_bad_week_bounds_are_refused(text: str) -> None:
    """A week that does not exist or text that is no date is a ValueError."""
    with pytest.raises(ValueError):  # noqa: PT011 - datetime's own messages vary by input
        parse_week(text)


def _week(name: str, trait: str) -> ProfileWeek:
    return ProfileWeek(tenant="t", user_id="u", week=name, at=NOW,
                       traits=(WeightedTag(trait, 1.5),), topics=(WeightedTag("chess", 0.5),))


def test_history_fills_weeks_without_a_snapshot_with_the_last_one_before() -> None:
    """Snapshots in W40 and W43: W41 and W42 repeat W40's traits, topics and scores, W43
    is its own, the weeks after it up to the live week repeat W43's; a range starting
    before the first snapshot starts at it; a range inside a gap still shows the week
    before it; nothing comes after until."""
    w40, w43 = _week("2026-W40", "curious"), _week("2026-W43", "calm")
    live = snapshot(None, tenant="t", user="u", now=datetime(2026, 12, 2, tzinfo=UTC))
    weeks = history([w43, w40], live, since="2026-W30", until="2026-W44")
    assert [w.week for w in weeks] == [f"2026-W{n}" for n in range(40, 45)]
    assert [(w.traits, w.topics) for w in weeks] == \
        [(w40.traits, w40.topics)] * 3 + [(w43.traits, w43.topics)] * 2
    everything = history([w40, w43], live, since=None, until=None)
    assert [w.week for w in everything] == [f"2026-W{n}" for n in range(40, 50)]
    assert all(w.traits == w43.traits for w in everything[3:-1])
    assert everything[-1] == live
    assert history([w40, w43], live, since="2026-W42", until="2026-W42") == \
        [_week("2026-W42", "curious")]
    assert history([w43], live, since="2026-W30", until="2026-W42") == []


def test_filled_weeks_cross_a_year_end() -> None:
    """2026 has 53 ISO weeks, 2025 52: the week after the last is the next year's W01."""
    assert next_week("2026-W53") == "2027-W01"
    assert next_week("2025-W52") == "2026-W01"
    assert next_week("2026-W09") == "2026-W10"
    live = snapshot(None, tenant="t", user="u", now=datetime(2027, 1, 12, tzinfo=UTC))
    weeks = history([_week("2026-W52", "curious")], live, since=None, until=None)
    assert [w.week for w in weeks] == ["2026-W52", "2026-W53", "2027-W01", "2027-W02"]
    assert weeks[1].traits == (WeightedTag("curious", 1.5),)


def test_history_replaces_the_current_week_with_the_live_profile() -> None:
    """The current week comes from the live profile; bounds are inclusive; a user
    without anything stored still gets the current week."""
    live = snapshot(None, tenant="t", user="u", now=datetime(2026, 12, 2, tzinfo=UTC))
    older = snapshot(Profile(tenant="t", user_id="u", traits=(
        ScoredTag("curious", 2.0, 2, NOW),)), tenant="t", user="u", now=NOW)
    stale_now = snapshot(Profile(tenant="t", user_id="u", traits=(
        ScoredTag("stale", 2.0, 2, NOW),)), tenant="t", user="u",
        now=datetime(2026, 12, 1, tzinfo=UTC))
    weeks = history([older, stale_now], live, since=None, until=None)
    assert (weeks[0], weeks[-1]) == (older, live)
    assert weeks[-1].traits == ()
    assert history([older], live, since=live.week, until=None) == [live]
    assert history([older], live, since=None, until=older.week) == [older]
    assert history([], live, since=None, until=None) == [live]
