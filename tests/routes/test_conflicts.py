"""Conflicts a person settles and the profile over time through the API, learned end to
end on both backends (docs/design.md#conflicts, docs/design.md#profile-over-time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from proxy.memory.conflicts import ProfileWeek, WeightedTag, iso_week
from proxy.memory.store import ChangeSet
from tests.fakes import FakeUpstream, Gateway
from tests.learning.test_learning_e2e import extraction, fact, known_ids
from tests.routes.test_user_memory import ADMIN, APP_B, U1, U2, call, chat, error, gw

__all__ = ["gw"]  # the two-backend gateway fixture of the user-memory tests


def block(upstream: FakeUpstream) -> str:
    first = upstream.last_chat["messages"][0]
    return str(first["content"]) if first["role"] == "system" else ""


async def learn(gw: Gateway, upstream: FakeUpstream, text: str, *facts: Any,
                profile: Any = None) -> None:
    upstream.extract = lambda body: extraction(*facts, profile=profile)
    await chat(gw, text)
    await gw.settle()


async def learn_with_ids(gw: Gateway, upstream: FakeUpstream, text: str,
                         make: Any) -> None:
    upstream.extract = lambda body: extraction(make(known_ids(body)))
    await chat(gw, text)
    await gw.settle()


async def conflicts(gw: Gateway, headers: dict[str, str] = U1,
                    **params: str) -> list[dict[str, Any]]:
    response = await call(gw, "GET", "/v1/memories/conflicts", headers, params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    return list(body["data"])


async def test_a_supersede_is_listed_and_a_person_reverses_it(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """Learning's supersede is an unconfirmed pair with both memories as the memory API
    shows them; reverse makes the old fact active (injected again) and retires the new
    one, audited as retired; a settled pair is 409 and shows under status=settled;
    another user and another tenant get 404 and see nothing."""
    await learn(gw, upstream, "I love spicy food.", fact("Loves spicy food"))
    await learn_with_ids(gw, upstream, "I can't stand spicy food now.", lambda ids: fact(
        "Dislikes spicy food", supersedes=[ids["Loves spicy food"]]))
    (pair,) = await conflicts(gw)
    assert (pair["kind"], pair["status"]) == ("supersede", "unconfirmed")
    assert pair["retired"]["object"] == "memory"
    assert (pair["retired"]["content"], pair["retired"]["enabled"]) == \
        ("Loves spicy food", False)
    assert pair["successor"]["content"] == "Dislikes spicy food"
    assert await conflicts(gw, status="settled") == []
    assert await conflicts(gw, U2, status="all") == []
    assert await conflicts(gw, {**APP_B, "X-User-Id": "u1"}, status="all") == []
    path = f"/v1/memories/conflicts/{pair['id']}/reverse"
    assert error(await call(gw, "POST", path, U2), 404)["code"] == "conflict_not_found"
    reversed_ = await call(gw, "POST", path, U1)
    assert reversed_.status_code == 200, reversed_.text
    body = reversed_.json()
    assert body["status"] == "reversed"
    assert body["settled_by"] == "user"
    assert body["retired"]["enabled"] is True
    assert body["retired"]["superseded_at"] is None
    assert body["successor"]["superseded_by"] == body["retired"]["id"]
    again = await call(gw, "POST", f"/v1/memories/conflicts/{pair['id']}/confirm", U1)
    assert error(again, 409)["code"] == "conflict_settled"
    assert await conflicts(gw) == []
    assert [c["status"] for c in await conflicts(gw, status="settled")] == ["reversed"]
    await chat(gw, "Should I order spicy food?")
    assert "Loves spicy food" in block(upstream)
    assert "Dislikes spicy food" not in block(upstream)
    audit = await call(gw, "GET", "/v1/admin/audit", ADMIN,
                       params={"user": "u1", "action": "retired"})
    retired = [e for e in audit.json()["data"] if e["memory_id"] == body["successor"]["id"]]
    assert retired
    assert retired[0]["actor"] == "user"


async def test_contradicts_is_open_and_recall_injects_only_the_stronger(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """A fact the model is unsure about opens a conflict without retiring anything: both
    memories are active, recall injects only the one with more evidence; confirming
    retires the old one and injects the new one. An admin lists the user's conflicts with
    ?user=."""
    for text in ("I work at the harbour office.", "Still at the harbour office."):
        await learn(gw, upstream, text, fact("Works at the harbour office"))
    await learn_with_ids(gw, upstream, "I'm at the central office this month.",
                         lambda ids: fact("Works at the central office",
                                          contradicts=[ids["Works at the harbour office"]]))
    (pair,) = await conflicts(gw)
    assert (pair["kind"], pair["status"]) == ("contradicts", "open")
    assert pair["retired"]["enabled"]
    assert pair["successor"]["enabled"]
    assert pair["successor"]["conflict_yields"] is True
    await chat(gw, "Which office do I work at?")
    assert "harbour office" in block(upstream)
    assert "central office" not in block(upstream)
    admin = await call(gw, "GET", "/v1/admin/conflicts", ADMIN, params={"user": "u1"})
    assert [c["id"] for c in admin.json()["data"]] == [pair["id"]]
    assert (await call(gw, "GET", "/v1/admin/conflicts", ADMIN,
                       params={"user": "u2"})).json()["data"] == []
    confirmed = await call(gw, "POST", f"/v1/memories/conflicts/{pair['id']}/confirm",
                           {**ADMIN, "X-User-Id": "u1"})
    assert confirmed.json()["status"] == "confirmed"
    assert confirmed.json()["settled_by"] == "admin"
    await chat(gw, "Which office do I work at?")
    assert "central office" in block(upstream)
    assert "harbour office" not in block(upstream)


async def supersede_for(gw: Gateway, upstream: FakeUpstream, headers: dict[str, str],
                        old: str, new: str) -> None:
    """Learn ``old`` for the caller of ``headers``, then ``new`` superseding it."""
    upstream.extract = lambda body: extraction(fact(old))
    await chat(gw, f"Note: {old}.", headers)
    await gw.settle()
    upstream.extract = lambda body: extraction(fact(new, supersedes=[known_ids(body)[old]]))
    await chat(gw, f"Note: {new}.", headers)
    await gw.settle()


async def admin_list(gw: Gateway, **params: str) -> list[dict[str, Any]]:
    response = await call(gw, "GET", "/v1/admin/conflicts", ADMIN, params=params)
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


async def test_an_admin_lists_the_conflicts_of_every_user_of_the_tenant(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """Without ?user= the tenant's admin gets every user's conflicts of the tenant, newest
    first, each naming its user_id, in the shape of the user's own listing; another
    tenant's user of the same id stays out (and ?tenant= naming it is 403); the status
    filter applies across users; ?user= still lists one user's only."""
    await supersede_for(gw, upstream, U1, "Lives in Porto", "Lives in Braga")
    await supersede_for(gw, upstream, U2, "Plays the cello", "Plays the violin")
    await supersede_for(gw, upstream, {**APP_B, "X-User-Id": "u1"}, "Drives a van",
                        "Drives a bus")
    (mine,) = await conflicts(gw)
    (theirs,) = await conflicts(gw, U2)
    listed = await admin_list(gw, status="all")
    assert [c["id"] for c in listed] == [theirs["id"], mine["id"]]
    assert [c["user_id"] for c in listed] == ["u2", "u1"]
    assert listed == [theirs, mine]
    assert "Drives a bus" not in str(listed)
    other = await call(gw, "GET", "/v1/admin/conflicts", ADMIN, params={"tenant": "tenant-b"})
    assert error(other, 403)["code"] == "other_tenant"
    confirmed = await call(gw, "POST", f"/v1/memories/conflicts/{theirs['id']}/confirm", U2)
    assert confirmed.status_code == 200, confirmed.text
    assert [c["id"] for c in await admin_list(gw)] == [mine["id"]]
    assert [c["id"] for c in await admin_list(gw, status="settled")] == [theirs["id"]]
    assert [c["id"] for c in await admin_list(gw, status="all", user="u1")] == [mine["id"]]
    assert [c["id"] for c in await admin_list(gw, status="all", user="u2")] == \
        [theirs["id"]]
    assert await admin_list(gw, status="all", user="nobody") == []
    assert error(await call(gw, "GET", "/v1/admin/conflicts", ADMIN,
                            params={"status": "nope"}), 400)["param"] == "status"


async def test_deleting_one_memory_of_an_open_conflict_releases_the_other(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """The stronger memory deleted: the one that yielded to it is injected again, and the
    pair is no longer listed."""
    for text in ("I work at the harbour office.", "Still at the harbour office."):
        await learn(gw, upstream, text, fact("Works at the harbour office"))
    await learn_with_ids(gw, upstream, "Central office now?", lambda ids: fact(
        "Works at the central office", contradicts=[ids["Works at the harbour office"]]))
    (pair,) = await conflicts(gw)
    deleted = await call(gw, "DELETE", f"/v1/memories/{pair['retired']['id']}", U1)
    assert deleted.status_code == 200
    assert await conflicts(gw, status="all") == []
    await chat(gw, "Which office do I work at?")
    assert "central office" in block(upstream)


async def open_pair(gw: Gateway, upstream: FakeUpstream) -> dict[str, Any]:
    """An open conflict of u1: "harbour office" (two sightings, the one recall keeps)
    against "central office" (one sighting, yields)."""
    for text in ("I work at the harbour office.", "Still at the harbour office."):
        await learn(gw, upstream, text, fact("Works at the harbour office"))
    await learn_with_ids(gw, upstream, "Central office now?", lambda ids: fact(
        "Works at the central office", contradicts=[ids["Works at the harbour office"]]))
    (pair,) = await conflicts(gw)
    return pair


async def switch(gw: Gateway, memory_id: str, enabled: bool) -> dict[str, Any]:
    response = await call(gw, "PATCH", f"/v1/memories/{memory_id}", U1,
                          json={"enabled": enabled})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_disabling_the_stronger_memory_of_an_open_conflict_releases_the_other(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """The stronger memory disabled: the one that yielded to it is injected (the pair is
    still open and listed); enabled again, the stronger is injected alone once more."""
    pair = await open_pair(gw, upstream)
    strong, weak = pair["retired"]["id"], pair["successor"]["id"]
    await switch(gw, strong, False)
    await chat(gw, "Which office do I work at?")
    assert "central office" in block(upstream)
    assert "harbour office" not in block(upstream)
    (listed,) = await conflicts(gw)
    assert listed["status"] == "open"
    assert listed["successor"]["conflict_yields"] is False
    await switch(gw, strong, True)
    await chat(gw, "Which office do I work at?")
    assert "harbour office" in block(upstream)
    assert "central office" not in block(upstream)
    (again,) = await conflicts(gw)
    assert again["successor"]["conflict_yields"] is True
    assert again["retired"]["conflict_yields"] is False
    assert weak == again["successor"]["id"]


async def test_disabling_the_weaker_memory_of_an_open_conflict_changes_nothing_injected(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """The memory that yields disabled, then enabled again: the stronger stays the one
    injected, the weaker is never injected beside it."""
    pair = await open_pair(gw, upstream)
    weak = pair["successor"]["id"]
    for enabled in (False, True):
        await switch(gw, weak, enabled)
        await chat(gw, "Which office do I work at?")
        assert "harbour office" in block(upstream)
        assert "central office" not in block(upstream)
    (listed,) = await conflicts(gw)
    assert listed["successor"]["conflict_yields"] is True


async def test_clearing_all_memories_removes_their_conflicts_and_profile_history(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """"Clear all" (DELETE /v1/memories?confirm=true, the console's clear button): the
    user's conflicts and weekly profile snapshots go with the memories — none is stored
    any more, the history shows only the empty live week; another user's stay; without
    confirmation nothing is cleared."""
    await open_pair(gw, upstream)
    await learn(gw, upstream, "I love long hikes.", fact("Loves long hikes"),
                profile={"traits": ["outdoorsy"], "topics": ["hiking"]})
    a_week = iso_week(datetime.now(UTC) - timedelta(weeks=3))
    for user in ("u1", "u2"):
        await gw.res.store.apply(ChangeSet(
            tenant="tenant-a", user_id=user, batch_key=f"week-{user}", snapshot=ProfileWeek(
                tenant="tenant-a", user_id=user, week=a_week, topics=(WeightedTag("x", 1),))))
    refused = await call(gw, "DELETE", "/v1/memories", U1)
    assert error(refused, 400)["code"] == "confirmation_required"
    assert len(await conflicts(gw)) == 1
    cleared = await call(gw, "DELETE", "/v1/memories", U1, params={"confirm": "true"})
    assert cleared.status_code == 200, cleared.text
    assert await conflicts(gw, status="all") == []
    everything = frozenset({"open", "unconfirmed", "confirmed", "reversed"})
    assert await gw.res.store.list_conflicts("tenant-a", "u1", statuses=everything) == []
    assert await gw.res.store.profile_history("tenant-a", "u1") == []
    weeks = (await call(gw, "GET", "/v1/profile/history", U1)).json()["data"]
    assert weeks == [{"week": iso_week(datetime.now(UTC)), "traits": [], "topics": []}]
    assert [w.week for w in await gw.res.store.profile_history("tenant-a", "u2")] == [a_week]


async def test_profile_history_is_weekly_with_the_live_week_last(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """A new user gets the current week with empty lists; learned traits show in the
    current week with their scores; an earlier stored week comes first (the weeks between
    repeat it) and since/until select weeks; bad bounds are 400; another user sees only
    their own weeks; erasure removes the history and the conflicts."""
    path = "/v1/profile/history"
    now_week = iso_week(datetime.now(UTC))
    fresh = (await call(gw, "GET", path, U2)).json()
    assert fresh == {"object": "list",
                     "data": [{"week": now_week, "traits": [], "topics": []}]}
    await learn(gw, upstream, "I love long hikes.", fact("Loves long hikes"),
                profile={"traits": ["outdoorsy"], "topics": ["hiking"]})
    earlier = datetime.now(UTC) - timedelta(weeks=6)
    await gw.res.store.apply(ChangeSet(
        tenant="tenant-a", user_id="u1", batch_key="old-week", snapshot=ProfileWeek(
            tenant="tenant-a", user_id="u1", week=iso_week(earlier), at=earlier,
            topics=(WeightedTag("chess", 2.5),))))
    weeks = (await call(gw, "GET", path, U1)).json()["data"]
    assert [w["week"] for w in weeks] == [iso_week(earlier + timedelta(weeks=n))
                                          for n in range(7)]
    assert weeks[-1]["week"] == now_week
    assert weeks[0]["topics"] == [{"text": "chess", "score": 2.5}]
    assert weeks[-1]["traits"] == [{"text": "outdoorsy", "score": 1.0}]
    assert weeks[-1]["topics"] == [{"text": "hiking", "score": 1.0}]
    since = (await call(gw, "GET", path, U1, params={"since": now_week})).json()["data"]
    assert [w["week"] for w in since] == [now_week]
    # A date selects up to the end of its ISO week: the stored week's own day (a day
    # later would be the next week whenever that day is a Sunday).
    until = await call(gw, "GET", path, U1, params={"until": earlier.date().isoformat()})
    assert [w["week"] for w in until.json()["data"]] == [iso_week(earlier)]
    assert error(await call(gw, "GET", path, U1, params={"since": "soon"}), 400)["param"] \
        == "since"
    backwards = await call(gw, "GET", path, U1, params={"since": now_week,
                                                         "until": iso_week(earlier)})
    assert error(backwards, 400)["param"] == "since"
    assert [w["week"] for w in (await call(gw, "GET", path, U2)).json()["data"]] == [now_week]
    assert (await call(gw, "DELETE", "/v1/me", U1, params={"confirm": "true"})).status_code \
        == 200
    assert await gw.res.store.profile_history("tenant-a", "u1") == []


async def test_weeks_without_a_snapshot_repeat_the_last_one_before(gw: Gateway) -> None:
    """Snapshots nine and six weeks ago (W40 and W43 when this week is W49): W41 and W42
    repeat W40's traits, topics and scores, W44 to W48 repeat W43's, and the current week
    is the live profile (empty here: nothing learned); a range starting before the first
    snapshot starts at it, one ending before it is empty; another user gets only their
    live week."""
    path, now = "/v1/profile/history", datetime.now(UTC)
    ago = [now - timedelta(weeks=n) for n in range(10)]
    for n, trait in ((9, "curious"), (6, "calm")):
        await gw.res.store.apply(ChangeSet(
            tenant="tenant-a", user_id="u1", batch_key=f"week-{n}", snapshot=ProfileWeek(
                tenant="tenant-a", user_id="u1", week=iso_week(ago[n]), at=ago[n],
                traits=(WeightedTag(trait, 1.5),), topics=(WeightedTag("chess", 0.5),))))
    response = await call(gw, "GET", path, U1, params={"since": iso_week(now - timedelta(
        weeks=20)), "until": iso_week(ago[5])})
    assert response.status_code == 200, response.text
    weeks = response.json()["data"]
    assert [w["week"] for w in weeks] == [iso_week(ago[n]) for n in range(9, 4, -1)]
    assert [w["traits"] for w in weeks] == \
        [[{"text": "curious", "score": 1.5}]] * 3 + [[{"text": "calm", "score": 1.5}]] * 2
    assert all(w["topics"] == [{"text": "chess", "score": 0.5}] for w in weeks)
    everything = (await call(gw, "GET", path, U1)).json()["data"]
    assert [w["week"] for w in everything] == [iso_week(ago[n]) for n in range(9, -1, -1)]
    assert everything[-1] == {"week": iso_week(now), "traits": [], "topics": []}
    assert [w["traits"][0]["text"] for w in everything[3:-1]] == ["calm"] * 6
    before = await call(gw, "GET", path, U1, params={"until": iso_week(ago[9] - timedelta(
        weeks=1))})
    assert before.json()["data"] == []
    assert [w["week"] for w in (await call(gw, "GET", path, U2)).json()["data"]] == \
        [iso_week(now)]


async def test_a_conflict_overtaken_by_a_later_fact_is_not_settled(
        gw: Gateway, upstream: FakeUpstream) -> None:
    """An open pair whose old fact a later fact then superseded: reversing (or confirming)
    it is a 409 ``conflict_stale`` that changes nothing, so two contradicting facts never
    end up active at once; the later supersede's own pair still settles."""
    await learn(gw, upstream, "I live in Lisbon.", fact("Lives in Lisbon"))
    await learn_with_ids(gw, upstream, "Porto maybe?", lambda ids: fact(
        "Lives in Porto", contradicts=[ids["Lives in Lisbon"]]))
    await learn_with_ids(gw, upstream, "I moved to Berlin.", lambda ids: fact(
        "Lives in Berlin", supersedes=[ids["Lives in Lisbon"]]))
    pairs = {c["successor"]["content"]: c for c in await conflicts(gw, status="all")}
    stale = pairs["Lives in Porto"]
    for action in ("reverse", "confirm"):
        refused = await call(gw, "POST", f"/v1/memories/conflicts/{stale['id']}/{action}", U1)
        assert error(refused, 409)["code"] == "conflict_stale"
    listed = await call(gw, "GET", "/v1/memories", U1, params={"include_retired": "true"})
    active = {m["content"] for m in listed.json()["data"] if m["superseded_at"] is None}
    assert "Lives in Lisbon" not in active
    assert "Lives in Berlin" in active
    fresh = pairs["Lives in Berlin"]
    settled = await call(gw, "POST", f"/v1/memories/conflicts/{fresh['id']}/confirm", U1)
    assert settled.status_code == 200, settled.text
