"""The learning worker: claims jobs, learns from batches, never blocks chat (SPEC §3).

``exchange`` → buffer unseen messages (and seal a batch when full); ``flush`` → seal what a
conversation holds; ``learn`` → gates → score → extract → filter → consolidate → apply.
Failures (upstream errors, unparseable output, store outages) are retried with exponential
backoff — honouring Retry-After — and dead-lettered after ``learning.max_attempts``;
a worker that dies leaves its job leased, and the lease runs out into a redelivery. The
store applies each batch at most once (batch key), so redelivery never double-counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

import orjson
import structlog

from proxy.errors import ProxyError, RateLimitError
from proxy.learning.consolidate import BatchContext, consolidate
from proxy.learning.exchange import Exchange
from proxy.learning.filters import FactFilter, is_directive
from proxy.learning.model import LearningModel
from proxy.learning.parsing import (
    ParseError,
    ProfileUpdate,
    parse_extraction,
    parse_scoring,
)
from proxy.learning.pii import Scrubber
from proxy.learning.prompts import (
    Language,
    extraction_messages,
    render_known,
    scoring_messages,
)
from proxy.learning.queue import Batch, Job, LearningQueue, batch_sizes
from proxy.memory.records import ConversationRecord, utcnow
from proxy.memory.store import AuditEvent, ChangeSet, MemoryStore, StoreUnavailableError
from proxy.memory.text import has_cjk, load_segmenter_for, normalize
from proxy.metrics import Metrics
from proxy.settings import LearningSettings

log = structlog.get_logger("proxy.learning")
MAX_BACKOFF_SECONDS = 300.0


def backoff(attempt: int, *, base: float, retry_after: float | None = None) -> float:
    """Seconds before the next attempt: Retry-After when the upstream gave one, else
    ``base × 2^(attempt-1)`` with ±20 % jitter, capped at 5 minutes."""
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, MAX_BACKOFF_SECONDS)
    delay = base * (2 ** max(0, attempt - 1))
    jitter: float = random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not cryptography
    return float(min(delay * jitter, MAX_BACKOFF_SECONDS))


class Worker:
    def __init__(
        self,
        *,
        queue: LearningQueue,
        store: MemoryStore,
        model: LearningModel,
        scrubber: Scrubber,
        settings: LearningSettings,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] = utcnow,
        worker_id: str | None = None,
    ) -> None:
        self.queue = queue
        self._store = store
        self._model = model
        self._scrubber = scrubber
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._last_maintenance = 0.0

    # loop ------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Process jobs until ``stop`` is set; cancellation leaves the current job leased
        (it is redelivered after its lease)."""
        log.info("learning_worker_started", worker=self.worker_id)
        while not stop.is_set():
            try:
                if time.time() - self._last_maintenance >= \
                        self._settings.maintenance_interval_seconds:
                    await self.maintenance()
                worked = await self.run_once()
            except StoreUnavailableError as exc:
                log.warning("learning_store_unavailable", error=str(exc))
                worked = False
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._settings.poll_interval_seconds)
        log.info("learning_worker_stopped", worker=self.worker_id)

    async def run_once(self) -> bool:
        """Claim and process one job; ``False`` when none was ready."""
        job = await self.queue.claim(self.worker_id, lease_seconds=self._settings.lease_seconds)
        if job is None:
            return False
        await self.process(job)
        return True

    async def drain(self, *, max_jobs: int = 10_000) -> int:
        """Process ready jobs until none is left (tests, flush endpoint). Returns the count."""
        done = 0
        while done < max_jobs and await self.run_once():
            done += 1
        return done

    async def process(self, job: Job) -> None:
        handler = {"exchange": self._exchange, "flush": self._flush, "learn": self._learn}[
            job.kind
        ]
        try:
            await handler(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure is retried, then dead-lettered
            await self._failed(job, exc)
        else:
            await self.queue.ack(job)
            self._count("job_done", job.kind)

    async def _failed(self, job: Job, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, ProxyError | ParseError | StoreUnavailableError):
            log.exception("learning_job_crashed", job=job.id, kind=job.kind)
        if job.attempts >= self._settings.max_attempts:
            await self.queue.bury(job, error=error)
            self._count("job_dead", job.kind)
            log.error("learning_job_dead_lettered", job=job.id, kind=job.kind,
                      attempts=job.attempts, error=error)
            return
        retry_after = exc.retry_after if isinstance(exc, RateLimitError) else None
        delay = backoff(job.attempts, base=self._settings.retry_base_seconds,
                        retry_after=retry_after)
        await self.queue.retry(job, error=error, delay_seconds=delay)
        self._count("job_retried", job.kind)
        log.warning("learning_job_retry", job=job.id, kind=job.kind, attempt=job.attempts,
                    delay_s=round(delay, 2), error=error[:300])

    async def maintenance(self) -> None:
        """Seal idle conversations and expire raw text past its TTL."""
        now = time.time()
        self._last_maintenance = now
        idle = await self.queue.idle_conversations(
            idle_before=now - self._settings.idle_flush_seconds
        )
        bucket = int(now // self._settings.idle_flush_seconds)
        for tenant, user, conversation in idle:
            payload = orjson.dumps({"tenant": tenant, "user": user, "conversation": conversation})
            await self.queue.enqueue("flush", f"flush:{tenant}:{user}:{conversation}:{bucket}",
                                      payload)
        await self.queue.expire(
            buffered_before=now - self._settings.buffer_ttl_seconds,
            seen_before=now - self._settings.seen_message_ttl_days * 86400,
        )

    # handlers --------------------------------------------------------------
    async def _exchange(self, job: Job) -> None:
        exchange = Exchange.from_json(orjson.loads(job.payload))
        prefs = await self._store.get_user_settings(exchange.tenant, exchange.user)
        cleared = prefs.cleared_at.timestamp() if prefs.cleared_at else None
        batch_size = batch_sizes(exchange.channel, dict(self._settings.batch_messages))
        if not prefs.enable_personal_learning or (cleared is not None and exchange.at <= cleared):
            # Not learned now, and never later: the messages are marked seen.
            await self.queue.mark_seen(exchange, now=time.time())
            self._count("exchange_skipped", "learning_off")
            return
        key = await self.queue.buffer(exchange, batch_size=batch_size, now=time.time())
        if key is not None:
            self._count("batch_sealed", exchange.channel)

    async def _flush(self, job: Job) -> None:
        """Seal one conversation, or every buffered conversation of the user when the
        payload names none (explicit flush)."""
        data = orjson.loads(job.payload)
        tenant, user = data["tenant"], data["user"]
        conversation = data.get("conversation")
        targets = [conversation] if conversation else \
            await self.queue.buffered_conversations(tenant, user)
        for target in targets:
            await self.queue.seal(tenant, user, target, now=time.time())

    async def _learn(self, job: Job) -> None:
        key = orjson.loads(job.payload)["batch"]
        batch = await self.queue.load_batch(key)
        if batch is None:
            return  # learned (or discarded) already: redelivery
        tenant, user = batch.tenant, batch.user
        now = self._clock()
        prefs = await self._store.get_user_settings(tenant, user)
        if not prefs.enable_personal_learning or (
            prefs.cleared_at is not None and batch.oldest_at <= prefs.cleared_at.timestamp()
        ):
            await self._store.audit([self._event(batch, "skipped", "learning off or memory "
                                                 "cleared since these messages", now)])
            await self.queue.drop_batch(key)
            self._count("learn_outcome", "skipped_off")
            return
        user_text = "\n".join(m.text for m in batch.user_messages)
        language: Language = "zh" if has_cjk(user_text) else "en"
        related = await self._store.related(tenant, user, user_text,
                                            limit=self._settings.related_memories)
        known_text, short_ids = render_known(related)
        scored = parse_scoring(await self._model.call(
            purpose="score", request_model=batch.model, tenant=tenant, user=user,
            job_id=job.id, max_tokens=512,
            messages=scoring_messages(batch=batch, known=known_text, language=language,
                                      override=self._settings.scoring_prompt),
        ))
        weighted = scored.weighted
        audit = [self._event(batch, "scored", scored.reason[:500], now,
                             {"score": weighted, "dimensions": scored.dimensions})]
        if weighted < self._settings.score_threshold:
            audit.append(self._event(batch, "skipped", "score below threshold", now,
                                     {"score": weighted,
                                      "threshold": self._settings.score_threshold}))
            await self._apply(batch, ChangeSet(
                tenant=tenant, user_id=user, batch_key=key, audit=tuple(audit),
                conversation=_conversation_record(batch, weighted, scored.dimensions,
                                                  scored.reason, now),
            ))
            self._count("learn_outcome", "below_threshold")
            return
        truncated_before = job.attempts > 1
        extraction = parse_extraction(await self._model.call(
            purpose="extract", request_model=batch.model, tenant=tenant, user=user,
            job_id=job.id,
            max_tokens=self._settings.max_output_tokens * (2 if truncated_before else 1),
            messages=extraction_messages(batch=batch, known=known_text, language=language,
                                         override=self._settings.extraction_prompt),
        ))
        names = {user, *(m.name for m in batch.user_messages if m.name)}
        await load_segmenter_for(user_text, *(f"{f.title}\n{f.content}"
                                              for f in extraction.facts))
        facts_filter = FactFilter(user_text=user_text, scrubber=self._scrubber,
                                  user_names=names)
        accepted, rejected = facts_filter.split(extraction.facts)
        audit.append(self._event(batch, "extracted", "", now, {
            "facts": len(extraction.facts), "accepted": len(accepted),
            "rejected": len(rejected), "unusable": extraction.dropped,
        }))
        for verdict in rejected:
            audit.append(self._event(batch, "rejected", verdict.reason or "", now))
            self._count("fact_rejected", verdict.reason or "unknown")
        by_id = {m.id: m for m in related}
        tombstones = await self._store.tombstoned(
            tenant, user, [normalize(f.content) for f in accepted]
        )
        context = BatchContext(
            tenant=tenant, user=user, batch_key=key, conversation=batch.conversation,
            channel=batch.channel, now=now,
            batch_started=datetime.fromtimestamp(batch.oldest_at, UTC), score=weighted,
            known={short: by_id[memory_id] for short, memory_id in short_ids.items()},
            existing=related, tombstones=tombstones,
            dedup_similarity=self._settings.dedup_similarity,
            synonyms=self._settings.synonyms,
        )
        changes = consolidate(
            context, accepted, profile=await self._store.get_profile(tenant, user),
            profile_update=self._clean_profile(extraction.profile),
            user_messages=len(batch.user_messages), names=names - {user},
            dimensions=scored.dimensions, reason=scored.reason[:500],
        )
        await self._apply(batch, ChangeSet(
            tenant=changes.tenant, user_id=changes.user_id, batch_key=changes.batch_key,
            upserts=changes.upserts, evidence=changes.evidence, profile=changes.profile,
            conversation=changes.conversation, audit=(*audit, *changes.audit),
        ))
        self._count("learn_outcome", "learned")

    async def _apply(self, batch: Batch, changes: ChangeSet) -> None:
        applied = await self._store.apply(changes)
        if not applied:
            log.info("learning_batch_already_applied", batch=batch.key)
        await self.queue.drop_batch(batch.key)

    def _clean_profile(self, update: ProfileUpdate | None) -> ProfileUpdate | None:
        if update is None:
            return None

        def ok(text: str | None) -> bool:
            return bool(text) and not is_directive(text or "") and \
                not self._scrubber.contains_pii(text or "")

        return ProfileUpdate(
            style=update.style if ok(update.style) else None,
            impression=update.impression if ok(update.impression) else None,
            traits=tuple(t for t in update.traits if ok(t)),
            topics=tuple(t for t in update.topics if ok(t)),
        )

    @staticmethod
    def _event(batch: Batch, action: str, reason: str, at: datetime,
               detail: dict[str, object] | None = None) -> AuditEvent:
        return AuditEvent(
            tenant=batch.tenant, user_id=batch.user, action=action,  # type: ignore[arg-type]
            actor="auto", at=at, conversation_id=batch.conversation, reason=reason,
            detail={"batch": batch.key, **(detail or {})},
        )

    def _count(self, event: str, label: str) -> None:
        if self._metrics is not None:
            self._metrics.learning_events.labels(event=event, label=label).inc()



def _conversation_record(batch: Batch, score: float, dimensions: dict[str, float],
                         reason: str, now: datetime) -> ConversationRecord:
    return ConversationRecord(
        tenant=batch.tenant, user_id=batch.user, conversation_id=batch.conversation,
        score=score, dimensions=dimensions, reason=reason[:500],
        learned_messages=len(batch.user_messages), updated_at=now,
    )
