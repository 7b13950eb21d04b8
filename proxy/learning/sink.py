"""Gateway side of learning: completed turns → the durable queue, off the critical path.

The chat route calls :meth:`QueueSink.submit` after the reply was fully sent; it only puts
the turn on an in-process queue and never blocks or raises. A background task turns turns
into :class:`~proxy.learning.exchange.Exchange` jobs: it fingerprints the messages, skips
those this process already queued (an LRU set: clients resend the whole history each
turn) except the request's new user message (a repeat is evidence; the queue tells a
retry of the same request apart, :data:`~proxy.learning.exchange.RETRY_WINDOW_SECONDS`),
scrubs PII and secrets from the rest (nothing unscrubbed is ever written: docs/design.md#privacy),
and enqueues them in batches. If the process dies with turns still in memory,
those messages are not lost for good: they are in the next turn's resent history.

**Spool.** When the queue store cannot be written (Redis or the SQLite file unreachable),
nothing is dropped after one failed write: the jobs already built stay in the writer and are
retried with exponential backoff (:data:`RETRY_BASE_SECONDS` doubling up to
:data:`RETRY_MAX_SECONDS`, ±20 % jitter) until the store returns; meanwhile new turns wait
in the bounded in-process buffer (``capacity`` turns). Only past that cap is a turn dropped,
and then it is counted (``memory_proxy_learning_events_total{event="spool_dropped",
label="turn"}``), warned about at most every :data:`WARN_EVERY_SECONDS`, and shown on
``/readyz`` (:meth:`QueueSink.spool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import structlog

from proxy.learning.exchange import (
    Exchange,
    TranscriptMessage,
    as_told_by,
    group_namespace,
    transcript,
)
from proxy.learning.fingerprints import UNKEYED, Fingerprinter
from proxy.learning.jobs import exchange_job
from proxy.learning.privacy import Scrubbers
from proxy.learning.queue import NewJob
from proxy.memory.records import new_id
from proxy.metrics import Metrics
from proxy.request import Message

log = structlog.get_logger("proxy.learning")
RETRY_BASE_SECONDS = 0.5  # first wait after a failed enqueue
RETRY_MAX_SECONDS = 30.0  # longest wait between two tries while the store is away
WARN_EVERY_SECONDS = 60.0  # throttled warning about dropped turns


@dataclass(frozen=True, slots=True)
class SpoolState:
    """What the gateway holds for learning that is not written yet (``/readyz``)."""

    pending_turns: int  # turns in the in-process buffer
    unwritten_jobs: int  # jobs built and waiting for the queue store to come back
    dropped_turns: int  # since start, past the buffer's cap
    failing_since: float | None  # epoch seconds of the first failed write in a row


@dataclass(frozen=True, slots=True)
class Turn:
    """A completed turn as the chat route saw it (client messages, not spliced ones)."""

    tenant: str
    user: str
    conversation: str
    channel: str
    group: str | None
    model: str
    messages: list[Message]
    reply: str
    at: float
    # False when the user switched personal learning off: the turn's message
    # fingerprints are recorded as seen — never learned, not even when resent later — and
    # no text of it is queued.
    learn: bool = True
    # Whether the caller may name other speakers (an app key, the open mode); False for a
    # user-bound key: its group turns become its own knowledge (exchange.as_told_by).
    names_trusted: bool = True


class LearningSink(Protocol):
    def submit(self, turn: Turn) -> None: ...

    async def run(self) -> None: ...

    async def flush(self) -> None:
        """Write every pending turn now."""
        ...

    def forget_seen(self) -> None:
        """Drop the in-process memory of recently seen fingerprints (an erasure: the
        erased user's resent history must reach the queue, which forgot them too)."""
        ...

    async def aclose(self) -> None: ...

    def spool(self) -> SpoolState: ...


class NullSink:
    """Learning is off: turns go nowhere."""

    def submit(self, _turn: Turn) -> None:
        return None

    async def run(self) -> None:
        return None

    async def flush(self) -> None:
        return None

    def forget_seen(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def spool(self) -> SpoolState:
        return SpoolState(0, 0, 0, None)


class Enqueuer(Protocol):
    async def enqueue_many(self, jobs: list[NewJob]) -> None: ...

    async def mark_seen(self, exchange: Exchange, *, now: float) -> None: ...


class QueueSink:
    def __init__(
        self,
        queue: Enqueuer,
        scrubbers: Scrubbers,
        *,
        max_messages: int,
        metrics: Metrics | None = None,
        capacity: int = 10_000,
        batch: int = 200,
        recent: int = 100_000,
        fingerprints: Fingerprinter = UNKEYED,
    ) -> None:
        self._queue = queue
        self._fingerprints = fingerprints
        self._scrubbers = scrubbers
        self._max_messages = max_messages
        self._metrics = metrics
        self._pending: asyncio.Queue[Turn] = asyncio.Queue(capacity)
        self._batch = batch
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._recent_cap = recent
        # Built jobs not yet written (the store was away), with the fingerprints they
        # carry; written before any newer turn.
        self._unwritten: list[NewJob] = []
        self._unwritten_seen: list[str] = []
        self._failures = 0
        self._failing_since: float | None = None
        self._dropped = 0
        self._warned_at = 0.0
        self._lock = asyncio.Lock()

    def submit(self, turn: Turn) -> None:
        try:
            self._pending.put_nowait(turn)
        except asyncio.QueueFull:
            self._dropped += 1
            if self._metrics is not None:
                self._metrics.sink_dropped.inc()
                self._metrics.learning_events.labels("spool_dropped", "turn").inc()
            now = time.monotonic()
            if now - self._warned_at >= WARN_EVERY_SECONDS:
                self._warned_at = now
                log.warning("learning_spool_full", dropped_total=self._dropped,
                            capacity=self._pending.maxsize,
                            detail="the learning queue store has been unreachable; turns "
                                   "past the in-process buffer are not learned")

    def spool(self) -> SpoolState:
        return SpoolState(pending_turns=self._pending.qsize(),
                          unwritten_jobs=len(self._unwritten), dropped_turns=self._dropped,
                          failing_since=self._failing_since)

    async def run(self) -> None:
        """Write turns until cancelled (then :meth:`aclose` writes what is left). While the
        queue store is away, wait with backoff and retry the unwritten jobs; new turns wait
        in the bounded buffer meanwhile."""
        while True:
            if self._unwritten:
                await asyncio.sleep(self._retry_delay())
                async with self._lock:
                    await self._write_unwritten()
                continue
            turns = [await self._pending.get()]
            while len(turns) < self._batch and not self._pending.empty():
                turns.append(self._pending.get_nowait())
            async with self._lock:
                await self._write(turns)

    def _retry_delay(self) -> float:
        delay = min(RETRY_BASE_SECONDS * 2 ** max(0, self._failures - 1), RETRY_MAX_SECONDS)
        return float(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter

    async def aclose(self) -> None:
        """Write what is buffered now (one try; what fails stays for the next)."""
        async with self._lock:
            if self._unwritten:
                await self._write_unwritten()
                if self._unwritten:
                    return
            turns = []
            while not self._pending.empty():
                turns.append(self._pending.get_nowait())
            if turns:
                with contextlib.suppress(Exception):
                    await self._write(turns)

    async def flush(self) -> None:
        """Write everything pending now (used by the explicit flush endpoint and tests)."""
        await self.aclose()

    def forget_seen(self) -> None:
        """:meth:`LearningSink.forget_seen`: the cache is by fingerprint alone, so all of
        it goes (the queue dedupes again what it still knows)."""
        self._recent.clear()

    async def _write_unwritten(self) -> None:
        jobs, seen = self._unwritten, self._unwritten_seen
        if await self._enqueue(jobs, seen):
            self._unwritten, self._unwritten_seen = [], []

    async def _enqueue(self, jobs: list[NewJob], seen: list[str]) -> bool:
        """One try; on failure the caller keeps the jobs. True when written."""
        try:
            await self._queue.enqueue_many(jobs)
        except Exception as exc:
            self._failures += 1
            if self._failing_since is None:
                self._failing_since = time.time()
            log.warning("learning_enqueue_failed", jobs=len(jobs), attempt=self._failures,
                        error=f"{type(exc).__name__}: {exc}"[:300])
            return False
        if self._failures:
            log.info("learning_enqueue_recovered", jobs=len(jobs), attempts=self._failures)
        self._failures, self._failing_since = 0, None
        for fingerprint in seen:
            self._recent[fingerprint] = None
        while len(self._recent) > self._recent_cap:
            self._recent.popitem(last=False)
        return True

    async def _write(self, turns: list[Turn]) -> None:
        jobs: list[NewJob] = []
        fresh: list[str] = []
        unlearned: list[Exchange] = []
        for turn in turns:
            group, channel, sent = turn.group, turn.channel, turn.messages
            if group is not None and not turn.names_trusted:
                group, channel, sent = None, "private", as_told_by(turn.messages)
            owner = group_namespace(group) if group is not None else turn.user
            # Resent history is skipped by fingerprint; the request's new user message is
            # always queued (the queue drops it only as a retry of the same request).
            messages = [
                m for m in transcript(tenant=turn.tenant, user=owner,
                                      messages=sent, reply=turn.reply,
                                      limit=self._max_messages,
                                      conversation=turn.conversation,
                                      keys=self._fingerprints)
                if m.new or m.fingerprint not in self._recent
            ]
            # Only a trusted caller binds a display name to its user (exchange module doc).
            speaker_name = _latest_name(sent) if turn.names_trusted else None
            binding = f"{turn.tenant}\x1f{turn.user}\x1f{speaker_name}" if speaker_name else None
            if not messages and (binding is None or binding in self._recent):
                continue  # nothing new to learn, and the user's name is already known
            if not turn.learn:
                unlearned.append(Exchange(
                    id=new_id(), tenant=turn.tenant, user=owner,
                    conversation=turn.conversation, channel=turn.channel, group=turn.group,
                    model=turn.model, at=turn.at, speaker=turn.user,
                    messages=tuple(TranscriptMessage(role=m.role, text="",
                                                     fingerprint=m.fingerprint)
                                   for m in messages)))
                continue
            scrubber = self._scrubbers.for_tenant(turn.tenant)
            scrubbed = tuple(
                TranscriptMessage(role=m.role, text=scrubber.scrub(m.text).text,
                                  fingerprint=m.fingerprint, name=m.name, images=m.images,
                                  request=m.request, new=m.new, aliases=m.aliases)
                for m in messages
            )
            exchange = Exchange(
                id=new_id(), tenant=turn.tenant, user=owner,
                conversation=turn.conversation, channel=channel, group=group,
                model=turn.model, messages=scrubbed, at=turn.at, speaker=turn.user,
                speaker_name=speaker_name,
            )
            jobs.append(exchange_job(exchange))
            fresh.extend(m.fingerprint for m in messages)
            if binding is not None:
                fresh.append(binding)
            await asyncio.sleep(0)  # scrubbing is CPU work: let requests in between turns
        for exchange in unlearned:
            try:
                await self._queue.mark_seen(exchange, now=exchange.at)
            except Exception:
                log.exception("learning_mark_seen_failed")
                continue
            for message in exchange.messages:
                self._recent[message.fingerprint] = None
        if not jobs:
            return
        if not await self._enqueue(jobs, fresh):
            # Kept, and retried with backoff by run() before any newer turn.
            self._unwritten, self._unwritten_seen = jobs, fresh


def _latest_name(messages: list[Message]) -> str | None:
    for message in reversed(messages):
        if message.get("role") == "user":
            name = message.get("name")
            return name.strip() if isinstance(name, str) and name.strip() else None
    return None
