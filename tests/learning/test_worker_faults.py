"""The learning worker under faults: crashes, timeouts, rate limits, store outages,
truncated output. Nothing wrong is written; nothing is applied twice."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.backends.sqlite.queue import SqliteLearningQueue
from proxy.learning.queue import LearningQueue
from proxy.learning.runner import MAX_ERROR_PAUSE_SECONDS, backoff
from proxy.learning.worker import Worker
from proxy.memory.store import ListQuery, StoreUnavailableError
from tests.fakes import (
    FakeUpstream,
    FlakyQueue,
    Gateway,
    Reply,
    eventually,
    make_settings,
    running_gateway,
)


@pytest.fixture
async def faulty(tmp_path: Path, upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    settings = make_settings(tmp_path, learning={
        "enabled": True, "batch_messages": 1, "max_attempts": 3, "retry_base_seconds": 0.01,
        "lease_seconds": 5})
    async with running_gateway(settings, upstream) as gateway:
        yield gateway


def fact(content: str) -> dict[str, Any]:
    return {"memories": [{"title": content[:30], "content": content,
                          "category": "user_preference", "subject": "user"}]}


async def say(gateway: Gateway, text: str) -> None:
    async with gateway.client() as client:
        response = await client.post("/v1/chat/completions", headers={"X-User-Id": "u1"},
                                     json={"model": "m",
                                           "messages": [{"role": "user", "content": text}]})
    assert response.status_code == 200


def fail_extractions(upstream: FakeUpstream, times: int,
                     error: type[httpx.TransportError]) -> dict[str, int]:
    """Make the next ``times`` extraction calls fail with ``error`` (a transport error,
    raised before the fake sees them); the returned ``{"left": n}`` counts down."""
    failures = {"left": times}

    async def flaky(request: httpx.Request) -> httpx.Response:
        if b"NEW messages" in request.content and failures["left"] > 0:
            failures["left"] -= 1
            raise error("upstream failed", request=request)
        return await upstream.respond(request)

    upstream.intercept = flaky
    return failures


async def memories(gateway: Gateway) -> list[tuple[str, int]]:
    found = await gateway.res.store.list_memories(ListQuery(tenant="default", user="u1"))
    return [(m.content, m.hits) for m in found]


async def drain_with_waits(gateway: Gateway, rounds: int = 20) -> None:
    """Run the worker until the queue is empty, waiting out retry delays."""
    assert gateway.res.worker is not None
    assert gateway.res.queue is not None
    await gateway.res.sink.flush()
    for _ in range(rounds):
        await gateway.res.worker.drain()
        depth = await gateway.res.queue.depth()
        if depth.ready == depth.delayed == depth.leased == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the queue did not drain")


def second_worker(gateway: Gateway, queue: LearningQueue | None = None) -> Worker:
    """Another worker on the gateway's store and model, over ``queue`` (default: the
    gateway's), polling every 10 ms."""
    worker = gateway.res.worker
    assert worker is not None
    assert gateway.res.queue is not None
    settings = gateway.res.settings.learning.model_copy(update={"poll_interval_seconds": 0.01})
    return Worker(queue=queue or gateway.res.queue, store=gateway.res.store,
                  model=worker.model, scrubbers=gateway.res.scrubbers, settings=settings,
                  worker_id="second", metrics=gateway.res.metrics)


def worker_errors(gateway: Gateway, label: str) -> float:
    metric = gateway.res.metrics.learning_events.labels(event="worker_error", label=label)
    return float(metric._value.get())


async def test_job_of_a_dead_worker_is_redelivered_after_its_lease(
    faulty: Gateway, upstream: FakeUpstream
) -> None:
    """A worker that dies holding a job (no ack) loses it when the lease runs out; another
    worker then does it, once."""
    upstream.extract = lambda body: fact("Rides a unicycle")
    await say(faulty, "I ride a unicycle.")
    await faulty.res.sink.flush()
    queue = faulty.res.queue
    assert queue is not None
    held = await queue.claim("dead-worker", lease_seconds=0.3)
    assert held is not None  # claimed and never finished: the worker "died"
    other = second_worker(faulty)
    assert not await other.run_once()  # still leased
    await asyncio.sleep(0.35)
    await other.drain()
    assert await memories(faulty) == [("Rides a unicycle", 1)]


async def test_timeouts_are_retried_then_succeed(faulty: Gateway, upstream: FakeUpstream) -> None:
    """A learning call that times out is retried with backoff and then learned once."""
    upstream.extract = lambda body: fact("Speaks Basque")
    await say(faulty, "I speak Basque.")
    failures = fail_extractions(upstream, 2, httpx.ReadTimeout)
    await drain_with_waits(faulty)
    assert await memories(faulty) == [("Speaks Basque", 1)]
    assert failures["left"] == 0


async def test_rate_limit_retry_after_is_honoured(faulty: Gateway, upstream: FakeUpstream) -> None:
    """A 429 with Retry-After delays the job by that long."""
    await say(faulty, "I keep chickens.")
    await faulty.res.sink.flush()
    assert faulty.res.worker is not None
    assert faulty.res.queue is not None
    assert await faulty.res.worker.run_once()  # exchange → sealed batch → learn job
    upstream.push(Reply(status=429, json={"error": {"message": "slow down",
                                                    "type": "rate_limit_error"}},
                        headers={"retry-after": "30"}))
    before = time.time()
    assert await faulty.res.worker.run_once()  # learn → 429
    depth = await faulty.res.queue.depth()
    assert (depth.ready, depth.delayed) == (0, 1)
    import sqlite3

    with sqlite3.connect(faulty.res.settings.storage.path) as conn:
        available_at, error = conn.execute(
            "SELECT available_at, last_error FROM jobs WHERE kind = 'learn'").fetchone()
    assert 29 <= available_at - before <= 32
    assert "RateLimitError" in error


def test_backoff_grows_exponentially_with_a_cap() -> None:
    """Backoff doubles per attempt (±20 % jitter) and is capped at five minutes."""
    assert 1.6 <= backoff(1, base=2) <= 2.4
    assert 6.4 <= backoff(3, base=2) <= 9.6
    assert backoff(30, base=2) == 300
    assert backoff(5, base=2, retry_after=7) == 7


async def test_store_outage_mid_batch_is_retried(faulty: Gateway, upstream: FakeUpstream) -> None:
    """When the store fails while applying a batch, nothing partial is written and the
    batch is learned once the store is back."""
    upstream.extract = lambda body: fact("Plays the theremin")
    store = faulty.res.store
    worker = faulty.res.worker
    assert worker is not None
    original = store.apply
    calls = {"n": 0}

    async def failing_once(changes: Any) -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreUnavailableError("the store restarted")
        return await original(changes)

    store.apply = failing_once  # type: ignore[method-assign]
    await say(faulty, "I play the theremin.")
    await drain_with_waits(faulty)
    assert calls["n"] == 2
    assert await memories(faulty) == [("Plays the theremin", 1)]


async def test_truncated_extraction_is_retried_with_more_tokens(
    faulty: Gateway, upstream: FakeUpstream
) -> None:
    """An extraction cut off by max_tokens writes nothing and is asked again with twice the
    token budget."""
    answers = iter([Reply(json={
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": '{"memories": [{"title": "Sail", "content": "Sa'}}],
    })])

    def extract(body: dict[str, Any]) -> Any:
        return next(answers, None) or fact("Sails a small dinghy")

    upstream.extract = extract
    await say(faulty, "I sail a small dinghy.")
    await drain_with_waits(faulty)
    budgets = [body["max_tokens"] for kind, body in upstream.learning_calls if kind == "extract"]
    assert budgets[1] == 2 * budgets[0]
    assert await memories(faulty) == [("Sails a small dinghy", 1)]


@pytest.mark.parametrize("window", [4096, 64000])
async def test_a_retry_never_shows_the_model_less_of_the_conversation(
    tmp_path: Path, upstream: FakeUpstream, window: int
) -> None:
    """An empty or length-cut answer, as reasoning models give, is a failure, not "no
    facts"; a retried extraction asks for twice the reply tokens only while the
    transcript still fits beside them: with the shipped local model's 4096-token window
    and 2048 reply tokens, doubling would leave no room for the conversation, so the retry
    keeps 2048 and still sees (and learns) what the user said; with a large window it
    doubles."""
    settings = make_settings(
        tmp_path,
        model_list=[{"model_name": "m", "litellm_params": {
            "model": "openai/up-model", "api_base": "http://upstream.test/v1",
            "api_key": "sk-upstream"}, "model_info": {"max_input_tokens": window}}],
        learning={"enabled": True, "batch_messages": 1, "max_attempts": 3,
                  "retry_base_seconds": 0.01, "max_output_tokens": 2048})
    upstream.extract = lambda body: (fact("Lives in Porto") if "Porto" in str(body["messages"])
                                     else {"memories": [], "profile": None})
    async with running_gateway(settings, upstream) as gateway:
        await say(gateway, "I moved to Porto last year.")
        failures = fail_extractions(upstream, 1, httpx.ConnectError)
        await drain_with_waits(gateway)
        assert await memories(gateway) == [("Lives in Porto", 1)]
    assert failures["left"] == 0
    extracts = [body for kind, body in upstream.learning_calls if kind == "extract"]
    assert len(extracts) == 1  # the failed attempt never reached the fake
    assert extracts[0]["max_tokens"] == (2048 if window == 4096 else 4096)


async def test_garbage_forever_ends_in_the_dead_letter_list(
    faulty: Gateway, upstream: FakeUpstream
) -> None:
    """A model that never answers usably is retried max_attempts times, then the job is
    dead-lettered with its last error; it can be requeued."""
    upstream.extract = lambda body: "Sure! Here are the facts: the user is nice."
    await say(faulty, "I restore old radios.")
    await drain_with_waits(faulty)
    queue = faulty.res.queue
    assert queue is not None
    dead = await queue.dead_letters()
    assert len(dead) == 1
    assert dead[0].attempts == 3
    assert "ParseError" in dead[0].last_error
    assert await memories(faulty) == []
    kinds = [kind for kind, _ in upstream.learning_calls]
    assert kinds == ["score", "extract", "extract", "extract"]  # the score is kept
    upstream.extract = lambda body: fact("Restores old radios")
    assert await queue.requeue(dead[0].id)
    await drain_with_waits(faulty)
    assert await memories(faulty) == [("Restores old radios", 1)]


async def run_until_learned(gateway: Gateway, worker: Worker) -> asyncio.Task[None]:
    """Run ``worker.run`` until u1 has a memory; the task is returned still running."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))

    async def learned() -> bool:
        assert not task.done(), "Worker.run ended"
        return bool(await memories(gateway))

    try:
        await eventually(learned)
    finally:
        stop.set()
    return task


async def test_worker_keeps_running_through_queue_outages(
    faulty: Gateway, upstream: FakeUpstream
) -> None:
    """The queue failing on claim — a locked SQLite file, an unreachable store — is logged
    and counted; the worker backs off, goes on, and learns the job afterwards."""
    upstream.extract = lambda body: fact("Grows chillies")
    await say(faulty, "I grow chillies.")
    await faulty.res.sink.flush()
    assert faulty.res.queue is not None
    flaky = FlakyQueue(faulty.res.queue, [
        sqlite3.OperationalError("database is locked"),
        StoreUnavailableError("sqlite learning queue write failed: database is locked"),
        StoreUnavailableError("redis learning queue claim failed: connection refused"),
    ])
    with capture_logs() as logs:
        task = await run_until_learned(faulty, second_worker(faulty, flaky))
        await task
    assert flaky.failures == 3
    assert await memories(faulty) == [("Grows chillies", 1)]
    assert worker_errors(faulty, "store_unavailable") == 2
    assert worker_errors(faulty, "unexpected") == 1
    events = [e["event"] for e in logs]
    assert events.count("learning_store_unavailable") == 2
    assert events.count("learning_worker_error") == 1
    assert events[-1] == "learning_worker_stopped"


async def test_unexpected_exceptions_do_not_end_the_worker(
    faulty: Gateway, upstream: FakeUpstream
) -> None:
    """Any exception type from the queue (here a RuntimeError, a bug) is logged with its
    traceback and counted; Worker.run goes on. A worker on a healthy queue counts none."""
    upstream.extract = lambda body: fact("Collects stamps")
    await say(faulty, "I collect stamps.")
    await faulty.res.sink.flush()
    assert faulty.res.queue is not None
    flaky = FlakyQueue(faulty.res.queue, [RuntimeError("bug"), KeyError("bug"),
                                           ValueError("bug")])
    with capture_logs() as logs:
        task = await run_until_learned(faulty, second_worker(faulty, flaky))
        await task
    assert task.exception() is None
    assert await memories(faulty) == [("Collects stamps", 1)]
    assert worker_errors(faulty, "unexpected") == 3
    crashed = [e for e in logs if e["event"] == "learning_worker_error"]
    assert len(crashed) == 3
    assert all(e["log_level"] == "error" and e.get("exc_info") for e in crashed)

    upstream.extract = lambda body: fact("Collects coins")
    await say(faulty, "I collect coins.")
    await faulty.res.sink.flush()
    healthy = second_worker(faulty)
    stop = asyncio.Event()
    run = asyncio.create_task(healthy.run(stop))

    async def both() -> bool:
        return len(await memories(faulty)) == 2

    await eventually(both)
    stop.set()
    await run
    assert worker_errors(faulty, "unexpected") == 3


def test_error_pauses_grow_from_the_poll_interval_to_a_cap(faulty: Gateway) -> None:
    """After failures in a row the loop waits the poll interval, then twice as long each
    time, never more than the cap."""
    worker = second_worker(faulty)  # polls every 10 ms
    assert worker._pause(0) == worker._pause(1) == 0.01
    assert worker._pause(2) == 0.02
    assert worker._pause(4) == 0.08
    assert worker._pause(40) == worker._pause(10_000) == MAX_ERROR_PAUSE_SECONDS


async def test_worker_outlasts_a_locked_database_file(
    faulty: Gateway, upstream: FakeUpstream
) -> None:
    """Another process holding BEGIN EXCLUSIVE on the SQLite file past the busy timeout:
    the queue reports StoreUnavailableError (not sqlite3's error), the worker keeps
    trying, and learns the job once the lock is released."""
    upstream.extract = lambda body: fact("Brews kombucha")
    await say(faulty, "I brew kombucha.")
    await faulty.res.sink.flush()
    path = faulty.res.settings.storage.path
    async with SqliteDatabase(path, busy_timeout=0.05) as db:
        queue = SqliteLearningQueue(db)
        worker = second_worker(faulty, queue)
        lock = sqlite3.connect(path, isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            with pytest.raises(StoreUnavailableError, match="database is locked"):
                await queue.claim("w", lease_seconds=5)
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))

            async def refused_twice() -> bool:
                return worker_errors(faulty, "store_unavailable") >= 2

            await eventually(refused_twice)
            assert not task.done()
            assert await memories(faulty) == []
            lock.execute("COMMIT")
        finally:
            lock.close()

        async def learned() -> bool:
            assert not task.done(), "Worker.run ended"
            return bool(await memories(faulty))

        try:
            await eventually(learned)
        finally:
            stop.set()
            await task
    assert await memories(faulty) == [("Brews kombucha", 1)]
    assert worker_errors(faulty, "unexpected") == 0


async def test_readyz_reports_a_learning_worker_that_ended(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """/readyz says learning "on" while the gateway's worker task runs, and "stopped"
    (status degraded, still 200) once it has ended."""
    settings = make_settings(tmp_path, learning={"enabled": True})
    async with running_gateway(settings, upstream, run_worker=True) as gateway:
        async with gateway.client() as client:
            ready = await client.get("/readyz")
            assert ready.json()["checks"]["learning"] == "on"
            assert ready.json()["status"] == "ok"
            task = gateway.res.worker_task
            assert task is not None
            assert not task.done()
            task.cancel()  # the worker task ends while the gateway runs on
            with pytest.raises(asyncio.CancelledError):
                await task
            ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"]["learning"] == "stopped"
        assert ready.json()["status"] == "degraded"


async def test_readyz_learning_without_an_in_process_worker(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """A gateway that leaves learning to ``memory-proxy worker`` processes (no worker task
    here) reports learning "on"; with learning off, "off"."""
    for enabled, expected in ((True, "on"), (False, "off")):
        settings = make_settings(tmp_path / expected, learning={"enabled": enabled})
        async with running_gateway(settings, upstream) as gateway, gateway.client() as client:
            ready = (await client.get("/readyz")).json()
        assert gateway.res.worker_task is None
        assert (ready["checks"]["learning"], ready["status"]) == (expected, "ok")
