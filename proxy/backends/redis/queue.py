""":class:`~proxy.learning.queue.LearningQueue` on Redis: Streams for jobs, one hash slot
per user for buffered messages.

Same semantics as :class:`~proxy.backends.sqlite.queue.SqliteLearningQueue` (one contract
suite, ``tests/learning/test_queue_contract.py``, runs on both), for several gateway pods
and ``memory-proxy worker`` processes sharing one Redis. Keys: the learning-queue part of
:mod:`proxy.backends.redis.keys`; scripts: :mod:`proxy.backends.redis.queue_lua`.

**Jobs.** All job keys share the tag ``{prefix}``, and every state change is one Lua script
over them, so it is atomic. A ready job is an entry (field ``id``) of the ``ready`` stream;
the consumer group ``workers`` hands it out (``XREADGROUP ... >``, oldest first) — a
``flush`` job's entry is in the ``flushes`` stream instead, read only when ``ready`` has
nothing to hand out, so idle flushes never hold up exchange and learn jobs — and from
then on it is a pending entry of the consumer that claimed it (the worker id). Its header
(kind, attempts, state, last error, stream entry) is JSON in the ``jobs`` hash, its payload
in ``payloads``. ``claim`` adds one to the attempt count in the header — so the count is
exact and survives redelivery — and records the lease's end (``now + lease_seconds`` of the
*holder*) in the ``leased`` sorted set; a later ``claim`` by anyone whose clock passed that
end takes the job over with ``XCLAIM`` (crash recovery). ``ack`` acknowledges and deletes
the entry and the job; ``retry`` does the same to the entry and parks the job in the
``delayed`` sorted set until it is due; ``claim`` promotes due jobs back to the stream
(inside the script, so two workers never promote one job twice); ``bury`` moves the job to
the ``dead`` sorted set with its last error; ``requeue`` revives it with no attempts.
``enqueue_many`` — the gateway's only call, one round trip — adds only job ids that are not
present in any state. Job times are the Redis server's clock (``TIME``), so workers on
machines whose clocks disagree still agree on leases and delays.

**Buffer.** A user's seen fingerprints (a sorted set: fingerprint → first seen), their
conversations' buffers, their sealed batches and their outbox share the user's tag (the
memory store's namespace token), so ``buffer`` — drop seen messages (and retried requests'
new messages, whose request keys live in the same set), record the others as seen, append
them, count unsealed user messages — is one script, as is ``seal``, which
moves the buffer's oldest messages (exactly those the caller named, so the batch key is
the deterministic :func:`~proxy.learning.queue.batch_key` of their fingerprints) into a
batch hash and writes the batch key into the user's **outbox** in the same step. A batch
key is ``<batch_key>.<namespace token>``: :meth:`load_batch` finds the slot from the key.

**Seal + enqueue, exactly once.** The ``learn`` job lives in the queue's slot, so in Redis
Cluster it cannot be written in the sealing transaction. Instead: (1) seal — batch and
outbox entry written by one script; (2) enqueue ``learn:<batch key>`` (ignored when
present); (3) remove the key from the outbox. A crash after (1) leaves the key in the
outbox. The conversation's entry in the ``idle`` index — written after every buffering and
removed only by a sweep (:mod:`proxy.backends.redis.sweep`), which first hands the user's
outbox back here to enqueue every key whose batch still exists — brings maintenance
(``idle_conversations``, every worker's ``maintenance_interval_seconds``) back to it once
the conversation has been quiet for ``idle_flush_seconds``. So no sealed batch is left
without a job. Enqueueing twice is harmless: a present job id is ignored, and a ``learn``
job whose batch was learned and dropped already finds no batch (``load_batch`` → ``None``)
and does nothing. No message is sealed twice — it leaves the buffer in the script that
seals it — and the store applies a batch key at most once, so a redelivered ``learn`` job
(lease ran out, retry) never applies its batch twice.

**Indexes.** Finding idle conversations, old buffered text and old fingerprints across
users takes sorted sets in the queue's slot; they are hints verified on every read
(:mod:`proxy.backends.redis.sweep`). Only the ``buffered`` gauge of :meth:`depth` can
drift, by a crash between a buffer script and its ``INCRBY``; it is clamped at zero.

**Durability.** Nothing is kept in a process: with Redis persistence on (AOF, or a managed
Redis) a restart of Redis, a gateway or a worker loses no job, message or batch. The queue's
keys have no TTL, so Redis must not evict them (``maxmemory-policy noeviction`` or a
``volatile-*`` policy). Every ``redis`` error surfaces as
:class:`~proxy.memory.store.StoreUnavailableError`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from proxy.backends.redis import queue_lua as lua
from proxy.backends.redis.client import (
    multi,
    require_resp2_bytes,
    transact,
    unavailable_on_redis_error,
)
from proxy.backends.redis.keys import KeyLayout, conversation_token, user_token
from proxy.backends.redis.queue_erasure import GroupLines, user_jobs
from proxy.backends.redis.sweep import BufferIndexes
from proxy.learning.exchange import RETRY_WINDOW_SECONDS, Exchange, TranscriptMessage
from proxy.learning.jobs import blank_exchange, learn_job
from proxy.learning.queue import (
    Batch,
    DeadLetter,
    Job,
    JobKind,
    JobState,
    NewJob,
    QueueDepth,
    SpokenBy,
    batch_channel,
    batch_key,
    kind_counts,
    line_speaker,
)
from proxy.memory.store import StoreUnavailableError

# Rewrites a job's payload only while the job exists (an ack meanwhile removed it).
_REPLACE_PAYLOAD_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""
MAX_ERROR_CHARS = 2000  # as the SQLite queue keeps
DEAD_PAGE = 500  # dead job ids read per round trip when listing one tenant's
HEADER_PAGE = 1000  # job headers read per round trip when counting jobs by kind
PROMOTE_PER_CLAIM = 100  # due delayed jobs moved to the stream by one claim, at most
# A seal names the messages it seals; when the buffer changed in between it is asked
# again with the new messages. Each retry means another writer sealed or expired the
# same conversation in the same milliseconds.
MAX_SEAL_ATTEMPTS = 16
# Stream consumers (one per worker process) that hold nothing and have not read for this
# long are deleted by expire(); a live worker reads every learning.poll_interval_seconds.
CONSUMER_IDLE_SECONDS = 3600.0
_BATCH_KEY = re.compile(r"^(b_[0-9a-f]{32})\.([us][0-9a-f]{24})$")


def redis_batch_key(fingerprints: list[str], conversation: str, ns: str) -> str:
    """``<batch_key>.<ns>``: deterministic from the messages, and names the user's slot."""
    return f"{batch_key(fingerprints, conversation)}.{ns}"


def _scope(tenant: str | None) -> str:
    """The dead-job scripts' tenant argument: ``=<tenant>``, or ``''`` for any tenant."""
    return "" if tenant is None else "=" + tenant


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisLearningQueue:
    """The learning queue on one ``redis.asyncio`` client (RESP2, bytes — see
    :func:`proxy.backends.redis.client.connect`), which the caller owns and closes; keys start with
    ``key_prefix`` (``storage.key_prefix``). ``consumer_idle_seconds``: stream consumers
    holding no job and silent that long are deleted by :meth:`expire`."""

    def __init__(self, client: Redis, *, key_prefix: str = "mp",
                 consumer_idle_seconds: float = CONSUMER_IDLE_SECONDS) -> None:
        require_resp2_bytes(client)
        self._redis = client
        self._consumer_idle_ms = int(consumer_idle_seconds * 1000)
        self._keys = KeyLayout(key_prefix)
        self._jobs = [self._keys.queue(name) for name in
                      ("ready", "jobs", "payloads", "delayed", "leased", "dead",
                                   "flushes")]
        # The tenants with budget-postponed jobs (postponed_tenants): kept by RETRY with
        # a refund and by RESUME_POSTPONED, in the scripts that move the jobs.
        self._postponed = [*self._jobs, self._keys.queue("postponed")]
        self._sweep = BufferIndexes(client, self._keys, recover=self._recover)
        script = client.register_script
        self._enqueue, self._claim = script(lua.ENQUEUE), script(lua.CLAIM)
        self._ack, self._retry, self._bury = script(lua.ACK), script(lua.RETRY), script(lua.BURY)
        self._resume = script(lua.RESUME_POSTPONED)
        self._requeue, self._depth = script(lua.REQUEUE), script(lua.DEPTH)
        self._drop = script(lua.DROP)
        self._prune = script(lua.PRUNE_CONSUMERS)
        self._buffer, self._seal = script(lua.BUFFER), script(lua.SEAL)
        self._replace_payload = script(_REPLACE_PAYLOAD_LUA)
        self._release, self._oldest = script(lua.RELEASE), script(lua.OLDEST)

    # jobs ------------------------------------------------------------------------------
    async def enqueue(self, kind: JobKind, job_id: str, payload: bytes, *,
                      tenant: str | None) -> None:
        await self.enqueue_many([NewJob(kind, job_id, payload, tenant)])

    async def enqueue_many(self, jobs: list[NewJob]) -> None:
        """All of ``jobs`` in one script (one round trip); ids already present are skipped."""
        if not jobs:
            return
        args: list[str | bytes] = []
        for kind, job_id, payload, tenant in jobs:
            args += [kind, job_id, payload, tenant or ""]
        with unavailable_on_redis_error("learning queue enqueue"):
            await self._enqueue(keys=self._jobs, args=args)

    async def claim(self, worker: str, *, lease_seconds: float) -> Job | None:
        with unavailable_on_redis_error("learning queue claim"):
            got = await self._claim(keys=self._jobs,
                                    args=[worker, repr(float(lease_seconds)), PROMOTE_PER_CLAIM])
        if not got:
            return None
        job_id, kind, payload, attempts = got
        return Job(id=_text(job_id), kind=cast(JobKind, _text(kind)), payload=bytes(payload),
                   attempts=int(attempts))

    async def ack(self, job: Job) -> None:
        with unavailable_on_redis_error("learning queue ack"):
            await self._ack(keys=self._jobs, args=[job.id])

    async def retry(self, job: Job, *, error: str, delay_seconds: float) -> None:
        with unavailable_on_redis_error("learning queue retry"):
            await self._retry(keys=self._jobs, args=[job.id, error[:MAX_ERROR_CHARS],
                                                     repr(float(delay_seconds))])

    async def bury(self, job: Job, *, error: str) -> None:
        with unavailable_on_redis_error("learning queue bury"):
            await self._bury(keys=self._jobs, args=[job.id, error[:MAX_ERROR_CHARS]])

    async def requeue(self, job_id: str, *, tenant: str | None = None) -> bool:
        with unavailable_on_redis_error("learning queue requeue"):
            return bool(await self._requeue(keys=self._jobs, args=[job_id, _scope(tenant)]))

    async def drop(self, job_id: str, *, tenant: str | None = None) -> bool:
        with unavailable_on_redis_error("learning queue drop"):
            return bool(await self._drop(keys=self._jobs, args=[job_id, _scope(tenant)]))

    async def dead_letters(self, *, limit: int = 100,
                           tenant: str | None = None) -> list[DeadLetter]:
        """Newest first. With ``tenant`` the ``dead`` set is read in pages of
        :data:`DEAD_PAGE` until ``limit`` of the tenant's jobs are found."""
        if limit <= 0:
            return []
        out: list[DeadLetter] = []
        start = 0
        while len(out) < limit:
            with unavailable_on_redis_error("learning queue dead letters"):
                dead = cast(list[tuple[bytes, float]], await self._redis.zrevrange(
                    self._keys.queue("dead"), start, start + DEAD_PAGE - 1, withscores=True))
                if not dead:
                    break
                headers = cast(list[bytes | None], await self._redis.hmget(
                    self._keys.queue("jobs"), [i for i, _ in dead]))
            start += len(dead)
            for (job_id, failed_at), raw in zip(dead, headers, strict=True):
                if raw is None:
                    continue
                header = orjson.loads(raw)
                owner = header.get("tenant") or None
                if tenant is not None and owner != tenant:
                    continue
                out.append(DeadLetter(id=_text(job_id), kind=header["kind"],
                                      attempts=int(header["attempts"]),
                                      last_error=header.get("error") or "",
                                      failed_at=float(failed_at), tenant=owner))
            if len(dead) < DEAD_PAGE:
                break
        return out[:limit]

    async def depth(self) -> QueueDepth:
        with unavailable_on_redis_error("learning queue depth"):
            ready, delayed, leased, dead, buffered = await self._depth(
                keys=[*self._jobs, self._sweep.gauge], args=[])
        return QueueDepth(ready=int(ready), delayed=int(delayed), leased=int(leased),
                          dead=int(dead), buffered_messages=max(0, int(buffered)))

    async def depth_by_kind(self) -> dict[tuple[JobKind, JobState], int]:
        """Counted from the job headers (``HSCAN`` in pages of :data:`HEADER_PAGE`, so Redis
        is never blocked by a long backlog); a delayed job due by the server's clock counts
        as ready, as in :meth:`depth`. Jobs changing state meanwhile may be counted in
        either state."""
        counts = kind_counts()
        with unavailable_on_redis_error("learning queue depth by kind"):
            seconds, micros = await self._redis.time()
            now = seconds + micros / 1_000_000
            async for _, raw in self._redis.hscan_iter(self._keys.queue("jobs"),
                                                       count=HEADER_PAGE):
                header = orjson.loads(raw)
                state = header.get("state")
                if state == "delayed" and float(header.get("available") or 0) <= now:
                    state = "ready"
                if (header.get("kind"), state) in counts:
                    counts[(header["kind"], state)] += 1
        return counts

    # buffer ----------------------------------------------------------------------------
    async def buffer(self, exchange: Exchange, *, batch_size: int, now: float) -> str | None:
        if not exchange.messages:
            return None
        ns = user_token(exchange.tenant, exchange.user)
        cd = conversation_token(exchange.conversation)
        channel = exchange.channel if exchange.group is None else f"group:{exchange.group}"
        args: list[str | bytes | int] = [
            repr(float(now)), batch_size, exchange.tenant, exchange.user,
            exchange.conversation, repr(float(exchange.at)), repr(RETRY_WINDOW_SECONDS)]
        for m in exchange.messages:
            line = {"role": m.role, "name": m.name, "text": m.text, "fp": m.fingerprint,
                    "images": list(m.images), "model": exchange.model, "at": exchange.at,
                    "channel": channel}
            speaker = line_speaker(exchange, m)
            if speaker is not None:
                line["sp"] = speaker
            args += [m.fingerprint, m.role, orjson.dumps(line), m.request or "",
                     "1" if m.new else "", " ".join(m.aliases)]
        with unavailable_on_redis_error("learning queue buffer"):
            got = await self._buffer(keys=[self._keys.seen(ns), self._keys.buffer(ns, cd),
                                           self._keys.buffers(ns)], args=args)
            added, first, last, oldest = int(got[0]), got[1], got[2], got[3]
            await self._sweep.buffered(
                ns, cd, first=float(first) if first else None,
                last=float(last) if last else None,
                oldest_seen=float(oldest) if oldest else None, added=added)
            if not added or len(got) < 5:
                return None
            return await self._seal_head(ns, cd, exchange.tenant, exchange.conversation,
                                         _text(got[4]), minimum=batch_size)

    async def mark_seen(self, exchange: Exchange, *, now: float) -> None:
        if not exchange.messages:
            return
        ns = user_token(exchange.tenant, exchange.user)
        seen = self._keys.seen(ns)
        with unavailable_on_redis_error("learning queue mark_seen"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.zadd(seen, {m.fingerprint: now for m in exchange.messages}, nx=True)
                pipe.zrange(seen, 0, 0, withscores=True)
                _, oldest = await pipe.execute()
            await self._sweep.fingerprinted(ns, float(oldest[0][1]))

    async def seal(self, tenant: str, user: str, conversation: str, *, now: float) -> str | None:
        del now  # the learn job's times are the Redis server's clock
        ns, cd = user_token(tenant, user), conversation_token(conversation)
        with unavailable_on_redis_error("learning queue seal"):
            order = await self._redis.hget(self._keys.buffer(ns, cd), "order")
            if not order:
                return None
            return await self._seal_head(ns, cd, tenant, conversation, _text(order),
                                         minimum=0)

    async def _seal_head(self, ns: str, cd: str, tenant: str, conversation: str, order: str,
                         *, minimum: int) -> str | None:
        """Seal the messages listed in ``order`` (the buffer's ``order`` text) if they hold
        at least ``minimum`` user messages, then enqueue the batch's ``learn`` job and clear
        its outbox entry. Returns the batch key, or ``None`` when there is nothing to seal.
        """
        for _ in range(MAX_SEAL_ATTEMPTS):
            entries = [e for e in order.split("\n") if e]
            if not entries or sum(e.startswith("user ") for e in entries) < minimum:
                return None
            key = redis_batch_key([e.split(" ", 2)[2] for e in entries], conversation, ns)
            digest = key[2:34]
            done, detail = await self._seal(
                keys=[self._keys.buffer(ns, cd), self._keys.batch(ns, digest),
                      self._keys.buffers(ns), self._keys.sealed(ns), self._keys.outbox(ns)],
                args=[key, digest, "\n".join(entries)])
            if int(done):
                await self._publish(ns, [(key, tenant)])
                await self._sweep.unbuffered(int(detail))
                return key
            order = _text(detail)
        raise StoreUnavailableError(f"redis learning queue: gave up sealing after "
                                    f"{MAX_SEAL_ATTEMPTS} concurrent changes; retry later")

    async def _publish(self, ns: str, batches: list[tuple[str, str]]) -> None:
        """Enqueue the ``learn`` jobs of sealed batches (key, tenant), then take them off
        the outbox."""
        await self.enqueue_many([learn_job(k, t) for k, t in batches])
        await self._redis.srem(self._keys.outbox(ns), *(k for k, _ in batches))

    async def buffered_conversations(self, tenant: str, user: str) -> list[str]:
        with unavailable_on_redis_error("learning queue buffered_conversations"):
            found = await self._redis.smembers(self._keys.buffers(user_token(tenant, user)))
        return sorted(_text(c) for c in found)

    async def load_batch(self, key: str) -> Batch | None:
        parsed = _BATCH_KEY.match(key)
        if parsed is None:
            return None
        with unavailable_on_redis_error("learning queue load_batch"):
            data = cast(dict[bytes, bytes], await self._redis.hgetall(
                self._keys.batch(parsed.group(2), parsed.group(1)[2:])))
        if not data or b"order" not in data:
            return None
        rows: list[dict[str, Any]] = []
        for entry in data[b"order"].decode().split("\n"):
            body = data.get(b"m:" + entry.split(" ", 2)[2].encode())
            if body is not None:
                rows.append(orjson.loads(body))
        if not rows:
            return None
        return Batch(
            key=key, tenant=data[b"tenant"].decode(), user=data[b"user"].decode(),
            conversation=data[b"conversation"].decode(),
            channel=batch_channel([r["channel"] for r in rows]),
            model=rows[-1]["model"],
            messages=tuple(TranscriptMessage(role=r["role"], text=r["text"], fingerprint=r["fp"],
                                             name=r["name"], images=tuple(r["images"]))
                           for r in rows),
            oldest_at=min(float(r["at"]) for r in rows),
            newest_at=max(float(r["at"]) for r in rows),
        )

    async def drop_batch(self, key: str) -> None:
        parsed = _BATCH_KEY.match(key)
        if parsed is None:
            return
        digest, ns = parsed.group(1)[2:], parsed.group(2)
        with unavailable_on_redis_error("learning queue drop_batch"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(self._keys.batch(ns, digest))
                pipe.srem(self._keys.sealed(ns), digest)
                pipe.srem(self._keys.outbox(ns), key)
                await pipe.execute()

    async def forget_user(self, tenant: str, user: str) -> None:
        ns = user_token(tenant, user)
        buffers, sealed = self._keys.buffers(ns), self._keys.sealed(ns)

        async def body(pipe: Pipeline) -> int:
            conversations = [_text(c) for c in await pipe.smembers(buffers)]
            digests = [_text(d) for d in await pipe.smembers(sealed)]
            keys = [self._keys.buffer(ns, conversation_token(c)) for c in conversations]
            if keys:
                await pipe.watch(*keys)
            counts = [await pipe.hget(k, "count") for k in keys]
            multi(pipe)
            pipe.delete(buffers, sealed, self._keys.outbox(ns), *keys,
                        *(self._keys.batch(ns, d) for d in digests))
            await pipe.execute()
            return sum(int(c or 0) for c in counts)

        with unavailable_on_redis_error("learning queue forget_user"):
            removed = await transact(self._redis, [buffers, sealed], body)
            await self._sweep.unbuffered(removed)

    async def erase_user(self, tenant: str, user: str, *, names: Sequence[str]) -> int:
        """:meth:`~proxy.learning.queue.LearningQueue.erase_user`: own buffers, seen set
        and its index entry, group lines (:mod:`proxy.backends.redis.queue_erasure`),
        then the queued jobs naming the user, each deleted as an ack deletes it."""
        await self.forget_user(tenant, user)
        ns = user_token(tenant, user)
        with unavailable_on_redis_error("learning queue erase_user"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(self._keys.seen(ns))
                pipe.zrem(self._keys.queue("seen"), ns)
                await pipe.execute()
            removed, unsealed = await GroupLines(self._redis, self._keys).erase(
                tenant, SpokenBy(user, names))
            await self._sweep.unbuffered(unsealed)
            for job_id in await user_jobs(self._redis, self._keys, tenant, user, ns):
                await self._ack(keys=self._jobs, args=[job_id])
        return removed

    async def scrub_user(self, tenant: str, user: str) -> int:
        """:meth:`~proxy.learning.queue.LearningQueue.scrub_user`: ``HSCAN`` of the
        payloads (every queued job), each rewrite atomic and only while the job exists."""
        payloads = self._keys.queue("payloads")
        rewritten = 0
        with unavailable_on_redis_error("learning queue scrub_user"):
            async for job_id, payload in self._redis.hscan_iter(payloads, count=1000):
                blank = blank_exchange(payload, tenant, user)
                if blank is not None:
                    rewritten += int(await self._replace_payload(keys=[payloads],
                                                                 args=[job_id, blank]))
        return rewritten

    # maintenance -----------------------------------------------------------------------
    async def idle_conversations(self, *, idle_before: float) -> list[tuple[str, str, str]]:
        """Verified against the buffers; stale index entries are cleaned on the way, and
        batches left in an outbox by a crash get their ``learn`` job."""
        with unavailable_on_redis_error("learning queue idle_conversations"):
            return await self._sweep.idle(idle_before)

    async def expire(self, *, buffered_before: float, seen_before: float) -> int:
        """Delete unsealed messages with ``at`` before ``buffered_before`` and fingerprints
        first seen before ``seen_before``; prune idle stream consumers. Returns how many
        messages went."""
        with unavailable_on_redis_error("learning queue expire"):
            removed = await self._sweep.expire_buffers(buffered_before)
            await self._sweep.expire_seen(seen_before)
            await self._prune(keys=self._jobs, args=[self._consumer_idle_ms])
        return removed

    async def _recover(self, ns: str, keys: list[str]) -> None:
        """Enqueue the ``learn`` jobs of outbox ``keys`` of ``ns`` whose batch still
        exists (a crash came between sealing and enqueueing), then clear them."""
        live: list[tuple[str, str]] = []
        for key in keys:
            parsed = _BATCH_KEY.match(key)
            if parsed is None:
                continue
            tenant = await self._redis.hget(self._keys.batch(ns, parsed.group(1)[2:]),
                                            "tenant")
            if tenant is not None:
                live.append((key, _text(tenant)))
        if live:
            await self._publish(ns, live)
        await self._redis.srem(self._keys.outbox(ns), *keys)

    # learning budgets --------------------------------------------------------------------
    async def postpone(self, job: Job, *, reason: str, delay_seconds: float) -> None:
        with unavailable_on_redis_error("learning queue postpone"):
            await self._retry(keys=self._postponed, args=[
                job.id, reason[:MAX_ERROR_CHARS], repr(float(delay_seconds)), "1"])

    async def resume_postponed(self, tenant: str) -> int:
        with unavailable_on_redis_error("learning queue resume_postponed"):
            return int(await self._resume(keys=self._postponed, args=[tenant]))

    async def postponed_tenants(self) -> list[str]:
        """One ``SMEMBERS`` of the ``postponed`` set (empty, and absent, while no job waits
        for a budget). Erasure and acknowledgements leave a tenant in it; the next
        :meth:`resume_postponed` of that tenant removes it."""
        with unavailable_on_redis_error("learning queue postponed_tenants"):
            members = await self._redis.smembers(self._keys.queue("postponed"))
        return sorted(_text(m) for m in members)

    # graceful shutdown and operations ------------------------------------------------
    async def release(self, job: Job) -> None:
        """Only this delivery is released (``job.attempts`` must match the header): a job
        whose lease ran out and that another worker claimed since is left to it."""
        with unavailable_on_redis_error("learning queue release"):
            await self._release(keys=self._jobs, args=[job.id, job.attempts])

    async def oldest_ready_age(self) -> float | None:
        with unavailable_on_redis_error("learning queue oldest_ready_age"):
            age = await self._oldest(keys=self._jobs, args=[])
        return None if not age else float(age)


__all__: Sequence[str] = ("RedisLearningQueue", "redis_batch_key")
