"""Whose memory a batch teaches: the private and the group owner strategies, and the one
place that picks between them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from proxy.learning.answers import ExtractionResult, ProfileUpdate
from proxy.learning.exchange import TranscriptMessage
from proxy.learning.owners import GroupOwners, PrivateOwners, owners_for
from proxy.learning.queue import Batch, batch_channel
from proxy.memory.records import ConversationRecord
from proxy.memory.store import AuditEvent, ChangeSet, UserSettings


def _batch(user: str, *names: str | None, channel: str | None = None) -> Batch:
    messages = tuple(TranscriptMessage(role="user", text=f"said by {n}", fingerprint=str(i),
                                       name=n) for i, n in enumerate(names))
    if channel is None:
        channel = user if user.startswith("group:") else "private"
    return Batch(key="b1", tenant="t", user=user, conversation="c", channel=channel,
                 model="m", messages=messages, oldest_at=100.0, newest_at=101.0)


class _Store:
    """Users by display name and their learning settings."""

    def __init__(self, named: dict[str, list[str]],
                 settings: dict[str, UserSettings] | None = None) -> None:
        self._named = named
        self._settings = settings or {}

    async def users_named(self, tenant: str, name: str) -> list[str]:
        return self._named.get(name, [])

    async def get_user_settings(self, tenant: str, user: str) -> UserSettings:
        return self._settings.get(user, UserSettings())


def _profile(style: str) -> ProfileUpdate:
    return ProfileUpdate(style=style, impression=None, traits=(), topics=())


@pytest.mark.parametrize(("user", "channel", "strategy"), [
    ("alice", "private", PrivateOwners),
    ("group:g1", "group:g1", GroupOwners),
    ("groupie", "private", PrivateOwners),
    # A user id spelled like a group's namespace, its turns recorded as private: private.
    ("group:g1", "private", PrivateOwners),
    # A group channel recorded under another namespace than the group's: private.
    ("alice", "group:g1", PrivateOwners),
    ("group:g2", "group:g1", PrivateOwners),
])
def test_the_recorded_channel_picks_the_strategy(user: str, channel: str,
                                                 strategy: type) -> None:
    """A batch is a group's only when its turns were recorded in that group's channel and
    buffered under its namespace; a user id's spelling alone never makes one."""
    assert isinstance(owners_for(_batch(user, channel=channel)), strategy)


@pytest.mark.parametrize(("channels", "expected"), [
    (["private", "private"], "private"), (["group:g1", "group:g1"], "group:g1"),
    (["group:g1", "private"], "private"), (["private", "group:g1"], "private"),
    (["group:g1", "group:g2"], "private"), ([], "private"),
])
def test_a_batch_is_a_groups_only_when_every_line_was_said_there(channels: list[str],
                                                                 expected: str) -> None:
    assert batch_channel(channels) == expected


async def test_a_private_batch_teaches_its_user_unless_learning_is_off() -> None:
    """The private owner is the batch's user, keyed ``None``; switched off: nobody."""
    batch = _batch("alice", None)
    assert await PrivateOwners().resolve(batch, _Store({})) == {None: "alice"}  # type: ignore[arg-type]
    off = _Store({}, {"alice": UserSettings(enable_personal_learning=False)})
    assert await PrivateOwners().resolve(batch, off) == {}  # type: ignore[arg-type]


async def test_a_clear_after_the_batch_began_stops_its_learning() -> None:
    """A user who cleared their memory after the batch's oldest message is not taught."""
    cleared = _Store({}, {"alice": UserSettings(cleared_at=datetime.fromtimestamp(150, UTC))})
    assert await PrivateOwners().resolve(_batch("alice", None), cleared) == {}  # type: ignore[arg-type]


async def test_a_group_batch_teaches_each_participant_named_once() -> None:
    """Names resolving to exactly one user with learning on are owners; unknown,
    ambiguous and switched-off names are skipped."""
    store = _Store({"Ann": ["u-ann"], "Bob": ["u-bob1", "u-bob2"], "Cy": ["u-cy"]},
                   {"u-cy": UserSettings(enable_personal_learning=False)})
    batch = _batch("group:g1", "Ann", "Bob", "Cy", "Dee", "Ann")
    assert await GroupOwners().resolve(batch, store) == {"Ann": "u-ann"}  # type: ignore[arg-type]


def test_a_group_owner_has_their_own_lines_facts_and_profile() -> None:
    """Lines, facts and profile go to the participant by (normalised) name."""
    batch = _batch("group:g1", "Ann", "Bob", "ann")
    owners: dict[str | None, str] = {"Ann": "u-ann", "Bob": "u-bob"}
    group = GroupOwners()
    assert [m.fingerprint for m in group.spoken(batch, "Ann")] == ["0", "2"]
    assert group.owner_of("ANN", owners) == "u-ann"
    assert group.owner_of("Zed", owners) is None
    assert group.owner_of(None, owners) is None
    extraction = ExtractionResult(facts=(), profile=None, dropped=0, profiles=(
        ("Bob", _profile("terse")), ("ann", _profile("warm")), ("Ann", _profile("late"))))
    assert group.profile(extraction, "Ann") == _profile("warm")
    assert group.profile(extraction, "Cy") is None
    assert group.owner_key(batch, "u-ann") == "b1:u-ann"


def test_a_private_owner_has_every_line_and_the_one_profile() -> None:
    """In a private batch everything said is the user's."""
    batch = _batch("alice", None, "Nick")
    private = PrivateOwners()
    owners: dict[str | None, str] = {None: "alice"}
    assert len(private.spoken(batch, None)) == 2
    assert private.owner_of("anyone", owners) == "alice"
    assert private.labels(owners, {"alice": []}) == {}
    extraction = ExtractionResult(facts=(), profile=_profile("warm"), dropped=0)
    assert private.profile(extraction, None) == _profile("warm")
    assert private.owner_key(batch, "alice") == "b1"


def _changes(user: str, key: str) -> ChangeSet:
    event = AuditEvent(tenant="t", user_id=user, action="created", actor="auto",
                       at=datetime.fromtimestamp(0, UTC))
    return ChangeSet(tenant="t", user_id=user, batch_key=key, audit=(event,))


def _record() -> ConversationRecord:
    return ConversationRecord(tenant="t", user_id="x", conversation_id="c", score=0.5,
                              dimensions={}, reason="", learned_messages=1,
                              updated_at=datetime.fromtimestamp(0, UTC))


def test_a_private_batch_commits_in_one_change_set() -> None:
    """The user's change set carries the batch's audit and record, and closes it."""
    batch, record = _batch("alice"), _record()
    head = _changes("alice", "other")
    changes, closes = PrivateOwners().commit(_changes("alice", "b1"), batch=batch,
                                             audit=head.audit, record=record)
    assert closes
    assert (changes.batch_key, changes.conversation, len(changes.audit)) == ("b1", record, 2)
    assert PrivateOwners().closing(batch, audit=[], record=record) is None


def test_a_group_batch_commits_each_owner_then_the_batch() -> None:
    """Each participant's change set stands alone (no record); the batch's comes last."""
    batch, record = _batch("group:g1"), _record()
    own = _changes("u-ann", "b1:u-ann")
    changes, closes = GroupOwners().commit(own, batch=batch, audit=[], record=record)
    assert not closes
    assert (changes.batch_key, changes.conversation, changes.audit) == \
        ("b1:u-ann", None, own.audit)
    closing = GroupOwners().closing(batch, audit=list(own.audit), record=record)
    assert closing is not None
    assert (closing.user_id, closing.batch_key, closing.conversation) == \
        ("group:g1", "b1", record)
