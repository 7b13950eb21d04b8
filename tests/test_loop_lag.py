"""Deadlines that count only the time the event loop was free (proxy/loop_lag.py): a
store that answered at once is not timed out because the loop was busy, a store that never
answers still is — after the deadline on an idle loop, after the hard bound on a busy one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from proxy.loop_lag import LoopLag, loop_free_deadline
from tests.fakes import busy_loop, hold

BUSY_SECONDS = 0.04  # each turn of the hog holds the loop this long


async def store_read(turns: int) -> str:
    """A read answered at once whose caller needs ``turns`` loop turns to resume (a
    request's few awaits: pool, send, reply)."""
    for _ in range(turns):
        await asyncio.sleep(0)
    return "answer"


@pytest.fixture
async def lag() -> AsyncIterator[LoopLag]:
    seen: list[float] = []
    meter = LoopLag(on_lag=seen.append)
    meter.start()
    await asyncio.sleep(0.03)
    try:
        yield meter
    finally:
        await meter.stop()


async def test_a_busy_loop_does_not_time_out_a_store_that_answered(lag: LoopLag) -> None:
    async with busy_loop(BUSY_SECONDS):
        started = time.monotonic()
        async with loop_free_deadline(0.1, lag=lag, hard_seconds=5.0):
            assert await store_read(turns=6) == "answer"
        assert time.monotonic() - started > 0.1  # the wall clock alone would have ended it


async def test_the_wall_clock_deadline_times_it_out_on_the_same_busy_loop() -> None:
    """The control: the same read under a plain deadline of the same length fails."""
    async with busy_loop(BUSY_SECONDS):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await store_read(turns=6)


async def test_without_a_running_meter_the_deadline_is_the_wall_clock() -> None:
    stopped = LoopLag()
    async with busy_loop(BUSY_SECONDS):
        with pytest.raises(TimeoutError):
            async with loop_free_deadline(0.1, lag=stopped, hard_seconds=5.0):
                await store_read(turns=6)
        with pytest.raises(TimeoutError):
            async with loop_free_deadline(0.1, lag=None, hard_seconds=5.0):
                await store_read(turns=6)


async def test_a_store_that_never_answers_ends_at_the_deadline_on_an_idle_loop(
    lag: LoopLag,
) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with loop_free_deadline(0.1, lag=lag, hard_seconds=5.0):
            await asyncio.Event().wait()
    assert 0.09 < time.monotonic() - started < 2.0


async def test_a_store_that_never_answers_ends_by_the_hard_bound_on_a_busy_loop(
    lag: LoopLag,
) -> None:
    async with busy_loop(BUSY_SECONDS):
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with loop_free_deadline(0.1, lag=lag, hard_seconds=0.5):
                await asyncio.Event().wait()
        assert time.monotonic() - started < 0.5 + 4 * BUSY_SECONDS + 1.0


async def test_the_meter_counts_the_time_the_loop_was_held(lag: LoopLag) -> None:
    loop = asyncio.get_running_loop()
    before = lag.total(loop.time())
    hold(0.2)  # the loop is held: the sleeping beat is overdue meanwhile
    assert lag.total(loop.time()) - before >= 0.15
    await asyncio.sleep(0.05)
    after = lag.total(loop.time())
    assert after - before >= 0.15
    await lag.stop()
    assert not lag.running
    stopped = lag.total(loop.time())
    hold(0.05)
    assert lag.total(loop.time()) == stopped  # stopped: nothing more is added


async def test_an_idle_meter_rests_until_a_deadline_touches_it() -> None:
    """With no deadline for IDLE_BEATS beats the heartbeat stops waking (a held loop is
    not measured); the next deadline wakes it and the lag is measured again."""
    meter = LoopLag(beat_seconds=0.002)
    meter.start()
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(0.002 * 100 * 3)  # well past IDLE_BEATS beats
        resting = meter.total(loop.time())
        hold(0.1)
        assert meter.total(loop.time()) == resting
        async with loop_free_deadline(1.0, lag=meter, hard_seconds=5.0):
            await asyncio.sleep(0.01)  # the beat is running again
            hold(0.1)
            assert meter.total(loop.time()) - resting >= 0.09
    finally:
        await meter.stop()
