"""Several learning workers on one queue, and workers that die mid-job (docs/design.md#reliability).

Each "node" is what one process opens (:func:`~proxy.resources.open_resources`): its own
Redis client, queue handle, sink and worker; the learning model is the scripted upstream
reached in process. Several nodes on one Redis prefix are several gateway pods and
``memory-proxy worker`` processes sharing a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.learning.queue import Job, LearningQueue
from proxy.learning.sink import Turn
from proxy.learning.worker import Worker
from proxy.memory.store import ListQuery
from proxy.resources import Resources, open_resources
from proxy.settings import Settings
from tests.fakes import FakeUpstream, make_settings, redis_storage, relay_to

LEASE = 1.0  # seconds a doomed worker's learn job stays leased

_USER_LINE = re.compile(r"^\[\d+\] user(?: \([^)]*\))?: (.*)$", re.MULTILINE)


def user_lines(body: dict[str, Any]) -> list[str]:
    return _USER_LINE.findall(body["messages"][1]["content"])


def one_fact_per_user_line(body: dict[str, Any]) -> dict[str, Any]:
    return {"memories": [{"title": text[:30], "content": text, "category": "domain",
                          "subject": "user"} for text in user_lines(body)], "profile": None}


@contextlib.asynccontextmanager
async def node(settings: Settings, upstream: FakeUpstream) -> AsyncIterator[Resources]:
    """The resources of one process, learning from ``upstream`` in process."""
    from proxy.upstream.dispatch import Dispatcher
    from proxy.upstream.litellm_adapter import LiteLLMUpstream

    async with relay_to(upstream, settings) as relay:
        dispatcher = Dispatcher(relay, LiteLLMUpstream(settings.upstream))
        async with open_resources(settings, upstream=dispatcher) as res:
            yield res


def worker_of(res: Resources) -> Worker:
    assert res.worker is not None
    return res.worker


def queue_of(res: Resources) -> LearningQueue:
    assert res.queue is not None
    return res.queue


def conversation_turns(user: str, conversation: str, count: int) -> list[Turn]:
    """``count`` turns of one conversation, each resending the history so far."""
    turns, history = [], []
    for index in range(count):
        text = f"I have been to the town of {user}-{conversation}-{index:03d} on a bicycle."
        history.append({"role": "user", "content": text})
        turns.append(Turn(tenant="t", user=user, conversation=conversation, channel="private",
                          group=None, model="m", messages=list(history), reply="Noted.",
                          at=time.time()))
        history.append({"role": "assistant", "content": "Noted."})
    return turns


async def drain_together(workers: list[Worker], queue: LearningQueue) -> list[int]:
    """Run the workers side by side until no job is ready, delayed or leased; then flush
    what batches left partial (as the idle flush does) and run them again. Returns how
    many jobs each worker did."""
    done = [0] * len(workers)
    for flushed in (False, True):
        if flushed:
            for tenant, user, conversation in await queue.idle_conversations(
                    idle_before=float("inf")):
                await queue.enqueue("flush", f"flush:{tenant}:{user}:{conversation}",
                                    orjson.dumps({"tenant": tenant, "user": user,
                                                  "conversation": conversation}),
                                    tenant=tenant)
        for _ in range(50):
            counts = await asyncio.gather(*(w.drain() for w in workers))
            done = [a + b for a, b in zip(done, counts, strict=True)]
            depth = await queue.depth()
            if depth.ready == depth.delayed == depth.leased == 0:
                break
            await asyncio.sleep(0.02)
    return done


@pytest.mark.redis
async def test_two_workers_drain_one_queue_and_apply_every_batch_once(
    tmp_path: Path, redis_url: str, redis_prefix: str,
) -> None:
    """Two worker processes on one Redis queue learn a few hundred exchanges of several
    users together: every user message reaches the learner exactly once, each is stored
    once with one piece of evidence, and no job is left or dead."""
    settings = make_settings(tmp_path, storage=redis_storage(tmp_path, redis_url, redis_prefix),
                             learning={"enabled": True, "batch_messages": 5})
    upstream = FakeUpstream()
    upstream.extract = one_fact_per_user_line
    users = {f"user{u}": [f"c{c}" for c in range(3)] for u in range(4)}
    turns = [t for user, conversations in users.items() for c in conversations
             for t in conversation_turns(user, c, 21)]
    async with node(settings, upstream) as gateway, node(settings, upstream) as second:
        for turn in turns:
            gateway.sink.submit(turn)
        await gateway.sink.flush()
        queue = queue_of(gateway)
        assert (await queue.depth()).ready == len(turns)
        workers = [worker_of(gateway), worker_of(second)]
        done = await drain_together(workers, queue)
        assert min(done) > len(turns) / 4  # both took a real share
        learned = Counter(line for kind, body in upstream.learning_calls if kind == "extract"
                          for line in user_lines(body))
        expected = {t.messages[-1]["content"] for t in turns}
        assert set(learned) == expected
        assert set(learned.values()) == {1}
        for user in users:
            stored = await gateway.store.list_memories(ListQuery(tenant="t", user=user,
                                                                 limit=1000))
            assert len(stored) == 3 * 21
            assert {m.hits for m in stored} == {1}
        depth = await queue.depth()
        assert (depth.ready, depth.delayed, depth.leased, depth.dead,
                depth.buffered_messages) == (0, 0, 0, 0, 0)
        assert await queue.dead_letters() == []
        assert await queue.idle_conversations(idle_before=float("inf")) == []


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def shared_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """Learning settings on either backend, batch of one."""
    storage: dict[str, object] = {"path": str(tmp_path / "memory.db")}
    if request.param == "redis":
        storage = redis_storage(tmp_path, request.getfixturevalue("redis_url"),
                                request.getfixturevalue("redis_prefix"))
    return make_settings(tmp_path, storage=storage, learning={
        "enabled": True, "batch_messages": 1, "retry_base_seconds": 0.01})


async def learn_job(res: Resources, upstream: FakeUpstream, text: str,
                    *, lease_seconds: float) -> Job:
    """Submit one turn, buffer it (sealing a batch), and claim the batch's learn job."""
    upstream.extract = lambda body: {"memories": [{
        "title": text[:30], "content": text, "category": "user_preference",
        "subject": "user"}]}
    res.sink.submit(Turn(tenant="t", user="u1", conversation="c1", channel="private",
                         group=None, model="m", messages=[{"role": "user", "content": text}],
                         reply="Nice.", at=time.time()))
    await res.sink.flush()
    assert await worker_of(res).run_once()  # exchange → sealed batch → learn job
    job = await queue_of(res).claim("doomed-worker", lease_seconds=lease_seconds)
    assert job is not None
    assert job.kind == "learn"
    return job


async def learned(res: Resources) -> list[tuple[str, int]]:
    return [(m.content, m.hits)
            for m in await res.store.list_memories(ListQuery(tenant="t", user="u1"))]


async def test_a_job_whose_worker_died_mid_extraction_is_finished_by_another(
    shared_settings: Settings,
) -> None:
    """A worker killed while the learning model is answering leaves its learn job leased;
    once the lease ends another process's worker learns the batch, once."""
    upstream = FakeUpstream()
    answering = asyncio.Event()
    never = asyncio.Event()

    async def hang_on_extract(request: httpx.Request) -> httpx.Response:
        if b"New messages" in request.content and not answering.is_set():
            answering.set()
            await never.wait()
        return await upstream.respond(request)

    async with node(shared_settings, upstream) as first, \
            node(shared_settings, upstream) as second:
        job = await learn_job(first, upstream, "Keeps three cats", lease_seconds=LEASE)
        upstream.intercept = hang_on_extract
        dying = asyncio.create_task(worker_of(first).process(job))
        await asyncio.wait_for(answering.wait(), 5)
        dying.cancel()  # the process is killed mid-call: no ack, no retry
        with contextlib.suppress(asyncio.CancelledError):
            await dying
        assert not await worker_of(second).run_once()  # the lease still holds
        await asyncio.sleep(LEASE + 0.1)
        assert await worker_of(second).drain() == 1
        assert await learned(second) == [("Keeps three cats", 1)]
        # the first worker's extraction was never answered; the second scores afresh
        assert [k for k, _ in upstream.learning_calls] == ["score", "score", "extract"]
        depth = await queue_of(second).depth()
        assert (depth.ready, depth.leased, depth.dead) == (0, 0, 0)


class LostAcks:
    """The queue as seen by a process that dies right after finishing a job: everything
    reaches the queue except the acknowledgement."""

    def __init__(self, queue: LearningQueue) -> None:
        self._queue = queue

    def __getattr__(self, name: str) -> Callable[..., Any]:
        attribute: Callable[..., Any] = getattr(self._queue, name)
        return attribute

    async def ack(self, job: Job) -> None:
        return None


async def test_a_job_finished_but_not_acknowledged_is_not_applied_twice(
    shared_settings: Settings,
) -> None:
    """A worker that learned a batch and died before acknowledging it leaves the job to be
    redelivered after the lease; the redelivery changes nothing."""
    upstream = FakeUpstream()
    async with node(shared_settings, upstream) as first, \
            node(shared_settings, upstream) as second:
        job = await learn_job(first, upstream, "Plays the oboe", lease_seconds=LEASE)
        doomed = worker_of(first)
        doomed.queue = LostAcks(doomed.queue)  # type: ignore[assignment]
        await doomed.process(job)
        assert await learned(first) == [("Plays the oboe", 1)]
        await asyncio.sleep(LEASE + 0.1)
        assert await worker_of(second).drain() == 1
        assert await learned(second) == [("Plays the oboe", 1)]
        audit = [e.action for _, e in await second.store.audit_log("t", "u1")]
        assert audit.count("created") == 1
        depth = await queue_of(second).depth()
        assert (depth.ready, depth.leased, depth.dead) == (0, 0, 0)
