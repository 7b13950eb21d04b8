"""The LearningQueue contract: every behaviour, checked on both backends (docs/design.md#batching,
docs/design.md#reliability).

The ``queue`` fixture yields a fresh SQLite queue and a fresh Redis queue (its own key
prefix on the session's test Redis); each test runs on both. Leases and delays are real
time, kept to a few hundred milliseconds.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from proxy.learning.exchange import RETRY_WINDOW_SECONDS, Exchange, TranscriptMessage
from proxy.learning.queue import Batch, Job, LearningQueue, NewJob

LEASE = 0.4  # seconds; sleeps wait LEASE + SLACK
SLACK = 0.1


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def queue(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LearningQueue]:
    if request.param == "sqlite":
        from proxy.backends.sqlite.database import SqliteDatabase
        from proxy.backends.sqlite.queue import SqliteLearningQueue

        async with SqliteDatabase(tmp_path / "queue.db") as db:
            yield SqliteLearningQueue(db)
        return
    from proxy.backends.redis.client import connect
    from proxy.backends.redis.queue import RedisLearningQueue

    async with connect(request.getfixturevalue("redis_url")) as client:
        yield RedisLearningQueue(client, key_prefix=request.getfixturevalue("redis_prefix"))


def msg(role: str, text: str, *, name: str | None = None) -> TranscriptMessage:
    return TranscriptMessage(role=role, text=text, fingerprint=f"fp-{role}-{text}", name=name)


def turn(*texts: str, reply: str | None = None) -> tuple[TranscriptMessage, ...]:
    """User messages ``texts`` and one assistant reply (``re: <last text>`` by default)."""
    return (*(msg("user", t) for t in texts), msg("assistant", reply or f"re: {texts[-1]}"))


def exchange(messages: tuple[TranscriptMessage, ...], *, user: str = "u1",
             conversation: str = "c1", at: float = 1000.0, tenant: str = "t1",
             model: str = "m", group: str | None = None) -> Exchange:
    return Exchange(id=f"x-{at}", tenant=tenant, user=user, conversation=conversation,
                    channel="group" if group else "private", group=group, model=model,
                    messages=messages, at=at)


async def claim_all(queue: LearningQueue, worker: str = "w") -> list[Job]:
    jobs = []
    while (job := await queue.claim(worker, lease_seconds=30)) is not None:
        jobs.append(job)
    return jobs


async def learn_batches(queue: LearningQueue) -> list[Batch]:
    """Claim and acknowledge every job; the batches of the ``learn`` ones, loaded."""
    batches = []
    for job in await claim_all(queue):
        assert job.kind == "learn"
        batch = await queue.load_batch(orjson.loads(job.payload)["batch"])
        assert batch is not None
        batches.append(batch)
        await queue.ack(job)
    return batches


def texts(batch: Batch) -> list[str]:
    return [m.text for m in batch.messages]


# jobs -------------------------------------------------------------------------------

async def test_an_enqueued_job_is_claimed_once_with_its_payload(queue: LearningQueue) -> None:
    """A claimed job carries kind, payload and attempt 1; nobody else can claim it."""
    await queue.enqueue("exchange", "j1", b"\x00payload\xff", tenant="t")
    job = await queue.claim("w1", lease_seconds=30)
    assert job == Job(id="j1", kind="exchange", payload=b"\x00payload\xff", attempts=1)
    assert await queue.claim("w2", lease_seconds=30) is None


async def test_a_job_id_already_present_is_ignored(queue: LearningQueue) -> None:
    """Enqueueing an id that is ready, leased or dead again changes nothing, also within
    one enqueue_many call."""
    await queue.enqueue_many([NewJob("exchange", "a", b"first", "t"),
                              NewJob("exchange", "a", b"second", "t"),
                              NewJob("flush", "b", b"b", "t")])
    await queue.enqueue("exchange", "a", b"third", tenant="t")
    assert (await queue.depth()).ready == 2
    first = await queue.claim("w", lease_seconds=30)
    assert first is not None
    assert (first.id, first.payload) == ("a", b"first")
    await queue.enqueue("exchange", "a", b"while leased", tenant="t")
    await queue.bury(first, error="boom")
    await queue.enqueue("exchange", "a", b"while dead", tenant="t")
    depth = await queue.depth()
    assert (depth.ready, depth.leased, depth.dead) == (1, 0, 1)
    second = await queue.claim("w", lease_seconds=30)
    assert second is not None
    assert second.id == "b"
    assert await queue.claim("w", lease_seconds=30) is None


async def test_an_acknowledged_job_is_gone_and_its_id_free_again(queue: LearningQueue) -> None:
    """ack removes the job for good; the same id may then be enqueued anew."""
    await queue.enqueue("learn", "j", b"1", tenant="t")
    job = await queue.claim("w", lease_seconds=LEASE)
    assert job is not None
    await queue.ack(job)
    await asyncio.sleep(LEASE + SLACK)
    assert await queue.claim("w", lease_seconds=30) is None
    depth = await queue.depth()
    assert (depth.ready, depth.delayed, depth.leased, depth.dead) == (0, 0, 0, 0)
    await queue.ack(job)  # twice: harmless
    await queue.enqueue("learn", "j", b"2", tenant="t")
    again = await queue.claim("w", lease_seconds=30)
    assert again is not None
    assert (again.payload, again.attempts) == (b"2", 1)


async def test_jobs_are_claimed_oldest_first(queue: LearningQueue) -> None:
    """Exchange and learn jobs come out in the order they were enqueued, across and within
    calls; flush jobs likewise among themselves, after every ready exchange and learn job."""
    await queue.enqueue("exchange", "1", b"", tenant="t")
    await queue.enqueue_many([NewJob("exchange", "2", b"", "t"), NewJob("flush", "3", b"", "t"),
                              NewJob("learn", "4", b"", "t")])
    await queue.enqueue("flush", "5", b"", tenant="t")
    await queue.enqueue("exchange", "6", b"", tenant="t")
    assert [j.id for j in await claim_all(queue)] == ["1", "2", "4", "6", "3", "5"]


async def test_an_expired_lease_redelivers_the_job_to_another_worker(
    queue: LearningQueue,
) -> None:
    """A worker that never finishes holds its job only until its lease ends; then another
    worker gets it, as a further attempt, while a live lease is respected."""
    await queue.enqueue("learn", "j", b"p", tenant="t")
    held = await queue.claim("crashed", lease_seconds=LEASE)
    assert held is not None
    assert await queue.claim("other", lease_seconds=30) is None
    assert (await queue.depth()).leased == 1
    await asyncio.sleep(LEASE + SLACK)
    taken = await queue.claim("other", lease_seconds=30)
    assert taken == Job(id="j", kind="learn", payload=b"p", attempts=2)
    await asyncio.sleep(LEASE)
    assert await queue.claim("third", lease_seconds=30) is None  # the new lease holds


async def test_retry_delays_the_job_and_keeps_its_attempts(queue: LearningQueue) -> None:
    """A retried job is not claimable before its delay, and is afterwards, as attempt 2."""
    await queue.enqueue("learn", "j", b"p", tenant="t")
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    await queue.retry(job, error="429", delay_seconds=LEASE)
    assert await queue.claim("w", lease_seconds=30) is None
    depth = await queue.depth()
    assert (depth.ready, depth.delayed, depth.leased) == (0, 1, 0)
    await asyncio.sleep(LEASE + SLACK)
    assert (await queue.depth()).ready == 1
    again = await queue.claim("w", lease_seconds=30)
    assert again is not None
    assert (again.id, again.attempts, again.payload) == ("j", 2, b"p")


async def test_retry_without_delay_is_claimable_at_once(queue: LearningQueue) -> None:
    """A zero delay puts the job straight back among the ready ones."""
    await queue.enqueue("flush", "j", b"", tenant="t")
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    await queue.retry(job, error="oops", delay_seconds=0)
    again = await queue.claim("w", lease_seconds=30)
    assert again is not None
    assert again.attempts == 2


async def test_attempts_count_every_delivery(queue: LearningQueue) -> None:
    """Lease expiries and retries alike add one attempt per delivery (the worker
    dead-letters at learning.max_attempts on this count)."""
    await queue.enqueue("learn", "j", b"", tenant="t")
    first = await queue.claim("a", lease_seconds=LEASE)
    await asyncio.sleep(LEASE + SLACK)
    second = await queue.claim("b", lease_seconds=30)
    assert second is not None
    await queue.retry(second, error="x", delay_seconds=0)
    third = await queue.claim("c", lease_seconds=30)
    assert [j.attempts if j else None for j in (first, second, third)] == [1, 2, 3]


async def test_a_buried_job_is_a_dead_letter_until_requeued(queue: LearningQueue) -> None:
    """bury moves a job to the dead letters with its last error and attempts; requeue
    makes it ready again with a fresh attempt count; only dead jobs can be requeued."""
    await queue.enqueue("learn", "j", b"p", tenant="t")
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    await queue.retry(job, error="first error", delay_seconds=0)
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    await queue.bury(job, error="ParseError: " + "x" * 5000)
    assert await queue.claim("w", lease_seconds=30) is None
    [dead] = await queue.dead_letters()
    assert (dead.id, dead.kind, dead.attempts) == ("j", "learn", 2)
    assert dead.last_error.startswith("ParseError: x")
    assert 100 < len(dead.last_error) <= 2000
    assert (await queue.depth()).dead == 1
    assert not await queue.requeue("unknown")
    assert await queue.requeue("j")
    assert not await queue.requeue("j")  # ready now, not dead
    assert await queue.dead_letters() == []
    revived = await queue.claim("w", lease_seconds=30)
    assert revived == Job(id="j", kind="learn", payload=b"p", attempts=1)


async def test_dead_letters_are_listed_newest_first(queue: LearningQueue) -> None:
    """The dead-letter list is ordered by failure time, newest first, and limited."""
    await queue.enqueue_many([NewJob("learn", name, b"", "t") for name in ("a", "b", "c")])
    for job in await claim_all(queue):
        await queue.bury(job, error=f"failed {job.id}")
        await asyncio.sleep(0.01)
    assert [d.id for d in await queue.dead_letters()] == ["c", "b", "a"]
    assert [d.last_error for d in await queue.dead_letters(limit=2)] == [
        "failed c", "failed b"]


async def test_dead_letters_are_scoped_to_their_tenant(queue: LearningQueue) -> None:
    """A tenant sees, requeues and drops only its own dead jobs; a job without a tenant
    (dead-lettered before jobs carried one) is listed to no tenant, only to the operator."""
    await queue.enqueue_many([NewJob("learn", "a1", b"", "acme"),
                              NewJob("learn", "b1", b"", "beta"),
                              NewJob("learn", "legacy", b"", None)])
    await queue.enqueue("flush", "a2", b"", tenant="acme")
    for job in await claim_all(queue):
        await queue.bury(job, error="boom")
    assert sorted(d.id for d in await queue.dead_letters(tenant="acme")) == ["a1", "a2"]
    assert [d.id for d in await queue.dead_letters(tenant="beta")] == ["b1"]
    assert {d.tenant for d in await queue.dead_letters(tenant="acme")} == {"acme"}
    assert len(await queue.dead_letters(tenant="acme", limit=1)) == 1
    assert await queue.dead_letters(tenant="nobody") == []
    assert await queue.dead_letters(tenant="") == []
    everything = {d.id: d.tenant for d in await queue.dead_letters()}
    assert everything == {"a1": "acme", "a2": "acme", "b1": "beta", "legacy": None}
    # another tenant's job: not requeued, not dropped, still dead
    assert not await queue.requeue("b1", tenant="acme")
    assert not await queue.drop("b1", tenant="acme")
    assert not await queue.requeue("legacy", tenant="acme")
    assert not await queue.drop("legacy", tenant="")
    assert (await queue.depth()).dead == 4
    # its own
    assert await queue.drop("a2", tenant="acme")
    assert not await queue.drop("a2", tenant="acme")
    assert await queue.requeue("a1", tenant="acme")
    # the operator (no tenant) reaches every job, legacy ones included
    assert await queue.requeue("legacy")
    assert await queue.drop("b1")
    assert await queue.dead_letters() == []
    assert sorted(j.id for j in await claim_all(queue)) == ["a1", "legacy"]


async def test_a_dropped_job_is_gone_and_only_dead_jobs_drop(queue: LearningQueue) -> None:
    """drop deletes a dead job and its payload for good; a ready job is not dropped."""
    await queue.enqueue("learn", "j", b"p", tenant="t")
    assert not await queue.drop("j")
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    assert not await queue.drop("j")  # leased, not dead
    await queue.bury(job, error="x")
    assert await queue.drop("j")
    assert (await queue.depth()).dead == 0
    assert await queue.claim("w", lease_seconds=30) is None
    await queue.enqueue("learn", "j", b"new", tenant="t")  # the id is free again
    assert (await queue.claim("w", lease_seconds=30)) == Job("j", "learn", b"new", 1)


async def test_a_sealed_batch_learn_job_carries_the_users_tenant(queue: LearningQueue) -> None:
    """The learn job a seal enqueues belongs to the conversation's tenant."""
    await queue.buffer(exchange(turn("one", "two"), user="u1"), batch_size=2, now=1.0)
    [job] = await claim_all(queue)
    assert job.kind == "learn"
    await queue.bury(job, error="x")
    assert [d.id for d in await queue.dead_letters(tenant="t1")] == [job.id]
    assert await queue.dead_letters(tenant="other") == []


async def test_depth_counts_jobs_by_state_and_buffered_messages(queue: LearningQueue) -> None:
    """depth() reports ready, delayed, leased and dead jobs and unsealed messages."""
    await queue.enqueue_many([NewJob("exchange", str(i), b"", "t") for i in range(5)])
    leased = await queue.claim("w", lease_seconds=30)
    delayed = await queue.claim("w", lease_seconds=30)
    dead = await queue.claim("w", lease_seconds=30)
    assert leased is not None
    assert delayed is not None
    assert dead is not None
    await queue.retry(delayed, error="later", delay_seconds=60)
    await queue.bury(dead, error="never")
    await queue.buffer(exchange(turn("hello", "again")), batch_size=5, now=1000)
    depth = await queue.depth()
    assert (depth.ready, depth.delayed, depth.leased, depth.dead,
            depth.buffered_messages) == (2, 1, 1, 1, 3)


# buffer -----------------------------------------------------------------------------

async def test_resent_messages_are_buffered_once(queue: LearningQueue) -> None:
    """A message whose fingerprint the user has seen is dropped: resent history, a
    duplicate inside one exchange, the same text in another conversation of the user."""
    await queue.buffer(exchange(turn("I live in Oslo")), batch_size=5, now=1000)
    resent = (*turn("I live in Oslo"), msg("user", "I keep bees"), msg("user", "I keep bees"))
    await queue.buffer(exchange(resent, at=1001), batch_size=5, now=1001)
    await queue.buffer(exchange(turn("I live in Oslo", "I sail"), conversation="c2", at=1002),
                       batch_size=5, now=1002)
    assert (await queue.depth()).buffered_messages == 5
    assert sorted(await queue.buffered_conversations("t1", "u1")) == ["c1", "c2"]
    first = await queue.seal("t1", "u1", "c1", now=1003)
    second = await queue.seal("t1", "u1", "c2", now=1003)
    assert first is not None
    assert second is not None
    one, two = await queue.load_batch(first), await queue.load_batch(second)
    assert one is not None
    assert two is not None
    assert texts(one) == ["I live in Oslo", "re: I live in Oslo", "I keep bees"]
    assert texts(two) == ["I sail", "re: I sail"]


async def test_fingerprints_belong_to_one_user(queue: LearningQueue) -> None:
    """Another user (or tenant) sending a message with the same fingerprint has it
    buffered: dedup never crosses users."""
    same = turn("hello")
    await queue.buffer(exchange(same), batch_size=5, now=1000)
    await queue.buffer(exchange(same, user="u2"), batch_size=5, now=1000)
    await queue.buffer(exchange(same, tenant="t2"), batch_size=5, now=1000)
    assert (await queue.depth()).buffered_messages == 6
    assert await queue.buffered_conversations("t1", "u2") == ["c1"]
    assert await queue.buffered_conversations("t2", "u1") == ["c1"]


async def test_a_batch_is_sealed_at_batch_size_with_one_learn_job(
    queue: LearningQueue,
) -> None:
    """The exchange that brings the conversation to batch_size user messages seals all its
    buffered messages, in order, into a batch whose learn job is enqueued once."""
    first = exchange(turn("I am a nurse", reply="Nice"), at=1000)
    assert await queue.buffer(first, batch_size=2, now=1000) is None
    assert await claim_all(queue) == []
    group_turn = exchange((msg("user", "I work nights", name="Ann"), msg("assistant", "Ok")),
                          at=1010, model="m2")
    key = await queue.buffer(group_turn, batch_size=2, now=1010)
    assert key is not None
    [job] = await claim_all(queue)
    assert (job.kind, job.id, orjson.loads(job.payload)) == ("learn", f"learn:{key}",
                                                             {"batch": key})
    batch = await queue.load_batch(key)
    assert batch is not None
    assert (batch.key, batch.tenant, batch.user, batch.conversation, batch.channel,
            batch.model, batch.oldest_at, batch.newest_at) == (
        key, "t1", "u1", "c1", "private", "m2", 1000.0, 1010.0)
    assert [(m.role, m.text, m.name) for m in batch.messages] == [
        ("user", "I am a nurse", None), ("assistant", "Nice", None),
        ("user", "I work nights", "Ann"), ("assistant", "Ok", None)]
    assert batch.messages[0].fingerprint == "fp-user-I am a nurse"
    assert [m.text for m in batch.user_messages] == ["I am a nurse", "I work nights"]
    assert (await queue.depth()).buffered_messages == 0
    assert await queue.buffered_conversations("t1", "u1") == []
    assert await queue.seal("t1", "u1", "c1", now=1020) is None


async def test_group_batches_keep_the_channel_and_images(queue: LearningQueue) -> None:
    """A group exchange's batch says group:<id> and keeps the images of its messages."""
    shared = TranscriptMessage(role="user", text="look", fingerprint="fp-img", name="Bo",
                               images=("data:image/png;base64,AAAA",))
    key = await queue.buffer(exchange((shared,), user="group:g1", group="g1"), batch_size=1,
                             now=1000)
    assert key is not None
    batch = await queue.load_batch(key)
    assert batch is not None
    assert batch.channel == "group:g1"
    assert batch.messages == (shared,)


async def test_concurrent_buffering_seals_every_message_exactly_once(
    queue: LearningQueue,
) -> None:
    """Exchanges of one conversation buffered at the same time (several workers) put each
    message in exactly one batch, with one learn job per batch and none lost."""
    exchanges = [exchange(turn(f"fact {i}"), at=1000 + i) for i in range(12)]
    keys = await asyncio.gather(*(queue.buffer(e, batch_size=2, now=1000) for e in exchanges))
    await asyncio.gather(*(queue.buffer(e, batch_size=2, now=1000) for e in exchanges[:4]))
    assert (await queue.depth()).buffered_messages <= 2  # no full batch left unsealed
    rest = await queue.seal("t1", "u1", "c1", now=2000)
    sealed = [k for k in (*keys, rest) if k is not None]
    batches = await learn_batches(queue)
    assert sorted(b.key for b in batches) == sorted(sealed)
    assert len(set(sealed)) == len(sealed)
    learned = Counter(t for b in batches for t in texts(b))
    expected = {f"fact {i}" for i in range(12)} | {f"re: fact {i}" for i in range(12)}
    assert set(learned) == expected
    assert set(learned.values()) == {1}
    assert all(len(b.user_messages) >= 2 for b in batches if b.key != rest)
    assert (await queue.depth()).buffered_messages == 0


async def test_two_concurrent_exchanges_reaching_the_batch_size_seal_one_batch(
    queue: LearningQueue,
) -> None:
    """Two exchanges racing to complete a batch of two yield one batch and one job."""
    keys = await asyncio.gather(
        queue.buffer(exchange(turn("left")), batch_size=2, now=1000),
        queue.buffer(exchange(turn("right"), at=1001), batch_size=2, now=1000))
    assert len([k for k in keys if k]) == 1
    [batch] = await learn_batches(queue)
    assert sorted(texts(batch)) == ["left", "re: left", "re: right", "right"]


async def test_seal_flushes_whatever_a_conversation_holds(queue: LearningQueue) -> None:
    """seal() makes a batch of a partial buffer (an idle or explicit flush) and enqueues its
    learn job; with nothing buffered it returns None."""
    assert await queue.seal("t1", "u1", "c1", now=1000) is None
    await queue.buffer(exchange(turn("just one")), batch_size=5, now=1000)
    key = await queue.seal("t1", "u1", "c1", now=1001)
    assert key is not None
    assert await queue.seal("t1", "u1", "c1", now=1002) is None
    [batch] = await learn_batches(queue)
    assert (batch.key, texts(batch)) == (key, ["just one", "re: just one"])


async def test_batch_keys_are_deterministic_from_the_messages(queue: LearningQueue) -> None:
    """The same messages sealed for the same user and conversation get the same key;
    other messages another key."""
    one = await queue.buffer(exchange(turn("same")), batch_size=1, now=1000)
    await queue.forget_user("t1", "u1")
    await queue.expire(buffered_before=0, seen_before=float("inf"))
    again = await queue.buffer(exchange(turn("same")), batch_size=1, now=1000)
    other = await queue.buffer(exchange(turn("other")), batch_size=1, now=1000)
    assert one is not None
    assert one == again != other


async def test_a_dropped_batch_cannot_be_loaded(queue: LearningQueue) -> None:
    """drop_batch deletes the batch's raw text; loading it, or an unknown key, gives None."""
    key = await queue.buffer(exchange(turn("bye")), batch_size=1, now=1000)
    assert key is not None
    assert await queue.load_batch(key) is not None
    await queue.drop_batch(key)
    await queue.drop_batch(key)
    assert await queue.load_batch(key) is None
    assert await queue.load_batch("b_" + "0" * 32) is None
    assert await queue.load_batch("not a key") is None


async def test_idle_conversations_are_those_quiet_since_a_time(queue: LearningQueue) -> None:
    """A conversation is idle when its newest unsealed message is older than the given
    time and it holds a user message; sealing it ends that."""
    await queue.buffer(exchange(turn("early"), conversation="old", at=100), batch_size=5,
                       now=100)
    await queue.buffer(exchange(turn("later"), conversation="new", at=200), batch_size=5,
                       now=200)
    await queue.buffer(exchange(turn("later still"), conversation="old", at=150),
                       batch_size=5, now=150)
    await queue.buffer(exchange((msg("assistant", "only me"),), conversation="bot", at=50),
                       batch_size=5, now=50)
    assert await queue.idle_conversations(idle_before=150) == []
    assert await queue.idle_conversations(idle_before=151) == [("t1", "u1", "old")]
    assert sorted(await queue.idle_conversations(idle_before=201)) == [
        ("t1", "u1", "new"), ("t1", "u1", "old")]
    await queue.seal("t1", "u1", "old", now=300)
    assert await queue.idle_conversations(idle_before=float("inf")) == [("t1", "u1", "new")]
    assert sorted(await queue.buffered_conversations("t1", "u1")) == ["bot", "new"]


async def test_expire_drops_old_buffered_text_and_old_fingerprints(
    queue: LearningQueue,
) -> None:
    """Unsealed messages older than the buffer TTL are deleted one by one (sealed batches
    stay); fingerprints older than theirs are forgotten, so such a message counts as new."""
    await queue.buffer(exchange(turn("stale"), at=100), batch_size=5, now=100)
    await queue.buffer(exchange(turn("fresh"), at=300), batch_size=5, now=300)
    kept = await queue.buffer(exchange(turn("sealed"), conversation="c2", at=50),
                              batch_size=1, now=50)
    assert await queue.expire(buffered_before=200, seen_before=0) == 2
    assert (await queue.depth()).buffered_messages == 2
    assert await queue.idle_conversations(idle_before=250) == []
    assert kept is not None
    assert await queue.load_batch(kept) is not None
    # fingerprints: "stale" was seen at 100, "fresh" at 300
    assert await queue.expire(buffered_before=0, seen_before=200) == 0
    await queue.buffer(exchange(turn("stale", "fresh"), at=400), batch_size=5, now=400)
    key = await queue.seal("t1", "u1", "c1", now=400)
    assert key is not None
    batch = await queue.load_batch(key)
    assert batch is not None
    assert texts(batch) == ["fresh", "re: fresh", "stale"]


async def test_marked_messages_are_never_buffered(queue: LearningQueue) -> None:
    """mark_seen records fingerprints without buffering: a later resend is not learned."""
    await queue.mark_seen(exchange(turn("private thought")), now=1000)
    assert (await queue.depth()).buffered_messages == 0
    assert await queue.buffer(exchange(turn("private thought"), at=1001), batch_size=1,
                              now=1001) is None
    assert await queue.buffered_conversations("t1", "u1") == []
    assert await claim_all(queue) == []


async def test_forget_user_drops_their_buffered_text_but_not_their_fingerprints(
    queue: LearningQueue,
) -> None:
    """forget_user deletes a user's unsealed and sealed text; the user's resent history
    is still not buffered again, and other users keep theirs."""
    sealed = await queue.buffer(exchange(turn("secret one")), batch_size=1, now=1000)
    await queue.buffer(exchange(turn("secret two"), conversation="c2"), batch_size=5, now=1000)
    await queue.buffer(exchange(turn("mine"), user="u2"), batch_size=5, now=1000)
    await queue.forget_user("t1", "u1")
    assert sealed is not None
    assert await queue.load_batch(sealed) is None
    assert await queue.buffered_conversations("t1", "u1") == []
    assert await queue.idle_conversations(idle_before=float("inf")) == [("t1", "u2", "c1")]
    assert (await queue.depth()).buffered_messages == 2
    assert await queue.buffer(exchange(turn("secret two"), at=1001), batch_size=1,
                              now=1001) is None


# erasure ----------------------------------------------------------------------------------

async def test_scrub_user_blanks_the_users_queued_transcripts_only(queue: LearningQueue) -> None:
    """scrub_user empties the user's exchange jobs — ready, leased or dead, their own or
    a group turn they spoke — keeping the job ids but no message (no text, no
    fingerprint); other users' jobs and other kinds of job are untouched; a second call
    finds nothing."""
    import dataclasses

    own = exchange(turn("I live in Lisbon"), at=1.0)
    group = dataclasses.replace(exchange(turn("We meet on Fridays"), user="g:team",
                                         group="team", at=2.0), speaker="u1")
    other = exchange(turn("I live in Porto"), user="u2", at=3.0)
    dead = exchange(turn("My dog is Rex"), at=4.0)
    await queue.enqueue("exchange", "dead", orjson.dumps(dead.to_json()),
                        tenant="t1")
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    await queue.bury(job, error="boom")
    for job_id, item in (("own", own), ("group", group), ("other", other)):
        await queue.enqueue("exchange", job_id, orjson.dumps(item.to_json()), tenant="t1")
    await queue.enqueue("flush", "flush", orjson.dumps({"tenant": "t1", "user": "u1"}),
                        tenant="t1")
    leased = await queue.claim("w", lease_seconds=30)  # "own" is held by a worker now
    assert leased is not None
    assert leased.id == "own"

    assert await queue.scrub_user("t1", "u1") == 3
    assert await queue.scrub_user("t1", "u1") == 0
    assert await queue.requeue("dead")
    payloads = {j.id: j.payload for j in await claim_all(queue)}
    payloads["own"] = (await _reclaimed(queue, leased)).payload
    for job_id, original in (("own", own), ("group", group), ("dead", dead)):
        scrubbed = Exchange.from_json(orjson.loads(payloads[job_id]))
        assert original.messages
        assert scrubbed.messages == ()
        assert all(m.fingerprint.encode() not in payloads[job_id]
                   for m in original.messages)
    assert Exchange.from_json(orjson.loads(payloads["other"])) == other
    assert orjson.loads(payloads["flush"]) == {"tenant": "t1", "user": "u1"}


async def _pending_ids(queue: LearningQueue) -> set[str]:
    """Ids of every job the queue still holds: claimed (ready, delayed due now, leases
    run out) and dead-lettered."""
    dead = {d.id for d in await queue.dead_letters(limit=1000)}
    return {j.id for j in await claim_all(queue, "w-scan")} | dead


async def test_erase_user_deletes_every_queued_job_that_names_the_user(
        queue: LearningQueue) -> None:
    """erase_user deletes the user's jobs in any state — their own exchange (leased by a
    worker), a group turn they spoke, a dead-lettered exchange, their idle and explicit
    flushes (ids ``flush:t1:u1:…``) and the learn job of their sealed batch; another
    user's exchange, flush and learn job, and the group's learn job, are untouched."""
    import dataclasses

    from proxy.learning.jobs import Flush, exchange_job, flush_job

    dead = exchange(turn("My dog is Rex"), at=4.0)
    await queue.enqueue_many([exchange_job(dead)])
    buried = await queue.claim("w", lease_seconds=30)
    assert buried is not None
    await queue.bury(buried, error="boom")
    group = dataclasses.replace(exchange(turn("We meet on Fridays"), user="g:team",
                                         group="team", at=2.0), speaker="u1")
    await queue.enqueue_many([
        exchange_job(exchange(turn("I live in Lisbon"), at=1.0)), exchange_job(group),
        exchange_job(exchange(turn("I live in Porto"), user="u2", at=3.0)),
        flush_job(Flush("t1", "u1", "c1")), flush_job(Flush("t1", "u1"), unique="x1"),
        flush_job(Flush("t1", "u2", "c1")), flush_job(Flush("t2", "u1", "c1"))])
    leased = await queue.claim("w", lease_seconds=30)
    assert leased is not None
    assert leased.id == "exchange:x-1.0"
    for user in ("u1", "u2", "group:team"):
        await queue.buffer(exchange(turn(f"batch of {user}"), user=user, at=5.0),
                           batch_size=1, now=5.0)
    claimed = await claim_all(queue, "w-learn")
    assert len([j for j in claimed if j.kind == "learn"]) == 3
    for job in claimed:  # back to ready: only the first lease stays held
        await queue.release(job)

    await queue.erase_user("t1", "u1", names=[])

    kept = await _pending_ids(queue)
    assert not any(job_id.startswith(("flush:t1:u1:", "exchange:x-1.0", "exchange:x-2.0",
                                      "exchange:x-4.0")) for job_id in kept)
    assert {"exchange:x-3.0", "flush:t1:u2:c1", "flush:t2:u1:c1"} <= kept
    assert len({j for j in kept if j.startswith("learn:")}) == 2
    assert await queue.ack(leased) is None  # the worker's ack of a deleted job is a no-op
    assert await _pending_ids(queue) == set()


async def _reclaimed(queue: LearningQueue, job: Job) -> Job:
    """The job again, as the next delivery would read it."""
    await queue.retry(job, error="again", delay_seconds=0)
    again = await queue.claim("w2", lease_seconds=30)
    assert again is not None
    assert again.id == job.id
    return again
# the request's new user message -------------------------------------------------------

def said(text: str, request: str, *, history: tuple[TranscriptMessage, ...] = ()
         ) -> tuple[TranscriptMessage, ...]:
    """``history`` resent, then ``text`` as the request's new user message (request key
    ``request``) and the reply."""
    new = TranscriptMessage(role="user", text=text, fingerprint=f"fp-user-{text}",
                            request=request, new=True)
    return (*history, new, msg("assistant", f"re: {text}"))


async def test_a_new_message_stating_a_known_text_again_is_buffered(
    queue: LearningQueue
) -> None:
    """The same words said again as a request's new message — in another conversation or
    the same one — are buffered each time (a repeat is evidence), while the same words
    resent as history are not."""
    await queue.buffer(exchange(said("I drink green tea", "rq_1")), batch_size=9, now=1000)
    await queue.buffer(exchange(said("I drink green tea", "rq_2"), conversation="c2",
                                at=1001), batch_size=9, now=1001)
    await queue.buffer(exchange(said("I drink green tea", "rq_3",
                                     history=(msg("user", "I drink green tea"),)), at=1002),
                       batch_size=9, now=1002)
    one = await queue.load_batch(await queue.seal("t1", "u1", "c1", now=1003) or "")
    two = await queue.load_batch(await queue.seal("t1", "u1", "c2", now=1003) or "")
    assert one is not None
    assert two is not None
    assert [m.text for m in one.user_messages] == ["I drink green tea", "I drink green tea"]
    assert [m.text for m in two.user_messages] == ["I drink green tea"]


async def test_a_retried_request_is_buffered_once_within_the_window(
    queue: LearningQueue
) -> None:
    """The same request key again within RETRY_WINDOW_SECONDS is a retry and dropped;
    after the window it is a new statement."""
    await queue.buffer(exchange(said("I keep bees", "rq_a")), batch_size=9, now=1000)
    await queue.buffer(exchange(said("I keep bees", "rq_a"), at=1001), batch_size=9,
                       now=1000 + RETRY_WINDOW_SECONDS - 1)
    first = await queue.load_batch(await queue.seal("t1", "u1", "c1", now=1002) or "")
    assert first is not None
    assert [m.text for m in first.user_messages] == ["I keep bees"]
    later = 1000 + RETRY_WINDOW_SECONDS + 5
    await queue.buffer(exchange(said("I keep bees", "rq_a"), at=later), batch_size=9,
                       now=later)
    second = await queue.load_batch(await queue.seal("t1", "u1", "c1", now=later) or "")
    assert second is not None
    assert [m.text for m in second.user_messages] == ["I keep bees"]


async def test_request_keys_belong_to_one_user(queue: LearningQueue) -> None:
    """Another user's request with the same key is not a retry of this user's."""
    await queue.buffer(exchange(said("hello there", "rq_x")), batch_size=9, now=1000)
    await queue.buffer(exchange(said("hello there", "rq_x"), user="u2"), batch_size=9,
                       now=1000)
    assert await queue.buffered_conversations("t1", "u2") == ["c1"]


async def test_history_queued_before_its_own_request_is_not_buffered_twice(
    queue: LearningQueue
) -> None:
    """When a later request's history reaches the queue first (workers out of order), the
    request that carried the message new arrives as already learned."""
    first = TranscriptMessage(role="user", text="I sail", fingerprint="fp-user-I sail",
                              request="rq_first")
    later = (first, msg("assistant", "re: I sail"), *said("I row", "rq_later"))
    await queue.buffer(exchange(later, at=1001), batch_size=9, now=1001)
    await queue.buffer(exchange(said("I sail", "rq_first"), at=1000), batch_size=9, now=1002)
    batch = await queue.load_batch(await queue.seal("t1", "u1", "c1", now=1003) or "")
    assert batch is not None
    assert [m.text for m in batch.user_messages] == ["I sail", "I row"]
async def test_a_postponed_job_waits_without_using_an_attempt(queue: LearningQueue) -> None:
    """A postponed job (spent learning budget) is not claimable before its delay, and its
    next delivery has the attempt count of the postponed one: it can never dead-letter."""
    await queue.enqueue("learn", "j", b"p", tenant="t1")
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    for _ in range(3):
        await queue.postpone(job, reason="learning budget spent", delay_seconds=0)
        again = await queue.claim("w", lease_seconds=30)
        assert again is not None
        assert (again.id, again.attempts) == ("j", 1)
        job = again
    await queue.postpone(job, reason="learning budget spent", delay_seconds=LEASE)
    assert await queue.claim("w", lease_seconds=30) is None
    assert (await queue.depth()).delayed == 1
    await asyncio.sleep(LEASE + SLACK)
    later = await queue.claim("w", lease_seconds=30)
    assert later is not None
    assert later.attempts == 1
    assert await queue.dead_letters() == []


async def test_resume_postponed_makes_only_the_tenants_postponed_jobs_due(
    queue: LearningQueue,
) -> None:
    """resume_postponed(tenant) makes that tenant's budget-postponed jobs claimable now,
    with the attempt count they had; a job of the tenant waiting for a retry's back-off,
    and another tenant's postponed job, keep waiting."""
    for job_id, tenant in (("a", "t1"), ("b", "t1"), ("c", "t1"), ("d", "t2")):
        await queue.enqueue("learn", job_id, b"p", tenant=tenant)
    claimed = {}
    for _ in range(4):
        job = await queue.claim("w", lease_seconds=30)
        assert job is not None
        claimed[job.id] = job
    for job_id in ("a", "b", "d"):
        await queue.postpone(claimed[job_id], reason="learning budget spent",
                             delay_seconds=300)
    await queue.retry(claimed["c"], error="upstream down", delay_seconds=300)
    assert await queue.claim("w", lease_seconds=30) is None
    assert await queue.resume_postponed("t1") == 2
    again = [await queue.claim("w", lease_seconds=30) for _ in range(3)]
    assert sorted((j.id, j.attempts) for j in again if j is not None) == [("a", 1), ("b", 1)]
    assert (await queue.depth()).delayed == 2  # c (back-off) and d (other tenant)
    assert await queue.resume_postponed("t1") == 0  # nothing left to resume
    assert await queue.resume_postponed("t2") == 1


async def test_postponed_tenants_names_the_tenants_with_postponed_jobs_until_resumed(
    queue: LearningQueue,
) -> None:
    """postponed_tenants lists each tenant with budget-postponed jobs once (none on an
    empty queue, none for a job only retried), and a tenant leaves it when
    resume_postponed makes its jobs due."""
    assert await queue.postponed_tenants() == []
    for job_id, tenant in (("a", "t1"), ("b", "t1"), ("c", "t3"), ("d", "t2")):
        await queue.enqueue("learn", job_id, b"p", tenant=tenant)
    claimed = {}
    for _ in range(4):
        job = await queue.claim("w", lease_seconds=30)
        assert job is not None
        claimed[job.id] = job
    await queue.retry(claimed["c"], error="upstream down", delay_seconds=300)
    assert await queue.postponed_tenants() == []
    for job_id in ("a", "b", "d"):
        await queue.postpone(claimed[job_id], reason="learning budget spent",
                             delay_seconds=300)
    assert await queue.postponed_tenants() == ["t1", "t2"]
    assert await queue.resume_postponed("t1") == 2
    assert await queue.postponed_tenants() == ["t2"]
    assert await queue.resume_postponed("t2") == 1
    assert await queue.postponed_tenants() == []


async def test_a_released_job_is_claimable_at_once_with_no_attempt_counted(
    queue: LearningQueue,
) -> None:
    """release (a worker told to stop) hands the job back before its lease ends, and the
    next delivery counts as the same attempt again."""
    await queue.enqueue("learn", "j", b"p", tenant="t1")
    job = await queue.claim("stopping", lease_seconds=300)
    assert job is not None
    assert job.attempts == 1
    await queue.release(job)
    depth = await queue.depth()
    assert (depth.ready, depth.leased) == (1, 0)
    again = await queue.claim("other", lease_seconds=30)
    assert again == Job(id="j", kind="learn", payload=b"p", attempts=1)


async def test_release_leaves_a_later_delivery_and_finished_jobs_alone(
    queue: LearningQueue,
) -> None:
    """A stale release (the lease ran out and another worker holds the job now) does not
    take the job from its new holder; releasing an acknowledged job does nothing."""
    await queue.enqueue("learn", "j", b"p", tenant="t1")
    stale = await queue.claim("slow", lease_seconds=LEASE)
    assert stale is not None
    await asyncio.sleep(LEASE + SLACK)
    current = await queue.claim("other", lease_seconds=30)
    assert current is not None
    assert current.attempts == 2
    await queue.release(stale)
    assert await queue.claim("third", lease_seconds=30) is None
    assert (await queue.depth()).leased == 1
    await queue.ack(current)
    await queue.release(current)
    assert await queue.claim("third", lease_seconds=30) is None
    depth = await queue.depth()
    assert (depth.ready, depth.leased, depth.delayed, depth.dead) == (0, 0, 0, 0)


async def test_oldest_ready_age_tracks_the_job_waiting_longest(queue: LearningQueue) -> None:
    """The age is None with nothing waiting, grows while the oldest ready job waits, and
    ignores leased and not-yet-due delayed jobs."""
    assert await queue.oldest_ready_age() is None
    await queue.enqueue("learn", "a", b"", tenant="t1")
    await asyncio.sleep(LEASE)
    await queue.enqueue("learn", "b", b"", tenant="t1")
    age = await queue.oldest_ready_age()
    assert age is not None
    assert LEASE - SLACK <= age < LEASE + 5
    first = await queue.claim("w", lease_seconds=30)
    assert first is not None
    assert first.id == "a"
    younger = await queue.oldest_ready_age()
    assert younger is not None
    assert younger < age  # only "b" waits now
    second = await queue.claim("w", lease_seconds=30)
    assert second is not None
    await queue.retry(second, error="x", delay_seconds=30)
    assert await queue.oldest_ready_age() is None  # leased and delayed: nobody waits


async def test_flush_jobs_wait_behind_exchange_and_learn_jobs(queue: LearningQueue) -> None:
    """However many flush jobs wait, an exchange or learn job enqueued after them is the
    next one claimed; a flush retried to ready at once still waits behind them; the flushes
    come out, oldest first, when nothing else is ready."""
    await queue.enqueue_many([NewJob("flush", f"flush:{n:03d}", b"", "t") for n in range(200)])
    await queue.enqueue("learn", "learn:late", b"", tenant="t")
    first = await queue.claim("w", lease_seconds=30)
    assert first is not None
    assert first.id == "learn:late"
    flush = await queue.claim("w", lease_seconds=30)
    assert flush is not None
    assert flush.id == "flush:000"
    await queue.retry(flush, error="again", delay_seconds=0)
    await queue.enqueue("exchange", "exchange:late", b"", tenant="t")
    nxt = await queue.claim("w", lease_seconds=30)
    assert nxt is not None
    assert nxt.id == "exchange:late"
    rest = [j.id for j in await claim_all(queue)]
    assert len(rest) == 200
    assert rest[:-1] == [f"flush:{n:03d}" for n in range(1, 200)]
    assert rest[-1] == "flush:000"  # retried: back at the end of the flushes


async def test_a_pending_flush_id_is_enqueued_once_and_free_again_once_acknowledged(
    queue: LearningQueue,
) -> None:
    """The idle flush's id (one per conversation): enqueued again while it is ready or
    leased, nothing changes; after its ack the same id is enqueued anew."""
    for _ in range(5):
        await queue.enqueue("flush", "flush:t:u:c", b"1", tenant="t")
    assert (await queue.depth_by_kind())[("flush", "ready")] == 1
    job = await queue.claim("w", lease_seconds=30)
    assert job is not None
    await queue.enqueue("flush", "flush:t:u:c", b"2", tenant="t")
    counts = await queue.depth_by_kind()
    assert (counts[("flush", "ready")], counts[("flush", "leased")]) == (0, 1)
    await queue.ack(job)
    await queue.enqueue("flush", "flush:t:u:c", b"3", tenant="t")
    again = await queue.claim("w", lease_seconds=30)
    assert again is not None
    assert (again.id, again.payload, again.attempts) == ("flush:t:u:c", b"3", 1)


async def test_depth_by_kind_counts_every_kind_and_state(queue: LearningQueue) -> None:
    """Every (kind, state) pair is present; the counts agree with depth(), and a delayed
    job that fell due counts as ready."""
    assert set((await queue.depth_by_kind()).values()) == {0}
    assert len(await queue.depth_by_kind()) == 12
    await queue.enqueue_many([NewJob(kind, f"{prefix}{n}", b"", "t") for kind, prefix in (
        ("exchange", "x"), ("learn", "l"), ("flush", "f")) for n in (1, 2)])
    x1, x2, l1 = [await queue.claim("w", lease_seconds=30) for _ in range(3)]  # x1 leased
    assert x1 is not None
    assert x2 is not None
    assert l1 is not None
    assert (x1.id, x2.id, l1.id) == ("x1", "x2", "l1")
    await queue.bury(x2, error="boom")  # x2 dead
    await queue.retry(l1, error="later", delay_seconds=30)  # l1 delayed
    l2 = await queue.claim("w", lease_seconds=30)  # claimed before the flushes, put off
    assert l2 is not None
    assert l2.id == "l2"
    await queue.retry(l2, error="soon", delay_seconds=LEASE)
    counts = await queue.depth_by_kind()
    expected = {("exchange", "leased"): 1, ("exchange", "dead"): 1, ("learn", "delayed"): 2,
                ("flush", "ready"): 2}
    assert {k: v for k, v in counts.items() if v} == expected
    await asyncio.sleep(LEASE + SLACK)
    counts = await queue.depth_by_kind()
    assert (counts[("learn", "ready")], counts[("learn", "delayed")]) == (1, 1)
    depth = await queue.depth()
    for state in ("ready", "delayed", "leased", "dead"):
        assert sum(n for (_, s), n in counts.items() if s == state) == getattr(depth, state)


# erasure of the user's words -------------------------------------------------------------

def _group_turn(lines: list[tuple[str, str]], *, speaker: str, request: str,
                at: float) -> Exchange:
    """A group exchange in ``group:team`` sent by ``speaker``: ``lines`` are (name, text)
    user lines, the last of them the request's new message, then a reply."""
    import dataclasses

    messages = [TranscriptMessage(role="user", text=text, name=name,
                                  fingerprint=f"fp-{name}-{text}") for name, text in lines]
    messages[-1] = dataclasses.replace(messages[-1], new=True, request=request)
    return dataclasses.replace(
        exchange((*messages, msg("assistant", f"re {at}")), user="group:team",
                 group="team", at=at), speaker=speaker)


async def test_erase_user_forgets_their_fingerprints_buffers_and_group_lines(
        queue: LearningQueue) -> None:
    """erase_user drops the user's own buffer and seen fingerprints (their resent history
    is new again), and their lines — under their display name, or their own request's
    new message — from the group's unsealed buffer and from a sealed group batch; other
    users' fingerprints and lines stay."""
    await queue.buffer(exchange(turn("I live in Lisbon")), batch_size=9, now=1000)
    await queue.buffer(exchange(turn("I live in Porto"), user="u2"), batch_size=9, now=1000)
    await queue.buffer(_group_turn([("Bob", "we meet on fridays"),
                                    ("Alice", "alice keeps quokkas")],
                                   speaker="u1", request="rq_g1", at=1001),
                       batch_size=99, now=1001)
    sealed = await queue.seal("t1", "group:team", "c1", now=1002)
    assert sealed is not None
    await queue.buffer(_group_turn([("alice ", "alice hums zebra songs"),
                                    ("Bob", "bob brings tea")],
                                   speaker="u2", request="rq_g2", at=1003),
                       batch_size=99, now=1003)
    await queue.buffer(_group_turn([("Al", "my own words on kiwis")],
                                   speaker="u1", request="rq_g3", at=1004),
                       batch_size=99, now=1004)

    assert await queue.erase_user("t1", "u1", names=["Alice"]) == 3

    assert await queue.buffered_conversations("t1", "u1") == []
    again = await queue.buffer(exchange(turn("I live in Lisbon")), batch_size=1, now=1005)
    assert again is not None  # its fingerprint was forgotten: new again
    assert await queue.buffer(exchange(turn("I live in Porto"), user="u2"),
                              batch_size=1, now=1005) is None  # u2's stays seen
    old = await queue.load_batch(sealed)
    assert old is not None
    assert texts(old) == ["we meet on fridays", "re 1001"]
    fresh = await queue.load_batch(await queue.seal("t1", "group:team", "c1", now=1006) or "")
    assert fresh is not None
    assert texts(fresh) == ["bob brings tea", "re 1003", "re 1004"]


async def test_erase_user_leaves_group_lines_of_other_names_and_tenants(
        queue: LearningQueue) -> None:
    """Negative case: a user with no bound names and no own lines in the group removes
    nothing from it; a group of another tenant is never touched."""
    await queue.buffer(_group_turn([("Bob", "bob brings tea")], speaker="u2",
                                   request="rq_b", at=1000), batch_size=99, now=1000)
    other = _group_turn([("Alice", "alice in t2")], speaker="u1", request="rq_t2", at=1000)
    import dataclasses

    await queue.buffer(dataclasses.replace(other, tenant="t2"), batch_size=99, now=1000)
    assert await queue.erase_user("t1", "u1", names=[]) == 0
    assert await queue.erase_user("t1", "u1", names=["Alice"]) == 0
    kept = await queue.load_batch(await queue.seal("t1", "group:team", "c1", now=1001) or "")
    assert kept is not None
    assert "bob brings tea" in texts(kept)
    t2 = await queue.load_batch(await queue.seal("t2", "group:team", "c1", now=1001) or "")
    assert t2 is not None
    assert "alice in t2" in texts(t2)


async def test_a_message_seen_under_an_alias_is_not_buffered_again(
        queue: LearningQueue) -> None:
    """A resent message whose fingerprint changed (a rotated key, or keying an old store)
    is seen when one of its aliases was recorded; one whose aliases were never recorded
    is new."""
    old = TranscriptMessage(role="user", text="I brew kombucha", fingerprint="fp-old-1")
    await queue.buffer(exchange((old,)), batch_size=9, now=1000)
    rotated = TranscriptMessage(role="user", text="I brew kombucha", fingerprint="fp-new-1",
                                aliases=("fp-legacy-1", "fp-old-1"))
    unseen = TranscriptMessage(role="user", text="I grow basil", fingerprint="fp-new-2",
                               aliases=("fp-never-seen",))
    await queue.buffer(exchange((rotated, unseen), at=1001), batch_size=9, now=1001)
    batch = await queue.load_batch(await queue.seal("t1", "u1", "c1", now=1002) or "")
    assert batch is not None
    assert texts(batch) == ["I brew kombucha", "I grow basil"]
