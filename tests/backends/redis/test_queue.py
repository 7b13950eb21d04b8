"""What only the Redis queue has: hash slots, the outbox that makes seal + enqueue safe
across slots, self-cleaning indexes, consumer pruning and failure translation. (Behaviour
shared with SQLite is in test_queue_contract.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from proxy.backends.redis.client import connect
from proxy.backends.redis.keys import KeyLayout, conversation_token, user_token
from proxy.backends.redis.queue import RedisLearningQueue, redis_batch_key
from proxy.backends.redis.queue_lua import GROUP
from proxy.backends.redis.sweep import Buffered, BufferIndexes
from proxy.learning.exchange import Exchange, TranscriptMessage
from proxy.learning.queue import NewJob
from proxy.memory.store import StoreUnavailableError
from tests.redis_server import free_port

pytestmark = pytest.mark.redis


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    async with connect(redis_url) as redis:
        yield redis


def said(text: str, *, user: str = "u1", conversation: str = "c1") -> Exchange:
    return Exchange(id=text, tenant="t1", user=user, conversation=conversation,
                    channel="private", group=None, model="m", at=1000.0,
                    messages=(TranscriptMessage(role="user", text=text, fingerprint=text),))


class DiesBeforeEnqueueingLearnJobs(RedisLearningQueue):
    """A worker process killed between sealing a batch and enqueueing its learn job."""

    async def enqueue_many(self, jobs: list[NewJob]) -> None:
        if any(job.kind == "learn" for job in jobs):
            raise StoreUnavailableError("the process died here")
        await super().enqueue_many(jobs)


async def learn_jobs(queue: RedisLearningQueue) -> list[str]:
    out = []
    while (job := await queue.claim("w", lease_seconds=30)) is not None:
        out.append(orjson.loads(job.payload)["batch"])
        await queue.ack(job)
    return out


def test_each_operation_touches_one_hash_slot() -> None:
    """Job keys share one slot; a user's seen set, buffers, batches and outbox share
    another (Redis Cluster runs each script on one slot)."""
    keys = KeyLayout("mp")
    jobs = {key_slot(keys.queue(n).encode()) for n in
            ("ready", "jobs", "payloads", "delayed", "leased", "dead", "idle", "aged", "seen",
             "buffered")}
    ns = user_token("t1", "u1")
    user = {key_slot(k.encode()) for k in (
        keys.seen(ns), keys.buffer(ns, conversation_token("c1")),
        keys.buffer(ns, conversation_token("c2")), keys.buffers(ns), keys.batch(ns, "0" * 32),
        keys.sealed(ns), keys.outbox(ns))}
    assert len(jobs) == 1
    assert len(user) == 1
    assert key_slot(keys.seen(user_token("t1", "u2")).encode()) not in user | jobs


def test_batch_keys_name_their_user_and_are_deterministic() -> None:
    """A Redis batch key is <batch_key>.<user token>: same messages, same key."""
    ns = user_token("t1", "u1")
    key = redis_batch_key(["a", "b"], "c1", ns)
    assert key == redis_batch_key(["a", "b"], "c1", ns) != redis_batch_key(["b", "a"], "c1", ns)
    assert key.startswith("b_")
    assert key.endswith("." + ns)


async def test_a_batch_sealed_by_a_worker_that_died_gets_its_learn_job(
    client: Redis, redis_prefix: str,
) -> None:
    """A crash between sealing and enqueueing leaves the batch key in the user's outbox;
    the next maintenance pass (idle_conversations) enqueues its learn job, once."""
    dying = DiesBeforeEnqueueingLearnJobs(client, key_prefix=redis_prefix)
    with pytest.raises(StoreUnavailableError):
        await dying.buffer(said("I fly kites"), batch_size=1, now=1000)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    assert (await queue.depth()).ready == 0
    assert await queue.buffer(said("I fly kites"), batch_size=1, now=1001) is None  # seen
    assert await queue.idle_conversations(idle_before=float("inf")) == []
    [key] = await learn_jobs(queue)
    batch = await queue.load_batch(key)
    assert batch is not None
    assert [m.text for m in batch.messages] == ["I fly kites"]
    assert await queue.idle_conversations(idle_before=float("inf")) == []
    assert await learn_jobs(queue) == []


async def test_an_outbox_entry_of_a_learned_batch_enqueues_nothing(
    client: Redis, redis_prefix: str,
) -> None:
    """A crash after enqueueing but before clearing the outbox is harmless: once the batch
    was learned and dropped, recovery finds no batch and enqueues no job."""
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    key = await queue.buffer(said("I knit"), batch_size=1, now=1000)
    assert key is not None
    assert await learn_jobs(queue) == [key]
    await queue.drop_batch(key)
    ns = user_token("t1", "u1")
    await client.sadd(KeyLayout(redis_prefix).outbox(ns), key)  # the crash left it there
    assert await queue.idle_conversations(idle_before=float("inf")) == []
    assert await learn_jobs(queue) == []
    assert await client.scard(KeyLayout(redis_prefix).outbox(ns)) == 0


async def test_index_entries_of_emptied_buffers_are_removed(
    client: Redis, redis_prefix: str,
) -> None:
    """Sealing leaves the idle/aged entries behind as hints; the next maintenance pass
    removes them, and the seen index forgets users whose fingerprints all expired."""
    keys = KeyLayout(redis_prefix)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    await queue.buffer(said("one"), batch_size=5, now=1000)
    await queue.buffer(said("two", conversation="c2"), batch_size=5, now=1000)
    await queue.seal("t1", "u1", "c1", now=1001)
    assert await client.zcard(keys.queue("idle")) == 2
    assert await queue.idle_conversations(idle_before=float("inf")) == [("t1", "u1", "c2")]
    assert await client.zcard(keys.queue("idle")) == 1
    assert await queue.expire(buffered_before=float("inf"), seen_before=float("inf")) == 1
    for name in ("idle", "aged", "seen"):
        assert await client.zcard(keys.queue(name)) == 0
    assert (await queue.depth()).buffered_messages == 0


async def test_a_stale_index_score_is_corrected_by_the_sweep(
    client: Redis, redis_prefix: str,
) -> None:
    """An idle entry scored older than its buffer's newest message is verified against
    the buffer (not listed too early) and re-scored to the real time."""
    keys = KeyLayout(redis_prefix)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    await queue.buffer(said("still here"), batch_size=5, now=1000)
    member = f"{user_token('t1', 'u1')}:{conversation_token('c1')}"
    await client.zadd(keys.queue("idle"), {member: 0.0})
    assert await queue.idle_conversations(idle_before=500) == []
    assert await client.zscore(keys.queue("idle"), member) == 1000.0
    assert await queue.idle_conversations(idle_before=1000.5) == [("t1", "u1", "c1")]


class BufferWritesDuringTheSweep(BufferIndexes):
    """Interleaves a concurrent ``buffer`` right after the sweep's first read of the
    buffers, which therefore saw them empty."""

    def __init__(self, client: Redis, keys: KeyLayout, *, late: Exchange) -> None:
        super().__init__(client, keys, recover=nothing_to_recover)
        self._late: Exchange | None = late

    async def _states(self, members: list[str]) -> list[Buffered | None]:
        states = await super()._states(members)
        if self._late is not None:
            late, self._late = self._late, None
            await RedisLearningQueue(self._redis, key_prefix=self._keys.prefix).buffer(
                late, batch_size=5, now=late.at)
        return states


async def nothing_to_recover(ns: str, keys: list[str]) -> None:
    raise AssertionError("no outbox is expected here")


async def test_a_buffer_written_during_the_sweep_keeps_its_index_entries(
    client: Redis, redis_prefix: str,
) -> None:
    """When a message is buffered between the sweep reading a conversation as empty and
    removing its index entries, the sweep's second read restores them: the conversation is
    still flushed when idle and its text still expires."""
    keys = KeyLayout(redis_prefix)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    await queue.buffer(said("first"), batch_size=5, now=1000)
    await queue.seal("t1", "u1", "c1", now=1000)  # empty now; its entries are stale
    late = Exchange(id="late", tenant="t1", user="u1", conversation="c1", channel="private",
                    group=None, model="m", at=2000.0, messages=(
                        TranscriptMessage(role="user", text="late", fingerprint="late"),))
    racing = BufferWritesDuringTheSweep(client, keys, late=late)
    assert await racing.idle(float("inf")) == []  # it read the buffer as empty
    member = f"{user_token('t1', 'u1')}:{conversation_token('c1')}"
    assert await client.zscore(keys.queue("idle"), member) == 2000.0
    assert await client.zscore(keys.queue("aged"), member) == 2000.0
    assert await queue.idle_conversations(idle_before=2001) == [("t1", "u1", "c1")]
    assert await queue.expire(buffered_before=2001, seen_before=0) == 1


async def test_a_redelivered_exchange_repairs_indexes_a_dead_worker_did_not_write(
    client: Redis, redis_prefix: str,
) -> None:
    """A worker that died between buffering and indexing left messages no sweep can find;
    the redelivered exchange job (never acknowledged) indexes them again."""
    keys = KeyLayout(redis_prefix)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    await queue.buffer(said("orphan"), batch_size=5, now=1000)
    await client.delete(keys.queue("idle"), keys.queue("aged"), keys.queue("seen"))
    assert await queue.idle_conversations(idle_before=float("inf")) == []
    assert await queue.buffer(said("orphan"), batch_size=5, now=1500) is None
    assert await queue.idle_conversations(idle_before=float("inf")) == [("t1", "u1", "c1")]
    assert await queue.expire(buffered_before=float("inf"), seen_before=1001) == 1
    assert await client.zcard(keys.seen(user_token("t1", "u1"))) == 0


async def test_consumers_of_gone_workers_are_pruned(client: Redis, redis_prefix: str) -> None:
    """expire() deletes stream consumers that hold no job and stopped reading; a consumer
    holding a job stays, so its pending entry is kept for redelivery."""
    keys = KeyLayout(redis_prefix)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix, consumer_idle_seconds=0)
    await queue.enqueue("exchange", "j", b"", tenant="t")
    held = await queue.claim("busy", lease_seconds=30)
    assert held is not None
    assert await queue.claim("idle", lease_seconds=30) is None
    await queue.expire(buffered_before=0, seen_before=0)
    consumers = await client.xinfo_consumers(keys.queue("ready"), GROUP)
    assert [c["name"] for c in consumers] == [b"busy"]
    await queue.ack(held)
    await queue.expire(buffered_before=0, seen_before=0)
    assert await client.xinfo_consumers(keys.queue("ready"), GROUP) == []


async def test_a_pruned_holder_does_not_lose_its_job(client: Redis, redis_prefix: str) -> None:
    """If the holder's consumer is deleted anyway (an operator's XGROUP DELCONSUMER), the job
    is still redelivered when its lease ends."""
    keys = KeyLayout(redis_prefix)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    await queue.enqueue("learn", "j", b"p", tenant="t")
    assert await queue.claim("gone", lease_seconds=0.05) is not None
    await client.xgroup_delconsumer(keys.queue("ready"), GROUP, "gone")
    import asyncio

    await asyncio.sleep(0.1)
    again = await queue.claim("other", lease_seconds=30)
    assert again is not None
    assert (again.id, again.attempts) == ("j", 2)
    await queue.ack(again)
    assert await client.xlen(keys.queue("ready")) == 0


async def test_every_operation_reports_an_unreachable_redis_as_unavailable() -> None:
    """With Redis down each call raises StoreUnavailableError (the worker backs off,
    /readyz says degraded) rather than a redis exception."""
    async with connect(f"redis://127.0.0.1:{free_port()}/0") as down:
        queue = RedisLearningQueue(down, key_prefix="down")
        calls = [
            queue.enqueue_many([NewJob("exchange", "j", b"", "t")]),
            queue.claim("w", lease_seconds=1),
            queue.depth(),
            queue.dead_letters(),
            queue.buffer(said("x"), batch_size=1, now=0),
            queue.mark_seen(said("x"), now=0),
            queue.seal("t1", "u1", "c1", now=0),
            queue.load_batch(redis_batch_key(["x"], "c1", user_token("t1", "u1"))),
            queue.idle_conversations(idle_before=0),
            queue.expire(buffered_before=0, seen_before=0),
            queue.forget_user("t1", "u1"),
        ]
        for call in calls:
            with pytest.raises(StoreUnavailableError):
                await call


async def test_a_legacy_dead_job_without_tenant_is_listed_to_no_tenant(
        client: Redis, redis_prefix: str) -> None:
    """A job dead-lettered before headers carried a tenant (no ``tenant`` field) is listed,
    requeued and dropped only by the operator (no tenant), never by a tenant's admin."""
    keys = KeyLayout(redis_prefix)
    queue = RedisLearningQueue(client, key_prefix=redis_prefix)
    await queue.enqueue("learn", "old", b"p", tenant="t")
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    await queue.bury(job, error="boom")
    header = orjson.loads(await client.hget(keys.queue("jobs"), "old"))
    del header["tenant"]  # as written by the previous release
    await client.hset(keys.queue("jobs"), "old", orjson.dumps(header))
    assert await queue.dead_letters(tenant="t") == []
    assert not await queue.requeue("old", tenant="t")
    assert not await queue.drop("old", tenant="t")
    [legacy] = await queue.dead_letters()
    assert (legacy.id, legacy.tenant) == ("old", None)
    assert await queue.requeue("old")
    assert (await queue.claim("w", lease_seconds=30)) is not None
