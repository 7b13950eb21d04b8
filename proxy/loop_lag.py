"""Event-loop lag, and deadlines that count only the time the loop was free.

A deadline on the wall clock cannot tell a slow store from a busy gateway: when the event
loop has many requests ready to run (a closed loop of 64 chats on two cores), a reply that
arrived from Redis in 1 ms waits tens of milliseconds for the loop to resume its request,
and a 150 ms recall deadline runs out although the store answered at once — memory then
switched off for nearly every reply exactly when the gateway was busy
(docs/design.md#recall-deadline).

:class:`LoopLag` measures that wait: a heartbeat task sleeps :data:`BEAT_SECONDS` and adds
how late it woke up (the time the loop was busy with other work, or the process waited for a
CPU) to a running total; once late, it looks again at every turn of the loop until a turn
finds the loop idle, so the whole busy stretch is counted. :func:`loop_free_deadline` is
``asyncio.timeout`` counting only the elapsed time not in that total, within a hard bound
on the wall clock: a store that does not answer (a frozen Redis) still ends the wait after
``seconds`` of an idle loop, and after at most ``hard_seconds`` of a busy one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

# How often the heartbeat wakes (seconds): the resolution of the lag it measures. 100
# wake-ups a second cost ~1.5 ms of CPU per second (bench/gateway measures the request path
# with it running).
BEAT_SECONDS = 0.01
# Beats without a deadline started (1 s): the heartbeat then sleeps until the next one, so
# an idle gateway does not wake 100 times a second.
IDLE_BEATS = 100
# A beat later than this means the loop is busy: the next one is taken at the loop's next
# turn (``sleep(0)``), so every turn spent on other work counts, not all but one beat of
# it. Above a timer's usual slack on Linux (well under a millisecond).
BUSY_SECONDS = 0.002


class LoopLag:
    """Running total of the event loop's lag, in seconds, for the loop it is started on.

    :meth:`start` creates the heartbeat task (inside a running loop); :meth:`stop` cancels
    it. :meth:`total` is the lag measured so far plus how overdue the current beat already
    is, so a reading taken while the loop is stuck counts the stall too. ``on_lag``
    (optional) receives each beat's lag in seconds (a metric). After :data:`IDLE_BEATS`
    beats without a :meth:`touch` the heartbeat rests (nothing is measured) until the next
    touch: a deadline touches it as it starts."""

    def __init__(self, *, beat_seconds: float = BEAT_SECONDS,
                 on_lag: Callable[[float], None] | None = None) -> None:
        self._beat = beat_seconds
        self._on_lag = on_lag
        self._total = 0.0
        self._due: float | None = None  # loop time the sleeping beat should wake at
        self._task: asyncio.Task[None] | None = None
        self._touched = True
        self._wake = asyncio.Event()

    def touch(self) -> None:
        """A deadline is about to use :meth:`total`: measure (again, if resting)."""
        self._touched = True
        self._wake.set()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._due = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def total(self, now: float) -> float:
        """Lag in seconds up to loop time ``now``; 0 while not running."""
        due = self._due
        return self._total + (now - due if due is not None and now > due else 0.0)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        busy = False
        quiet = 0
        while True:
            if self._touched:
                self._touched, quiet = False, 0
            elif not busy:
                quiet += 1
                if quiet >= IDLE_BEATS:  # rest until a deadline touches it
                    self._due = None
                    self._wake.clear()
                    await self._wake.wait()
                    continue
            if busy:  # the loop is busy: look again at its next turn, counting it all
                self._due = loop.time()
                await asyncio.sleep(0)
            else:
                self._due = loop.time() + self._beat
                await asyncio.sleep(self._beat)
            late = loop.time() - self._due
            busy = late > BUSY_SECONDS
            if late > 0:
                self._total += late
                if self._on_lag is not None:
                    self._on_lag(late)


@contextlib.asynccontextmanager
async def loop_free_deadline(seconds: float, *, lag: LoopLag | None,
                             hard_seconds: float) -> AsyncIterator[None]:
    """As ``asyncio.timeout(seconds)``, counting only elapsed time the event loop was free
    (wall time minus ``lag``'s growth meanwhile), and never longer than ``hard_seconds``
    on the wall clock. Raises :class:`TimeoutError` when either runs out. With ``lag``
    ``None`` or not running, or ``hard_seconds`` not above ``seconds``, a plain
    ``asyncio.timeout(seconds)``."""
    if lag is None or not lag.running or hard_seconds <= seconds:
        async with asyncio.timeout(seconds):
            yield
        return
    lag.touch()
    loop = asyncio.get_running_loop()
    started = loop.time()
    lag_at_start = lag.total(started)
    async with asyncio.timeout(hard_seconds) as bound:
        handle: asyncio.TimerHandle | None = None

        def check() -> None:
            nonlocal handle
            now = loop.time()
            used = (now - started) - (lag.total(now) - lag_at_start)
            if used >= seconds:
                bound.reschedule(now)  # expires at once: the block is cancelled
            else:
                handle = loop.call_at(now + seconds - used, check)

        handle = loop.call_at(started + seconds, check)
        try:
            yield
        finally:
            if handle is not None:
                handle.cancel()
