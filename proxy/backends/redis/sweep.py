"""Indexes of the Redis learning queue's buffered work, and the sweeps that keep them true.

Buffers and seen sets live in each user's hash slot (:mod:`proxy.backends.redis.queue`);
finding them across users needs sorted sets in the queue's slot (layout:
:mod:`proxy.backends.redis.keys`):

- ``idle`` — ``<ns>:<cd>`` → newest unsealed message time of the conversation;
- ``aged`` — ``<ns>:<cd>`` → oldest unsealed message time;
- ``seen`` — ``<ns>`` → oldest fingerprint time of the user;
- ``buffered`` — a counter of unsealed messages (a gauge for :meth:`depth`).

They are **hints**, written after the user's data (``ZADD GT`` for newest, ``LT`` for
oldest): a reader verifies every candidate against the user's keys. The invariant that
matters — every non-empty buffer and seen set has an entry, scored no later than the
work it points at — survives races because a sweep that removes or re-scores an entry
then reads the data *again* and restores the entry with ``GT``/``LT``: a writer either
finished before that second read (which sees its data) or indexes itself after the removal.
Before it drops the entry of an emptied conversation, a sweep hands the user's outbox to
the queue (batches sealed by a worker that died before enqueueing their ``learn`` job).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis

from proxy.backends.redis import queue_lua as lua
from proxy.backends.redis.keys import KeyLayout

SWEEP_CHUNK = 500  # index entries verified per pipeline
_STATE_FIELDS = ["tenant", "user", "conversation", "users", "count", "first", "last"]

# (user token, batch keys found in the user's outbox) → enqueue what is due, clear them
Recover = Callable[[str, list[str]], Awaitable[None]]


def below(value: float) -> str:
    """An exclusive upper score bound for ``ZRANGEBYSCORE`` (``+inf`` for infinity)."""
    return "+inf" if math.isinf(value) and value > 0 else f"({value!r}"


def _chunks(items: Sequence[str], size: int = SWEEP_CHUNK) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


@dataclass(frozen=True, slots=True)
class Buffered:
    """What one conversation's buffer holds (times are epoch seconds, as buffered)."""

    tenant: str
    user: str
    conversation: str
    users: int  # unsealed user messages
    first: float  # oldest unsealed message
    last: float  # newest unsealed message

    @classmethod
    def parse(cls, row: list[bytes | None]) -> Buffered | None:
        """From ``HMGET`` of the fields above plus ``count``; ``None`` for an empty buffer."""
        tenant, user, conversation, users, count, first, last = row
        if not count or int(count) <= 0 or tenant is None or user is None \
                or conversation is None or first is None or last is None:
            return None
        return cls(tenant.decode(), user.decode(), conversation.decode(), int(users or 0),
                   float(first), float(last))


class BufferIndexes:
    """The ``idle``/``aged``/``seen`` hints and the ``buffered`` gauge of one queue."""

    def __init__(self, client: Redis, keys: KeyLayout, *, recover: Recover) -> None:
        self._redis = client
        self._keys = keys
        self._recover = recover
        self._idle, self._aged = keys.queue("idle"), keys.queue("aged")
        self._seen = keys.queue("seen")
        self.gauge = keys.queue("buffered")
        self._expire_buffer = client.register_script(lua.EXPIRE_BUFFER)

    # writers ---------------------------------------------------------------------------
    async def buffered(self, ns: str, cd: str, *, first: float | None, last: float | None,
                       oldest_seen: float | None, added: int) -> None:
        """After a buffer call on conversation ``cd`` of user ``ns`` added ``added``
        messages: its buffer spans ``first``…``last`` (``None``: empty) and the user's
        oldest fingerprint is from ``oldest_seen``. Idempotent, so a redelivered exchange
        repairs what a worker that died before this call left unindexed."""
        if first is None and last is None and oldest_seen is None and not added:
            return
        member = f"{ns}:{cd}"
        async with self._redis.pipeline(transaction=True) as pipe:
            if last is not None:
                pipe.zadd(self._idle, {member: last}, gt=True)
            if first is not None:
                pipe.zadd(self._aged, {member: first}, lt=True)
            if oldest_seen is not None:
                pipe.zadd(self._seen, {ns: oldest_seen}, lt=True)
            if added:
                pipe.incrby(self.gauge, added)
            await pipe.execute()

    async def fingerprinted(self, ns: str, oldest_seen: float) -> None:
        """After fingerprints of user ``ns`` were recorded; the oldest is from
        ``oldest_seen``."""
        await self._redis.zadd(self._seen, {ns: oldest_seen}, lt=True)

    async def unbuffered(self, removed: int) -> None:
        """After ``removed`` messages left the buffers (sealed or deleted)."""
        if removed:
            await self._redis.incrby(self.gauge, -removed)

    # sweeps ----------------------------------------------------------------------------
    async def idle(self, idle_before: float) -> list[tuple[str, str, str]]:
        """(tenant, user, conversation) whose newest unsealed message is older than
        ``idle_before`` and which hold a user message, verified; entries swept on the way."""
        out = []
        for chunk in _chunks(await self._members(self._idle, below(idle_before))):
            for state in await self._settle(chunk):
                if state is not None and state.users > 0 and state.last < idle_before:
                    out.append((state.tenant, state.user, state.conversation))
        return out

    async def expire_buffers(self, buffered_before: float) -> int:
        """Delete unsealed messages older than ``buffered_before``; how many went."""
        removed = 0
        cutoff = repr(float(buffered_before))
        for chunk in _chunks(await self._members(self._aged, below(buffered_before))):
            async with self._redis.pipeline(transaction=False) as pipe:
                for member in chunk:
                    ns, cd = member.split(":", 1)
                    await self._expire_buffer(
                        keys=[self._keys.buffer(ns, cd), self._keys.buffers(ns)],
                        args=[cutoff], client=pipe)
                removed += sum(int(n) for n in await pipe.execute())
            await self._settle(chunk)
        await self.unbuffered(removed)
        return removed

    async def expire_seen(self, seen_before: float) -> None:
        """Forget fingerprints first seen before ``seen_before``, user by user."""
        bound = below(seen_before)
        for chunk in _chunks(await self._members(self._seen, bound)):
            async with self._redis.pipeline(transaction=False) as pipe:
                for ns in chunk:
                    pipe.zremrangebyscore(self._keys.seen(ns), "-inf", bound)
                await pipe.execute()
            async with self._redis.pipeline(transaction=True) as pipe:
                for ns, at in zip(chunk, await self._oldest_seen(chunk), strict=True):
                    if at is None:
                        pipe.zrem(self._seen, ns)
                    else:
                        pipe.zadd(self._seen, {ns: at})
                await pipe.execute()
            async with self._redis.pipeline(transaction=True) as pipe:
                for ns, at in zip(chunk, await self._oldest_seen(chunk), strict=True):
                    if at is not None:
                        pipe.zadd(self._seen, {ns: at}, lt=True)
                await pipe.execute()

    async def _members(self, index: str, bound: str) -> list[str]:
        found = cast(list[bytes], await self._redis.zrangebyscore(index, "-inf", bound))
        return [m.decode() for m in found]

    async def _states(self, members: list[str]) -> list[Buffered | None]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for member in members:
                ns, cd = member.split(":", 1)
                pipe.hmget(self._keys.buffer(ns, cd), _STATE_FIELDS)
            rows = await pipe.execute()
        return [Buffered.parse(row) for row in rows]

    async def _settle(self, members: list[str]) -> list[Buffered | None]:
        """Make the ``idle``/``aged`` entries of ``members`` match their buffers: hand the
        users' outboxes to the queue, drop entries of empty buffers and re-score the
        others, then read the buffers again and restore with ``GT``/``LT`` what a
        concurrent ``buffer`` wrote meanwhile. Returns the buffers as first read.

        The outboxes are read *after* the buffers: a buffer read as empty because a seal
        emptied it has that seal's outbox entry visible by then (the seal script writes
        both), so a batch whose sealer died is never orphaned by dropping its entry."""
        states = await self._states(members)
        namespaces = sorted({m.split(":", 1)[0] for m in members})
        async with self._redis.pipeline(transaction=False) as pipe:
            for ns in namespaces:
                pipe.smembers(self._keys.outbox(ns))
            outboxes = await pipe.execute()
        for ns, keys in zip(namespaces, outboxes, strict=True):
            if keys:
                await self._recover(ns, sorted(k.decode() for k in keys))
        async with self._redis.pipeline(transaction=True) as pipe:
            for member, state in zip(members, states, strict=True):
                if state is None:
                    pipe.zrem(self._idle, member)
                    pipe.zrem(self._aged, member)
                else:
                    pipe.zadd(self._idle, {member: state.last})
                    pipe.zadd(self._aged, {member: state.first})
            await pipe.execute()
        async with self._redis.pipeline(transaction=True) as pipe:
            for member, state in zip(members, await self._states(members), strict=True):
                if state is not None:
                    pipe.zadd(self._idle, {member: state.last}, gt=True)
                    pipe.zadd(self._aged, {member: state.first}, lt=True)
            await pipe.execute()
        return states

    async def _oldest_seen(self, namespaces: list[str]) -> list[float | None]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for ns in namespaces:
                pipe.zrange(self._keys.seen(ns), 0, 0, withscores=True)
            rows = await pipe.execute()
        return [float(row[0][1]) if row else None for row in rows]
