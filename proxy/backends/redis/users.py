"""A user's records besides memories, on Redis: profile, conversation records, settings
and tombstones (digests of deleted contents, never the text) — all in the user's hash
slot (:mod:`proxy.backends.redis.keys`) — and the tenant's display-name sets the user is
in (group attribution).

``queue_*`` methods add commands to a transaction the caller runs (``apply``, ``clear``);
the others are single commands. Errors are the caller's to translate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.changes import ChangeLog
from proxy.backends.redis.codec import (
    conversation_fields,
    conversation_from_hash,
    settings_fields,
    settings_from_hash,
)
from proxy.backends.redis.keys import KeyLayout, tenant_token, user_token
from proxy.memory.records import (
    MAX_SUMMARIES,
    ConversationRecord,
    Profile,
    from_iso,
    profile_from_json,
    profile_to_json,
    to_iso,
)
from proxy.memory.store import UserSettings
from proxy.memory.text import normalize


class UserRecords:
    """Profile, conversation records, settings and tombstones of users."""

    def __init__(self, client: Redis, layout: KeyLayout) -> None:
        self._redis = client
        self._keys = layout
        self._changes = ChangeLog(client, layout)

    # profile ---------------------------------------------------------------------------
    async def get_profile(self, tenant: str, user: str) -> Profile | None:
        raw = await self._redis.get(self._keys.profile(user_token(tenant, user)))
        return self.parsed_profile(tenant, user, raw)

    @staticmethod
    def parsed_profile(tenant: str, user: str, raw: bytes | str | None) -> Profile | None:
        """The profile stored as ``raw`` (``None``: none stored)."""
        return None if raw is None else profile_from_json(tenant, user, raw)

    async def put_profile(self, profile: Profile) -> None:
        key = self._keys.profile(user_token(profile.tenant, profile.user_id))
        await self._redis.set(key, profile_to_json(profile))

    def queue_profile(self, pipe: Pipeline, profile: Profile) -> None:
        key = self._keys.profile(user_token(profile.tenant, profile.user_id))
        pipe.set(key, profile_to_json(profile))

    # conversation records --------------------------------------------------------------
    async def get_conversation(self, tenant: str, user: str,
                               conversation_id: str) -> ConversationRecord | None:
        key = self._keys.conversation(user_token(tenant, user), conversation_id)
        data = await self._redis.hgetall(key)
        return conversation_from_hash(tenant, user, conversation_id, data) if data else None

    def queue_conversation(self, pipe: Pipeline, record: ConversationRecord,
                           dropped_summaries: Sequence[str] = ()) -> None:
        """Overwrite score, dimensions, reason, updated_at (and the summary when the record
        has one); add learned_messages; clear the summaries of ``dropped_summaries`` (the
        oldest beyond :data:`MAX_SUMMARIES`, from :meth:`summaries_to_drop`)."""
        ns = user_token(record.tenant, record.user_id)
        key = self._keys.conversation(ns, record.conversation_id)
        pipe.hset(key, mapping=conversation_fields(record))  # type: ignore[arg-type]
        pipe.hincrby(key, "learned_messages", record.learned_messages)
        pipe.sadd(self._keys.conversations(ns), record.conversation_id)
        if record.summary:
            pipe.zadd(self._keys.summaries(ns),
                      {record.conversation_id: record.updated_at.timestamp()})
        for conversation_id in dropped_summaries:
            pipe.hdel(self._keys.conversation(ns, conversation_id), "summary")
            pipe.zrem(self._keys.summaries(ns), conversation_id)

    async def summaries_to_drop(self, pipe: Pipeline, record: ConversationRecord) -> list[str]:
        """Conversations whose summary goes when ``record``'s is added (read in WATCH mode:
        the caller watches :meth:`KeyLayout.summaries`)."""
        if not record.summary:
            return []
        ns = user_token(record.tenant, record.user_id)
        members = await pipe.zrange(self._keys.summaries(ns), 0, -1)
        held = [_decode(c) for c in members if isinstance(c, bytes | str)]
        others = [c for c in held if c != record.conversation_id]
        excess = len(others) + 1 - MAX_SUMMARIES
        return others[:excess] if excess > 0 else []

    # settings --------------------------------------------------------------------------
    async def get_settings(self, tenant: str, user: str) -> UserSettings:
        return settings_from_hash(
            await self._redis.hgetall(self._keys.settings(user_token(tenant, user))))

    async def put_settings(self, tenant: str, user: str, settings: UserSettings) -> None:
        key = self._keys.settings(user_token(tenant, user))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=settings_fields(settings))  # type: ignore[arg-type]
            if settings.cleared_at is None:
                pipe.hdel(key, "cleared_at")
            else:
                pipe.hset(key, "cleared_at", to_iso(settings.cleared_at) or "")
            await pipe.execute()

    def queue_cleared(self, pipe: Pipeline, ns: str, at: datetime) -> None:
        """Stamp ``cleared_at``, keeping the user's switches, and move the namespace's
        memory generation (clear and erasure delete its memories in this transaction)."""
        pipe.hset(self._keys.settings(ns), "cleared_at", to_iso(at) or "")
        self._changes.queue(pipe, ns, None)

    # tombstones ------------------------------------------------------------------------
    # A tombstone is keyed by the SHA-256 of the deleted memory's normalised content: it
    # must recognise the fact if learning brings it back, but must not keep the text the
    # user asked to delete.
    def queue_tombstone(self, pipe: Pipeline, ns: str, norm: str, at: datetime) -> None:
        pipe.hset(self._keys.tombstones(ns), _digest(norm), to_iso(at) or "")

    async def tombstoned(self, tenant: str, user: str,
                         norms: Sequence[str]) -> dict[str, datetime]:
        if not norms:
            return {}
        values = await self._redis.hmget(self._keys.tombstones(user_token(tenant, user)),
                                         [_digest(n) for n in norms])
        return _deleted_at(norms, values)

    async def tombstoned_in(self, pipe: Pipeline, ns: str,
                            norms: Sequence[str]) -> dict[str, datetime]:
        """:meth:`tombstoned` through a pipeline in WATCH mode (immediate reads)."""
        if not norms:
            return {}
        values = await pipe.hmget(self._keys.tombstones(ns), [_digest(n) for n in norms])
        return _deleted_at(norms, values)

    # display names -----------------------------------------------------------------------
    async def bind_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        """Add ``user`` to the sets of each of ``names`` (normalised; empty ones skipped),
        and list those sets under the user."""
        keys = {normalize(n) for n in names if normalize(n)}
        if not keys:
            return
        name_keys = [self._keys.names(tenant_token(tenant), key) for key in keys]
        async with self._redis.pipeline(transaction=False) as pipe:
            for name_key in name_keys:
                pipe.sadd(name_key, user)
            pipe.sadd(self._keys.user_names(user_token(tenant, user)), *name_keys)
            pipe.sadd(self._keys.user_name_texts(user_token(tenant, user)), *keys)
            await pipe.execute()

    async def names_of(self, tenant: str, user: str) -> list[str]:
        """The normalised display names ``user`` was bound to, sorted."""
        found = await self._redis.smembers(self._keys.user_name_texts(user_token(tenant, user)))
        return sorted(_decode(n) for n in found)

    async def users_named(self, tenant: str, name: str) -> list[str]:
        """The users of ``tenant`` going by ``name`` (normalised), sorted."""
        key = normalize(name)
        if not key:
            return []
        members = await self._redis.smembers(self._keys.names(tenant_token(tenant), key))
        return sorted(_decode(m) for m in members)

    async def erase_names(self, tenant: str, user: str, names: Sequence[str]) -> None:
        """Remove ``user`` from the display-name sets listed under the user, and from
        those of ``names`` (the profile's names: bindings made before the per-user list
        was kept)."""
        listed = self._keys.user_names(user_token(tenant, user))
        keys = {_decode(k) for k in await self._redis.smembers(listed)}
        keys |= {self._keys.names(tenant_token(tenant), normalize(n))
                 for n in names if normalize(n)}
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.srem(key, user)
            pipe.unlink(listed, self._keys.user_name_texts(user_token(tenant, user)))
            await pipe.execute()


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _digest(norm: str) -> str:
    return hashlib.sha256(norm.encode()).hexdigest()


def _deleted_at(norms: Sequence[str], values: Sequence[Any]) -> dict[str, datetime]:
    """``norm → deletion time`` from an HMGET of the tombstone hash (``None`` = no tombstone)."""
    out: dict[str, datetime] = {}
    for norm, raw in zip(norms, values, strict=True):
        at = from_iso(raw.decode() if isinstance(raw, bytes) else raw)
        if at is not None:
            out[norm] = at
    return out
