"""The gateway's learning writer keeps what it was told while the queue store is away:
retried with backoff, dropped only past the buffer's cap, and counted."""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import pytest

from proxy.learning import sink as sink_module
from proxy.learning.privacy import Scrubbers
from proxy.learning.queue import NewJob
from proxy.learning.sink import QueueSink, Turn
from proxy.memory.store import StoreUnavailableError
from proxy.metrics import Metrics
from proxy.settings import PiiSettings


class AwayQueue:
    """An enqueuer that fails while ``away``; records every job it accepted."""

    def __init__(self) -> None:
        self.away = True
        self.tries = 0
        self.jobs: list[NewJob] = []

    async def enqueue_many(self, jobs: list[NewJob]) -> None:
        self.tries += 1
        if self.away:
            raise StoreUnavailableError("queue store away")
        self.jobs.extend(jobs)


def turn(text: str, user: str = "u1") -> Turn:
    return Turn(tenant="t", user=user, conversation=f"c-{text}", channel="private",
                group=None, model="m", messages=[{"role": "user", "content": text}],
                reply="ok", at=1.0)


def events(metrics: Metrics, event: str, label: str) -> float:
    value = metrics.registry.get_sample_value(
        "memory_proxy_learning_events_total", {"event": event, "label": label})
    return value or 0.0


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "RETRY_BASE_SECONDS", 0.01)
    monkeypatch.setattr(sink_module, "RETRY_MAX_SECONDS", 0.05)


async def test_turns_written_while_the_store_is_away_are_retried_until_it_returns() -> None:
    """A failed enqueue keeps the jobs; they are retried (several times, with backoff)
    and written once each when the store returns, along with turns sent meanwhile."""
    queue = AwayQueue()
    sink = QueueSink(queue, Scrubbers(PiiSettings()), max_messages=20)
    runner = asyncio.create_task(sink.run())
    try:
        for text in ("I keep bees.", "I live in Lyon.", "I play chess."):
            sink.submit(turn(text))
        for _ in range(500):
            if queue.tries >= 4:
                break
            await asyncio.sleep(0.01)
        assert queue.tries >= 4
        state = sink.spool()
        assert state.unwritten_jobs + state.pending_turns >= 1
        assert state.failing_since is not None
        queue.away = False
        for _ in range(500):
            if not sink.spool().unwritten_jobs and not sink.spool().pending_turns:
                break
            await asyncio.sleep(0.01)
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    texts = sorted(m["text"] for job in queue.jobs
                   for m in orjson.loads(job.payload)["messages"]
                   if m["role"] == "user")
    assert texts == ["I keep bees.", "I live in Lyon.", "I play chess."]
    assert sink.spool().dropped_turns == 0
    assert sink.spool().failing_since is None


async def test_turns_past_the_cap_are_dropped_and_counted() -> None:
    """With the store away and the buffer full, a further turn is dropped and counted
    (metric event ``spool_dropped``, label ``turn``; the spool state); the turns within
    the cap are still written once the store returns."""
    queue = AwayQueue()
    metrics = Metrics()
    sink = QueueSink(queue, Scrubbers(PiiSettings()), max_messages=20, metrics=metrics,
                     capacity=2)
    for text in ("one", "two", "three", "four"):
        sink.submit(turn(text))
    assert sink.spool().dropped_turns == 2
    assert events(metrics, "spool_dropped", "turn") == 2
    await sink.flush()  # fails: kept
    assert sink.spool().unwritten_jobs == 2
    queue.away = False
    await sink.flush()
    assert len(queue.jobs) == 2
    assert sink.spool().unwritten_jobs == 0
