"""Whose memory a batch teaches: the owner strategy of private and group batches.

A private batch teaches its user (one owner, keyed ``None``). A group batch teaches each
participant whose display name resolves to exactly one user of the tenant who has learning
on — unknown or ambiguous names are skipped — and each fact goes to the participant the
model names as its ``speaker``. Which strategy a batch gets is decided in one place,
:func:`owners_for`, by the channel recorded with the batch's turns — never by how a user
id is spelled (ids starting with ``group:`` are refused as end users anyway:
:func:`~proxy.settings.reserved_user_id`).

The strategies differ in how the results are committed: a private batch is one change
set (its audit, its conversation record and the user's memories together); a group batch
commits each participant's memories in a change set of their own (batch key
``<batch>:<user>``, no conversation record), then the batch's audit and conversation
record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from proxy.learning.answers import ExtractionResult, ProfileUpdate
from proxy.learning.exchange import TranscriptMessage, group_namespace
from proxy.learning.policy import Switches
from proxy.learning.queue import Batch
from proxy.memory.records import ConversationRecord, Memory
from proxy.memory.store import AuditEvent, ChangeSet, MemoryStore
from proxy.memory.text import normalize
from proxy.settings import GROUP_PREFIX

Owners = dict[str | None, str]  # participant name (None: the private user) → user id


class OwnerStrategy(Protocol):
    """How one kind of batch maps to the users whose memory it teaches."""

    @property
    def group(self) -> bool:
        """Whether the extraction prompt is the group one (facts carry a speaker)."""
        ...

    async def resolve(self, batch: Batch, store: MemoryStore) -> Owners:
        """The owners who may learn from ``batch`` (empty: nobody)."""
        ...

    def spoken(self, batch: Batch, name: str | None) -> list[TranscriptMessage]:
        """The user messages of the owner under ``name``."""
        ...

    def owner_of(self, speaker: str | None, owners: Owners) -> str | None:
        """The owner of a fact (or image) said by ``speaker``; ``None``: nobody's."""
        ...

    def labels(self, owners: Owners,
               related: dict[str, list[Memory]]) -> dict[str, str | None]:
        """Memory id → participant name, to label the prompt's known memories."""
        ...

    def profile(self, extraction: ExtractionResult, name: str | None) -> ProfileUpdate | None:
        """The profile update the model answered for the owner under ``name``."""
        ...

    def owner_key(self, batch: Batch, owner: str) -> str:
        """The batch key of the owner's change set (the store applies each once)."""
        ...

    def commit(self, changes: ChangeSet, *, batch: Batch, audit: Sequence[AuditEvent],
               record: ConversationRecord) -> tuple[ChangeSet, bool]:
        """The owner's change set as applied, and whether it closes the batch (its audit
        and record in it: nothing follows)."""
        ...

    def closing(self, batch: Batch, *, audit: Sequence[AuditEvent],
                record: ConversationRecord) -> ChangeSet | None:
        """The change set closing the batch after every owner's, unless one closed it."""
        ...


async def may_learn(store: MemoryStore, tenant: str, user: str, batch: Batch) -> bool:
    """Whether ``user`` has learning on and has not cleared their memory since the batch's
    oldest message."""
    prefs = await store.get_user_settings(tenant, user)
    return Switches().with_user(prefs).learns(said_at=batch.oldest_at)


class PrivateOwners:
    """A private batch: the batch's user, everything in one change set."""

    group = False

    async def resolve(self, batch: Batch, store: MemoryStore) -> Owners:
        return {None: batch.user} if await may_learn(store, batch.tenant, batch.user, batch) \
            else {}

    def spoken(self, batch: Batch,
               name: str | None) -> list[TranscriptMessage]:  # noqa: ARG002 - strategy signature
        return list(batch.user_messages)

    def owner_of(self, speaker: str | None,  # noqa: ARG002 - strategy signature
                 owners: Owners) -> str | None:
        return owners.get(None)

    def labels(self, owners: Owners,  # noqa: ARG002 - strategy signature
               related: dict[str, list[Memory]],  # noqa: ARG002 - strategy signature
               ) -> dict[str, str | None]:
        return {}

    def profile(self, extraction: ExtractionResult,
                name: str | None) -> ProfileUpdate | None:  # noqa: ARG002 - strategy signature
        return extraction.profile

    def owner_key(self, batch: Batch,
                  owner: str) -> str:  # noqa: ARG002 - strategy signature
        return batch.key

    def commit(self, changes: ChangeSet, *, batch: Batch, audit: Sequence[AuditEvent],
               record: ConversationRecord) -> tuple[ChangeSet, bool]:
        return ChangeSet(
            tenant=changes.tenant, user_id=changes.user_id, batch_key=batch.key,
            upserts=changes.upserts, evidence=changes.evidence, profile=changes.profile,
            conversation=record, audit=(*audit, *changes.audit),
            learned_from=changes.learned_from, conflicts=changes.conflicts,
            snapshot=changes.snapshot,
        ), True

    def closing(self, batch: Batch, *,  # noqa: ARG002 - strategy signature
                audit: Sequence[AuditEvent],  # noqa: ARG002 - strategy signature
                record: ConversationRecord) -> ChangeSet | None:  # noqa: ARG002 - strategy signature
        return None


class GroupOwners:
    """A group batch: each resolved participant, a change set each, then the batch's."""

    group = True

    async def resolve(self, batch: Batch, store: MemoryStore) -> Owners:
        owners: Owners = {}
        for name in dict.fromkeys(m.name for m in batch.user_messages if m.name):
            users = await store.users_named(batch.tenant, name)
            if len(users) == 1 and await may_learn(store, batch.tenant, users[0], batch):
                owners[name] = users[0]
        return owners

    def spoken(self, batch: Batch, name: str | None) -> list[TranscriptMessage]:
        return [m for m in batch.user_messages if same_name(m.name, name)]

    def owner_of(self, speaker: str | None, owners: Owners) -> str | None:
        """The user a speaker's name names, when that name is one resolved participant."""
        if not speaker:
            return None
        for name, owner in owners.items():
            if same_name(name, speaker):
                return owner
        return None

    def labels(self, owners: Owners,
               related: dict[str, list[Memory]]) -> dict[str, str | None]:
        return {m.id: name for name, owner in owners.items() for m in related[owner]}

    def profile(self, extraction: ExtractionResult, name: str | None) -> ProfileUpdate | None:
        """The one answered under the participant's name (the first, should the model
        name them twice); ``None`` when there is none."""
        return next((update for speaker, update in extraction.profiles
                     if same_name(speaker, name)), None)

    def owner_key(self, batch: Batch, owner: str) -> str:
        return f"{batch.key}:{owner}"

    def commit(self, changes: ChangeSet, *,
               batch: Batch,  # noqa: ARG002 - strategy signature
               audit: Sequence[AuditEvent],  # noqa: ARG002 - strategy signature
               record: ConversationRecord) -> tuple[ChangeSet, bool]:  # noqa: ARG002 - strategy signature
        return ChangeSet(
            tenant=changes.tenant, user_id=changes.user_id, batch_key=changes.batch_key,
            upserts=changes.upserts, evidence=changes.evidence, profile=changes.profile,
            conversation=None, audit=changes.audit, learned_from=changes.learned_from,
            conflicts=changes.conflicts, snapshot=changes.snapshot,
        ), False

    def closing(self, batch: Batch, *, audit: Sequence[AuditEvent],
                record: ConversationRecord) -> ChangeSet | None:
        return ChangeSet(tenant=batch.tenant, user_id=batch.user, batch_key=batch.key,
                         audit=tuple(audit), conversation=record)


def owners_for(batch: Batch) -> OwnerStrategy:
    """The owner strategy of ``batch``: the one place that tells group from private.

    A batch is a group's when every turn in it was recorded in a group channel
    (``batch.channel`` is ``group:<group id>``, :func:`~proxy.learning.queue.batch_channel`)
    and it was buffered under that group's namespace
    (:func:`~proxy.learning.exchange.group_namespace`); anything else is private, whatever
    its user id looks like."""
    channel = batch.channel
    grouped = channel.startswith(GROUP_PREFIX) and \
        group_namespace(channel.removeprefix(GROUP_PREFIX)) == batch.user
    return GroupOwners() if grouped else PrivateOwners()


def same_name(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and normalize(a) == normalize(b)
