"""Erasure in the Redis learning queue: the erased user's lines out of the tenant's group
buffers and sealed group batches (docs/design.md#erasure).

Group buffers live under each group's namespace token, which names no tenant; they are
found through the ``idle`` index (every non-empty buffer has an entry there:
:mod:`proxy.backends.redis.sweep`) and the queued ``learn`` jobs (every sealed batch
awaiting learning has one, or an outbox entry next to the group's buffers). Each buffer or
batch hash is rewritten in an optimistic transaction: the user's lines' fields go, its
``order`` (and a buffer's counters and bounds) is recomputed, an emptied hash is deleted.
:func:`user_jobs` finds the queued jobs that name an erased user, which the queue then
deletes.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis.client import multi, transact
from proxy.backends.redis.keys import KeyLayout
from proxy.learning.jobs import names_user, read_learn
from proxy.learning.queue import SpokenBy
from proxy.settings import GROUP_PREFIX

PAGE = 1000  # index entries and job payloads read per round trip


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class GroupLines:
    """Finds and removes an erased user's lines in group buffers and batches."""

    def __init__(self, client: Redis, keys: KeyLayout) -> None:
        self._redis = client
        self._keys = keys

    async def erase(self, tenant: str, spoken: SpokenBy) -> tuple[int, int]:
        """Remove the lines ``spoken`` says are the user's from every group buffer and
        sealed batch of ``tenant``. Returns (lines removed, of them unsealed)."""
        removed = unsealed = 0
        buffers, batches = await self._candidates()
        for key in buffers:
            gone = await self._rewrite(key, tenant, spoken, buffer=True)
            removed, unsealed = removed + gone, unsealed + gone
        for key in batches:
            removed += await self._rewrite(key, tenant, spoken, buffer=False)
        return removed, unsealed

    async def _candidates(self) -> tuple[list[str], list[str]]:
        """Buffer keys of every indexed conversation, and the batch keys of every group
        namespace seen there or in a queued ``learn`` job."""
        namespaces: set[str] = set()
        buffers: list[str] = []
        async for member, _ in self._redis.zscan_iter(self._keys.queue("idle"), count=PAGE):
            ns, _, cd = _text(member).partition(":")
            namespaces.add(ns)
            buffers.append(self._keys.buffer(ns, cd))
        async for _, payload in self._redis.hscan_iter(self._keys.queue("payloads"),
                                                       count=PAGE):
            try:
                namespaces.add(read_learn(payload).rsplit(".", 1)[1])
            except (KeyError, IndexError, TypeError, ValueError, orjson.JSONDecodeError):
                continue  # not a learn job
        batches = []
        for ns in sorted(namespaces):
            digests = await self._redis.smembers(self._keys.sealed(ns))
            batches += [self._keys.batch(ns, _text(d)) for d in digests]
        return buffers, batches

    async def _rewrite(self, key: str, tenant: str, spoken: SpokenBy, *,
                       buffer: bool) -> int:
        async def body(pipe: Pipeline) -> int:
            meta = await pipe.hmget(key, ["tenant", "user", "conversation", "order"])
            owner, group, conversation, order = (_text(v) if v is not None else None
                                                 for v in meta)
            if owner != tenant or not group or not group.startswith(GROUP_PREFIX) \
                    or not order:
                return 0
            entries = [e for e in order.split("\n") if e]
            doomed = []
            for entry in entries:
                role, _, field = entry.split(" ", 2)
                raw = await pipe.hget(key, "m:" + field)
                line = orjson.loads(raw) if raw else {}
                if spoken(role, line.get("name"), line.get("sp")):
                    doomed.append(entry)
            if not doomed:
                return 0
            kept = [e for e in entries if e not in doomed]
            multi(pipe)
            pipe.hdel(key, *("m:" + e.split(" ", 2)[2] for e in doomed))
            if not kept:
                pipe.delete(key)
                _unlist(pipe, self._keys, key, conversation or "", buffer=buffer)
            else:
                pipe.hset(key, "order", "\n".join(kept))
                if buffer:
                    times = [float(e.split(" ", 2)[1]) for e in kept]
                    pipe.hset(key, mapping={"first": repr(min(times)),
                                            "last": repr(max(times))})
                    pipe.hincrby(key, "users", -len(doomed))
                    pipe.hincrby(key, "count", -len(doomed))
            await pipe.execute()
            return len(doomed)

        return await transact(self._redis, [key], body)


async def user_jobs(client: Redis, keys: KeyLayout, tenant: str, user: str,
                    ns: str) -> list[str]:
    """Ids of every queued job (any state) that names (tenant, user) — an exchange the user
    owns or spoke, a flush of the user (:func:`proxy.learning.jobs.names_user`) — or learns
    one of the user's batches (batch key ``<digest>.<ns>``, ``ns`` the user's namespace
    token). The kind is the id's first part (``exchange:``, ``flush:``, ``learn:`` —
    :mod:`proxy.learning.jobs`); one ``HSCAN`` of the payloads, :data:`PAGE` per round
    trip. Raises ``RedisError``."""
    found: list[str] = []
    async for raw_id, payload in client.hscan_iter(keys.queue("payloads"), count=PAGE):
        job_id = _text(raw_id)
        kind = job_id.split(":", 1)[0]
        if kind == "learn":
            try:
                mine = read_learn(payload).rsplit(".", 1)[-1] == ns
            except (KeyError, TypeError, ValueError, orjson.JSONDecodeError):
                mine = False
        else:
            mine = names_user(kind, payload, tenant, user)
        if mine:
            found.append(job_id)
    return found


def _unlist(pipe: Pipeline, keys: KeyLayout, key: str, conversation: str, *,
            buffer: bool) -> None:
    """Take an emptied buffer off its namespace's conversation set, or an emptied batch
    off its sealed set (its ``learn`` job then finds no batch and does nothing)."""
    ns = key.split("{", 1)[1].split("}", 1)[0]
    if buffer:
        pipe.srem(keys.buffers(ns), conversation)
    else:
        pipe.srem(keys.sealed(ns), key.rsplit(":", 1)[1])


__all__: Sequence[str] = ("GroupLines", "user_jobs")
