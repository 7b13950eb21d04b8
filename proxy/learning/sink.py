"""Gateway side of learning: completed turns → the durable queue, off the critical path.

The chat route calls :meth:`QueueSink.submit` after the reply was fully sent; it only puts
the turn on an in-process queue and never blocks or raises. A background task turns turns
into :class:`~proxy.learning.exchange.Exchange` jobs: it fingerprints the messages, skips
those this process already queued (an LRU set: clients resend the whole history each
turn), scrubs PII and secrets from the rest (SPEC §3.2 — nothing unscrubbed is ever
written), and enqueues them in batches. If the process dies with turns still in memory,
those messages are not lost for good: they are in the next turn's resent history.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import orjson
import structlog

from proxy.learning.exchange import Exchange, TranscriptMessage, group_namespace, transcript
from proxy.learning.privacy import Scrubbers
from proxy.learning.queue import JobKind
from proxy.memory.records import new_id
from proxy.metrics import Metrics
from proxy.request import Message

log = structlog.get_logger("proxy.learning")


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
    # False when the user switched personal learning off (issue 12): the turn's message
    # fingerprints are recorded as seen — never learned, not even when resent later — and
    # no text of it is queued.
    learn: bool = True


class LearningSink(Protocol):
    def submit(self, turn: Turn) -> None: ...

    async def run(self) -> None: ...

    async def flush(self) -> None:
        """Write every pending turn now."""
        ...

    async def aclose(self) -> None: ...


class NullSink:
    """Learning is off: turns go nowhere."""

    def submit(self, _turn: Turn) -> None:
        return None

    async def run(self) -> None:
        return None

    async def flush(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class Enqueuer(Protocol):
    async def enqueue_many(self, jobs: list[tuple[JobKind, str, bytes]]) -> None: ...

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
    ) -> None:
        self._queue = queue
        self._scrubbers = scrubbers
        self._max_messages = max_messages
        self._metrics = metrics
        self._pending: asyncio.Queue[Turn] = asyncio.Queue(capacity)
        self._batch = batch
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._recent_cap = recent

    def submit(self, turn: Turn) -> None:
        try:
            self._pending.put_nowait(turn)
        except asyncio.QueueFull:
            if self._metrics is not None:
                self._metrics.sink_dropped.inc()

    async def run(self) -> None:
        """Write turns until cancelled (then :meth:`aclose` writes what is left)."""
        while True:
            turns = [await self._pending.get()]
            while len(turns) < self._batch and not self._pending.empty():
                turns.append(self._pending.get_nowait())
            await self._write(turns)

    async def aclose(self) -> None:
        turns = []
        while not self._pending.empty():
            turns.append(self._pending.get_nowait())
        if turns:
            with contextlib.suppress(Exception):
                await self._write(turns)

    async def flush(self) -> None:
        """Write everything pending now (used by the explicit flush endpoint and tests)."""
        await self.aclose()

    async def _write(self, turns: list[Turn]) -> None:
        jobs: list[tuple[JobKind, str, bytes]] = []
        fresh: list[str] = []
        unlearned: list[Exchange] = []
        for turn in turns:
            owner = group_namespace(turn.group) if turn.group is not None else turn.user
            messages = [
                m for m in transcript(tenant=turn.tenant, user=owner,
                                      messages=turn.messages, reply=turn.reply,
                                      limit=self._max_messages)
                if m.fingerprint not in self._recent
            ]
            speaker_name = _latest_name(turn.messages)
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
                                  fingerprint=m.fingerprint, name=m.name, images=m.images)
                for m in messages
            )
            exchange = Exchange(
                id=new_id(), tenant=turn.tenant, user=owner,
                conversation=turn.conversation, channel=turn.channel, group=turn.group,
                model=turn.model, messages=scrubbed, at=turn.at, speaker=turn.user,
                speaker_name=speaker_name,
            )
            jobs.append(("exchange", f"exchange:{exchange.id}", orjson.dumps(exchange.to_json())))
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
        try:
            await self._queue.enqueue_many(jobs)
        except Exception:
            log.exception("learning_enqueue_failed", jobs=len(jobs))
            return
        for fingerprint in fresh:
            self._recent[fingerprint] = None
        while len(self._recent) > self._recent_cap:
            self._recent.popitem(last=False)


def _latest_name(messages: list[Message]) -> str | None:
    for message in reversed(messages):
        if message.get("role") == "user":
            name = message.get("name")
            return name.strip() if isinstance(name, str) and name.strip() else None
    return None
