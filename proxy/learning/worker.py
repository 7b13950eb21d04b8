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
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import structlog

from proxy.errors import MemoryProxyError, RateLimitError
from proxy.learning import quotas
from proxy.learning.budget import WORKER_CACHE_SECONDS, BudgetSpent, LearningBudgets
from proxy.learning.consolidate import BatchContext, consolidate
from proxy.learning.exchange import (
    GROUP_PREFIX,
    TranscriptMessage,
    is_group_namespace,
)
from proxy.learning.filters import FactFilter, contains_pii, is_directive
from proxy.learning.jobs import Flush, flush_job, read_exchange, read_learn
from proxy.learning.model import LearningModel
from proxy.learning.parsing import (
    CandidateFact,
    ExtractionResult,
    ProfileUpdate,
    ScoreResult,
    parse_extraction,
    parse_scoring,
)
from proxy.learning.pii import Scrubber
from proxy.learning.policy import Switches
from proxy.learning.privacy import Scrubbers
from proxy.learning.prompts import (
    EXTRACTION_SCHEMA,
    SCORING_SCHEMA,
    Language,
    batch_images,
    clip_batch,
    extraction_messages,
    fit_batch,
    render_known,
    scoring_messages,
)
from proxy.learning.queue import Batch, Job, LearningQueue, batch_sizes
from proxy.ledger import Ledger
from proxy.memory.embed import Embedder, Vector
from proxy.memory.records import ConversationRecord, Memory, new_id, utcnow
from proxy.memory.store import (
    AuditEvent,
    ChangeSet,
    MemoryStore,
    ScanQuery,
    SearchQuery,
    StoreUnavailableError,
)
from proxy.memory.text import has_cjk, load_segmenter_for, normalize
from proxy.memory.vectors import MemoryVectors, vector_similarity
from proxy.metrics import Metrics
from proxy.request import Message
from proxy.settings import LearningSettings
from proxy.tenants import TenantSettings
from proxy.tokens import IMAGE_TOKENS

log = structlog.get_logger("proxy.learning")
MAX_BACKOFF_SECONDS = 300.0
# Longest wait of the run loop between attempts while the queue or store keeps failing
# (the first failure waits one poll interval, each further one twice the last): a locked
# SQLite file or a Redis restart is noticed within a minute of its end.
MAX_ERROR_PAUSE_SECONDS = 60.0
SCORE_CACHE_SIZE = 1024  # batches whose score is kept for their retries
SCORING_MAX_TOKENS = 512  # the scoring reply: one small JSON object
# Nearest stored memories per new fact, by vector, offered to consolidation's dedup
# besides the keyword-related ones (a paraphrase shares few keywords).
VECTOR_NEIGHBOURS = 3
# A job postponed by a spent learning budget is looked at again after at most this long
# (an admin may raise the budget before the period ends), else when the period ends.
BUDGET_RECHECK_SECONDS = 300.0
# Sealing waits while a budget is spent: messages stay buffered (under the buffer TTL).
NEVER_SEAL = 1 << 30


class LearningWindowTooSmall(MemoryProxyError):
    """The learning prompt and its reply fill the learning model's context window: the
    model would see none of the conversation. The attempt fails (retried, then
    dead-lettered with the transcript kept for a requeue once ``learning.model`` or
    ``learning.max_output_tokens`` is fixed) instead of a call that cannot learn."""


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
        scrubbers: Scrubbers,
        settings: LearningSettings,
        metrics: Metrics | None = None,
        clock: Callable[[], datetime] = utcnow,
        worker_id: str | None = None,
        embedder: Embedder | None = None,
        ledger: Ledger | None = None,
        tenants: TenantSettings | None = None,
    ) -> None:
        """``embedder`` (with the ``ledger`` its tokens are booked in) gives new memories
        vectors and feeds consolidation's similarity dedup; without it both are skipped.
        ``tenants``: run-time settings per tenant (issue 13), else ``settings`` for all;
        with a ``ledger``, ``learning.budget`` is enforced per tenant."""
        self.queue = queue
        self._store = store
        self.model = model
        self._scrubbers = scrubbers
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._last_maintenance = 0.0
        self._scores: OrderedDict[str, ScoreResult] = OrderedDict()
        self._vectors = None if embedder is None or ledger is None else \
            MemoryVectors(embedder, ledger=ledger, clock=clock, metrics=metrics)
        self._tenants = tenants
        self._budgets = None if ledger is None else \
            LearningBudgets(ledger, clock=clock, cache_seconds=WORKER_CACHE_SECONDS)

    # loop ------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Process jobs until ``stop`` is set. Setting ``stop`` (SIGTERM) interrupts the job
        in hand, which is released at once (:meth:`LearningQueue.release`: redelivered
        without waiting for its lease, no attempt counted); so does cancelling this task.
        Only a process that dies outright leaves its job leased until the lease runs out.

        Only cancellation ends the loop. A failure outside a job's own handling — the queue
        or store unreachable (:class:`StoreUnavailableError`, logged as a warning), or any
        other exception (logged with its traceback) — is counted
        (``learning_events{event="worker_error"}``) and the loop waits before it goes on:
        ``poll_interval_seconds`` after the first failure in a row, doubling with each
        further one up to :data:`MAX_ERROR_PAUSE_SECONDS`."""
        log.info("learning_worker_started", worker=self.worker_id)
        failures = 0
        while not stop.is_set():
            try:
                if time.time() - self._last_maintenance >= \
                        self._settings.maintenance_interval_seconds:
                    await self.maintenance()
                worked = await self.run_once(stop)
            except asyncio.CancelledError:
                raise
            except StoreUnavailableError as exc:
                failures += 1
                self._count("worker_error", "store_unavailable")
                log.warning("learning_store_unavailable", worker=self.worker_id,
                            error=str(exc), failures=failures)
                worked = False
            except Exception:  # anything else: logged, counted, and the loop goes on
                failures += 1
                self._count("worker_error", "unexpected")
                log.exception("learning_worker_error", worker=self.worker_id,
                              failures=failures)
                worked = False
            else:
                failures = 0
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._pause(failures))
        log.info("learning_worker_stopped", worker=self.worker_id)

    def _pause(self, failures: int) -> float:
        """Seconds to wait before the next claim: the poll interval, doubled for each
        failure in a row after the first, capped at :data:`MAX_ERROR_PAUSE_SECONDS` (never
        below the poll interval)."""
        poll = self._settings.poll_interval_seconds
        if failures <= 1:
            return poll
        grown: float = poll * 2.0 ** min(failures - 1, 32)
        return max(poll, min(grown, MAX_ERROR_PAUSE_SECONDS))

    async def run_once(self, stop: asyncio.Event | None = None) -> bool:
        """Claim and process one job; ``False`` when none was ready. When ``stop`` is set
        (or this task is cancelled) before the job is done, the job is interrupted and
        released."""
        job = await self.queue.claim(self.worker_id, lease_seconds=self._settings.lease_seconds)
        if job is None:
            return False
        if stop is None:
            await self.process(job)
            return True
        work = asyncio.ensure_future(self.process(job))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._interrupt(job, work)
            raise
        finally:
            stopped.cancel()
        if not work.done():
            await self._interrupt(job, work)
            return True
        work.result()
        return True

    async def _interrupt(self, job: Job, work: asyncio.Future[None]) -> None:
        """Cancel the job's processing and hand the job back to the queue."""
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        try:
            await self.queue.release(job)
        except Exception as exc:  # the lease then runs out as after a crash
            log.warning("learning_job_release_failed", job=job.id, error=str(exc))
            return
        self._count("job_released", job.kind)
        log.info("learning_job_released", worker=self.worker_id, job=job.id, kind=job.kind)

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
        except BudgetSpent as spent:  # waits for the next period, never dead-lettered
            delay = max(1.0, min(BUDGET_RECHECK_SECONDS,
                                 (spent.resumes_at - self._clock()).total_seconds()))
            await self.queue.postpone(job, reason=str(spent), delay_seconds=delay)
            self._count("budget_postponed", job.kind)
            log.info("learning_budget_spent", job=job.id, tenant=spent.tenant,
                     resumes_at=spent.resumes_at.isoformat(), recheck_s=round(delay))
        except Exception as exc:  # every failure is retried, then dead-lettered
            await self._failed(job, exc)
        else:
            await self.queue.ack(job)
            self._count("job_done", job.kind)

    async def _failed(self, job: Job, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, MemoryProxyError) or exc.log_traceback:
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
        expiring = await self.queue.idle_conversations(
            idle_before=now - self._settings.buffer_ttl_seconds)
        for tenant, _user, _conversation in expiring:
            if await self._budget_spent(tenant):
                self._count("budget_expired", "conversation")
        for tenant, user, conversation in idle:
            job = flush_job(Flush(tenant, user, conversation), unique=str(bucket))
            await self.queue.enqueue(job.kind, job.id, job.payload, tenant=job.tenant)
        await self.queue.expire(
            buffered_before=now - self._settings.buffer_ttl_seconds,
            seen_before=now - self._settings.seen_message_ttl_days * 86400,
        )
        await self.sweep_retention()

    async def sweep_retention(self, *, limit: int = 500) -> int:
        """Purge memories older than ``retention_days`` that were never injected (seed 000
        §6 MemoryRetentionDays). Returns how many went.

        A tenant's run-time ``learning.retention_days`` counts for its memories: the scan
        across tenants uses the config's value (a tenant with a longer one keeps its
        memories), and each tenant this process holds settings of with a shorter one gets
        a scan of its own."""
        now = self._clock()
        expired = await self._store.scan(ScanQuery(
            created_before=now - timedelta(days=self._settings.retention_days),
            never_accessed=True, limit=limit))
        if self._tenants is not None:
            kept = []
            for memory in expired:
                days = (await self._tenants.get(memory.tenant)).learning.retention_days
                if memory.created_at < now - timedelta(days=days):
                    kept.append(memory)
            expired = kept
            for config in self._tenants.cached():
                days = config.learning.retention_days
                if days < self._settings.retention_days:
                    expired += await self._store.scan(ScanQuery(
                        tenant=config.tenant, created_before=now - timedelta(days=days),
                        never_accessed=True, limit=limit))
        unique = list({m.id: m for m in expired}.values())
        await self._delete(unique, action="purged", reason="retention: never used")
        return len(unique)

    # handlers --------------------------------------------------------------
    async def _exchange(self, job: Job) -> None:
        exchange = read_exchange(job.payload)
        config = await self._config(exchange.tenant)
        if not Switches(tenant=config.enabled).tenant_learns:  # switched off (run-time)
            await self.queue.mark_seen(exchange, now=time.time())
            self._count("exchange_skipped", "tenant_learning_off")
            return
        prefs = await self._store.get_user_settings(exchange.tenant, exchange.user)
        batch_size = batch_sizes(exchange.channel, dict(config.batch_messages))
        if await self._budget_spent(exchange.tenant, config):
            batch_size = NEVER_SEAL  # buffered only: no batch while the budget is spent
        if not Switches().with_user(prefs).learns(said_at=exchange.at):
            # Not learned now, and never later: the messages are marked seen.
            await self.queue.mark_seen(exchange, now=time.time())
            self._count("exchange_skipped", "learning_off")
            return
        if exchange.speaker and exchange.speaker_name:
            await self._store.bind_names(exchange.tenant, exchange.speaker,
                                         [exchange.speaker_name])
        key = await self.queue.buffer(exchange, batch_size=batch_size, now=time.time())
        if key is not None:
            self._count("batch_sealed", exchange.channel)

    async def _flush(self, job: Job) -> None:
        """Seal one conversation, or every buffered conversation of the user when the
        payload names none (explicit flush)."""
        flush = Flush.from_bytes(job.payload)
        tenant, user, conversation = flush.tenant, flush.user, flush.conversation
        if await self._budget_spent(tenant):
            self._count("flush_skipped", "budget_spent")
            return  # the messages stay buffered (under the buffer TTL) until the period ends
        targets = [conversation] if conversation else \
            await self.queue.buffered_conversations(tenant, user)
        for target in targets:
            await self.queue.seal(tenant, user, target, now=time.time())

    async def _learn(self, job: Job) -> None:
        key = read_learn(job.payload)
        loaded = await self.queue.load_batch(key)
        if loaded is None:
            return  # learned (or discarded) already: redelivery
        # Messages are cut to MAX_MESSAGE_CHARS where they are buffered (exchange.transcript);
        # this covers batches buffered before that, for the calls and the checks alike.
        batch = clip_batch(loaded)
        setup = await self._tenant_setup(batch)
        if setup is None:
            return
        try:
            await self._learn_batch(job, key, batch, *setup)
        finally:  # this batch spent the tenant's tokens: its budget is read again
            if self._budgets is not None:
                self._budgets.forget(batch.tenant)

    async def _learn_batch(self, job: Job, key: str, batch: Batch,
                           config: LearningSettings, model: LearningModel) -> None:
        now = self._clock()
        if not batch.user_messages:
            # Only assistant text (a retried reply, an explicit flush after a reply): no
            # statement of the user to learn from, so no learning call is made.
            await self._store.audit([self._event(batch, "skipped", "no new user message",
                                                 now)])
            await self.queue.drop_batch(key)
            self._count("learn_outcome", "skipped_empty")
            return
        owners = await self._owners(batch)
        if not owners:
            await self._store.audit([self._event(batch, "skipped", "learning off, memory "
                                                 "cleared, or no participant identified", now)])
            await self.queue.drop_batch(key)
            self._count("learn_outcome", "skipped_off")
            return
        group = is_group_namespace(batch.user)
        user_text = "\n".join(m.text for m in batch.user_messages)
        await load_segmenter_for(user_text)
        language: Language = "zh" if has_cjk(user_text) else "en"
        related, known, known_text = await self._known(batch, owners)
        scored = await self._score(job, batch, known_text, language, model)
        weighted = scored.weighted
        audit = [self._event(batch, "scored", scored.reason[:500], now,
                             {"score": weighted, "dimensions": scored.dimensions})]
        record = _conversation_record(batch, weighted, scored.dimensions, scored.reason, now)
        if weighted < config.score_threshold:
            audit.append(self._event(batch, "skipped", "score below threshold", now,
                                     {"score": weighted,
                                      "threshold": config.score_threshold}))
            await self._apply(batch, ChangeSet(tenant=batch.tenant, user_id=batch.user,
                                               batch_key=key, audit=tuple(audit),
                                               conversation=record))
            self._count("learn_outcome", "below_threshold")
            return
        extraction, vision, shown = await self._extract(
            job, batch, known_text=known_text, language=language, audit=audit, now=now,
            model=model)
        if extraction.summary:
            record = replace(record, summary=extraction.summary)
        audit.append(self._event(batch, "extracted", "", now, {
            "facts": len(extraction.facts), "unusable": extraction.dropped}))
        per_owner = self._assign(batch, extraction, owners, audit, now)
        from_images = self._image_facts(shown, extraction, owners, audit, now) if vision \
            else {}
        scrubber = self._scrubbers.for_tenant(batch.tenant)
        for name, owner in owners.items():
            lines = [m for m in batch.user_messages if not group or _same_name(m.name, name)]
            names = {owner, *(m.name for m in lines if m.name)}
            changes = await self._owner_changes(
                batch, job_id=job.id, owner=owner, facts=per_owner[owner], lines=lines,
                names=names,
                image_facts=from_images.get(owner, []),
                known={s: m for s, m in known.items() if m.user_id == owner},
                related=related[owner], weighted=weighted, scored=scored, now=now,
                profile_update=_clean_profile(
                    _profile_of(name, extraction.profiles) if group else extraction.profile,
                    scrubber),
            )
            if group:
                applied = await self._store.apply(changes)
                if not applied:
                    log.info("learning_batch_not_applied", batch=changes.batch_key)
            else:
                audit.extend(changes.audit)
                changes = ChangeSet(
                    tenant=changes.tenant, user_id=changes.user_id, batch_key=key,
                    upserts=changes.upserts, evidence=changes.evidence,
                    profile=changes.profile, conversation=record,
                    audit=tuple(audit), learned_from=changes.learned_from,
                )
                await self._apply(batch, changes)
            if changes.upserts:
                await self._enforce_quotas(batch.tenant, owner, batch.channel,
                                           max_per_user=config.max_memory_per_user)
        if group:
            await self._apply(batch, ChangeSet(tenant=batch.tenant, user_id=batch.user,
                                               batch_key=key, audit=tuple(audit),
                                               conversation=record))
        self._count("learn_outcome", "learned")

    async def _extract(
        self, job: Job, batch: Batch, *, known_text: str, language: Language,
        audit: list[AuditEvent], now: datetime, model: LearningModel,
    ) -> tuple[ExtractionResult, bool, Batch]:
        """The extraction call (with the conversation's earlier summary, and the images when
        the learning model sees them), whether images went with it, and the part of the
        batch the model was shown (:meth:`_fit`; its images are the ones numbered)."""
        shared = batch_images(batch)
        vision = bool(shared) and model.sees_images(batch.model)
        if shared and not vision:
            audit.append(self._event(batch, "skipped", "images: the learning model does not "
                                     "accept image input", now, {"images": len(shared)}))
            self._count("images", "skipped_no_vision")
        previous = await self._store.get_conversation(batch.tenant, batch.user,
                                                      batch.conversation)
        override = await self._prompt(batch.tenant, "extraction")
        max_tokens = self._settings.max_output_tokens

        def build(part: Batch) -> list[Message]:
            return extraction_messages(batch=part, known=known_text, language=language,
                                       override=override, group=is_group_namespace(batch.user),
                                       vision=vision,
                                       earlier=previous.summary if previous else "")

        shown, messages = self._fit(batch, build, max_tokens=max_tokens, vision=vision,
                                    model=model)
        if job.attempts > 1:
            # A retry may have failed on a reply cut at max_tokens: it gets twice the room
            # to answer, but only while that room shows the model the same messages as the
            # first attempt did — never a shorter (or empty) transcript.
            wider = self._fit(batch, build, max_tokens=2 * max_tokens, vision=vision,
                              model=model, quiet=True)
            if len(wider[0].messages) == len(shown.messages):
                max_tokens = 2 * max_tokens
                shown, messages = wider
        extraction = parse_extraction(await model.call(
            purpose="extract", request_model=batch.model, tenant=batch.tenant,
            user=batch.user, job_id=job.id, max_tokens=max_tokens, schema=EXTRACTION_SCHEMA,
            messages=messages,
        ))
        return extraction, vision, shown

    def _fit(self, batch: Batch, build: Callable[[Batch], list[Message]], *,
             max_tokens: int, vision: bool = False,
             model: LearningModel | None = None,
             quiet: bool = False) -> tuple[Batch, list[Message]]:
        """The part of ``batch`` a learning call shows and the call's messages (``build``):
        the newest messages that fit the learning model's context window once the prompt
        without them and a reply of ``max_tokens`` are counted (:func:`fit_batch`).
        ``quiet``: a trial fit, neither counted, logged nor raised. Raises
        :class:`LearningWindowTooSmall` when none of a non-empty batch fits."""
        model = model or self.model
        room = model.room(batch.model, build(replace(batch, messages=())),
                          max_tokens=max_tokens)
        shown = fit_batch(batch, budget=room,
                          count=lambda text: model.count(batch.model, text),
                          image_tokens=IMAGE_TOKENS if vision else 0)
        if shown is not batch and not quiet:
            self._count("transcript_cut", "window")
            log.info("learning_transcript_cut", batch=batch.key, room_tokens=room,
                     messages=len(batch.messages), shown=len(shown.messages))
            if batch.messages and not shown.messages:
                # The prompt and the reply alone fill the window: the model sees nothing to
                # learn from. A configuration problem (learning.model / max_output_tokens).
                self._count("transcript_cut", "window_too_small")
                log.warning("learning_window_too_small", batch=batch.key,
                            model=model.model_for(batch.model), room_tokens=room,
                            max_tokens=max_tokens,
                            detail="the learning model's context window leaves no room for "
                                   "the conversation: pick a larger learning.model or lower "
                                   "learning.max_output_tokens")
                raise LearningWindowTooSmall(
                    f"the learning model {model.model_for(batch.model)!r} has room for none "
                    f"of the conversation ({room} tokens left beside the prompt and a "
                    f"{max_tokens}-token reply): pick a larger learning.model or lower "
                    "learning.max_output_tokens, then requeue")
        return shown, build(shown)

    async def _known(
        self, batch: Batch, owners: dict[str | None, str]
    ) -> tuple[dict[str, list[Memory]], dict[str, Memory], str]:
        """Each owner's stored memories most related to what they said, and the prompt's
        list of them with short ids (labelled with the participant in a group)."""
        group = is_group_namespace(batch.user)
        related: dict[str, list[Memory]] = {}
        for name, owner in owners.items():
            spoken = "\n".join(m.text for m in batch.user_messages
                               if not group or _same_name(m.name, name))
            related[owner] = await self._store.related(
                batch.tenant, owner, spoken,
                limit=max(1, self._settings.related_memories // len(owners)))
        shown = [m for memories in related.values() for m in memories]
        labels = {m.id: name for name, owner in owners.items() for m in related[owner]} \
            if group else {}
        known_text, short_ids = render_known(shown, owners=labels)
        by_id = {m.id: m for m in shown}
        known = {short: by_id[memory_id] for short, memory_id in short_ids.items()}
        return related, known, known_text

    def _assign(
        self, batch: Batch, extraction: ExtractionResult, owners: dict[str | None, str],
        audit: list[AuditEvent], now: datetime,
    ) -> dict[str, list[CandidateFact]]:
        """Facts by the user they belong to: the batch's user, or in a group the participant
        named as ``speaker`` (facts whose speaker is not one resolved participant are
        dropped and audited)."""
        group = is_group_namespace(batch.user)
        per_owner: dict[str, list[CandidateFact]] = {owner: [] for owner in owners.values()}
        for fact in extraction.facts:
            target = owners.get(None) if not group else _owner_of(fact.speaker, owners)
            if target is None:
                audit.append(self._event(batch, "rejected", "speaker not identified", now,
                                         {"speaker": fact.speaker}))
                self._count("fact_rejected", "speaker")
                continue
            per_owner[target].append(fact)
        return per_owner

    def _image_facts(
        self, batch: Batch, extraction: ExtractionResult, owners: dict[str | None, str],
        audit: list[AuditEvent], now: datetime,
    ) -> dict[str, list[CandidateFact]]:
        """Memories a vision model read from the users' images, by owner (seed 001 §5.6):
        ``person`` and ``long`` are stored (as profile-level / ordinary memories), ``short``
        and ``skip`` are not."""
        images = {number: message for number, _, message in batch_images(batch)}
        group = is_group_namespace(batch.user)
        out: dict[str, list[CandidateFact]] = {}
        tiers: dict[str, int] = {}
        for verdict in extraction.images:
            message = images.get(verdict.image)
            if message is None:
                continue
            tiers[verdict.tier] = tiers.get(verdict.tier, 0) + 1
            self._count("images", verdict.tier)
            owner = _owner_of(message.name, owners) if group else owners.get(None)
            if verdict.tier not in ("person", "long") or not verdict.memory or owner is None:
                continue
            person = verdict.tier == "person"
            out.setdefault(owner, []).append(CandidateFact(
                title=verdict.memory[:30], content=verdict.memory,
                category="user_preference" if person else "domain",
                subcategory="appearance" if person else "image", tags=("image",),
                subject="user", supersedes=(), duplicate_of=None, source_turns=(),
            ))
        if tiers:
            audit.append(self._event(batch, "extracted", "images", now, {"tiers": tiers}))
        return out

    async def _prompt(self, tenant: str, kind: str) -> str | None:
        """The prompt in force: the tenant's latest admin edit, else ``learning.<kind>_prompt``
        from config, else ``None`` (the built-in one)."""
        versions = await self._store.prompt_versions(tenant, kind, limit=1)
        if versions and versions[0].text:
            return versions[0].text
        configured: str | None = getattr(self._settings, f"{kind}_prompt")
        return configured or None

    async def _owners(self, batch: Batch) -> dict[str | None, str]:
        """Whose memory this batch may teach: the user (key ``None``), or in a group each
        participant whose display name resolves to exactly one user of the tenant and who
        has learning on (seed 001 §4: unknown or ambiguous names are skipped)."""
        tenant = batch.tenant
        if not is_group_namespace(batch.user):
            return {None: batch.user} if await self._may_learn(tenant, batch.user, batch) \
                else {}
        owners: dict[str | None, str] = {}
        for name in dict.fromkeys(m.name for m in batch.user_messages if m.name):
            users = await self._store.users_named(tenant, name)
            if len(users) == 1 and await self._may_learn(tenant, users[0], batch):
                owners[name] = users[0]
            else:
                self._count("speaker_unresolved", "ambiguous" if users else "unknown")
        return owners

    async def _may_learn(self, tenant: str, user: str, batch: Batch) -> bool:
        prefs = await self._store.get_user_settings(tenant, user)
        return Switches().with_user(prefs).learns(said_at=batch.oldest_at)

    async def _score(self, job: Job, batch: Batch, known_text: str,
                     language: Language, model: LearningModel) -> ScoreResult:
        """The batch's score; a retry after a failed extraction keeps the earlier one."""
        scored = self._scores.get(batch.key)
        if scored is None:
            override = await self._prompt(batch.tenant, "scoring")

            def build(part: Batch) -> list[Message]:
                return scoring_messages(batch=part, known=known_text, language=language,
                                        override=override)

            _, messages = self._fit(batch, build, max_tokens=SCORING_MAX_TOKENS, model=model)
            scored = parse_scoring(await model.call(
                purpose="score", request_model=batch.model, tenant=batch.tenant,
                user=batch.user, job_id=job.id, max_tokens=SCORING_MAX_TOKENS,
                schema=SCORING_SCHEMA, messages=messages,
            ))
            self._scores[batch.key] = scored
            while len(self._scores) > SCORE_CACHE_SIZE:
                self._scores.popitem(last=False)
        return scored

    async def _owner_changes(
        self,
        batch: Batch,
        *,
        job_id: str,
        owner: str,
        facts: list[CandidateFact],
        image_facts: list[CandidateFact],
        lines: list[TranscriptMessage],
        names: set[str],
        known: dict[str, Memory],
        related: list[Memory],
        weighted: float,
        scored: ScoreResult,
        now: datetime,
        profile_update: ProfileUpdate | None,
    ) -> ChangeSet:
        """Filter one owner's facts against their own words and consolidate them."""
        tenant = batch.tenant
        await load_segmenter_for(*(f"{f.title}\n{f.content}" for f in (*facts, *image_facts)),
                                 *(m.content for m in related))
        scrubber = self._scrubbers.for_tenant(tenant)
        facts_filter = FactFilter(user_text="\n".join(m.text for m in lines),
                                  scrubber=scrubber, user_names=names)
        accepted, rejected = facts_filter.split(facts)
        seen_in_images, rejected_images = facts_filter.split(image_facts, grounded=False)
        accepted += seen_in_images
        rejected += rejected_images
        audit = [self._event(batch, "rejected", v.reason or "", now, owner=owner)
                 for v in rejected]
        for verdict in rejected:
            self._count("fact_rejected", verdict.reason or "unknown")
        # Stored memories closest to the facts themselves: a repeat must be found even when
        # the user's wording this time led keyword recall elsewhere.
        existing = list(related)
        seen = {m.id for m in related}
        if accepted:
            for memory in await self._store.related(
                tenant, owner, "\n".join(f.content for f in accepted),
                limit=self._settings.related_memories,
            ):
                if memory.id not in seen:
                    existing.append(memory)
        tombstones = await self._store.tombstoned(
            tenant, owner, [normalize(f.content) for f in accepted]
        )
        vectors, existing = await self._embed_facts(job_id, batch, owner, accepted, existing)
        group = is_group_namespace(batch.user)
        context = BatchContext(
            tenant=tenant, user=owner,
            batch_key=f"{batch.key}:{owner}" if group else batch.key,
            conversation=batch.conversation, channel=batch.channel, now=now,
            batch_started=datetime.fromtimestamp(batch.oldest_at, UTC), score=weighted,
            known=known, existing=existing, tombstones=tombstones,
            dedup_similarity=self._settings.dedup_similarity,
            similarity=vector_similarity(vectors) if vectors else None,
            synonyms=self._settings.synonyms,
        )
        changes = consolidate(
            context, accepted, profile=await self._store.get_profile(tenant, owner),
            profile_update=profile_update, user_messages=len(lines), names=names - {owner},
            dimensions=scored.dimensions, reason=scored.reason[:500],
        )
        upserts = changes.upserts
        if self._vectors is not None and vectors is not None:
            upserts = await self._vectors.attach(
                upserts, known=vectors, previous={m.id: m for m in existing}, tenant=tenant,
                user=owner, source="learn", job_id=job_id,
            )
        return ChangeSet(
            tenant=changes.tenant, user_id=changes.user_id, batch_key=changes.batch_key,
            upserts=upserts, evidence=changes.evidence, profile=changes.profile,
            conversation=None if group else changes.conversation,
            audit=(*audit, *changes.audit),
            learned_from=datetime.fromtimestamp(batch.oldest_at, UTC),
        )

    async def _enforce_quotas(self, tenant: str, user: str, channel: str, *,
                              max_per_user: int | None = None) -> None:
        """Evict over-quota memories of ``user`` (and of the group, for group channels):
        per-user total (``max_per_user``, default ``learning.max_memory_per_user``),
        per-person facts, per-group facts (see :mod:`quotas`)."""
        max_per_user = max_per_user or self._settings.max_memory_per_user
        now = self._clock()
        counts = await self._store.count(tenant, user)
        stored = quotas.held(counts)
        victims: list[Memory] = []
        if stored > min(max_per_user, quotas.FACTS_PER_PERSON):
            mine = await self._store.scan(ScanQuery(
                tenant=tenant, user=user, limit=stored + 100))
            victims += quotas.evictions(mine, max_per_user=max_per_user, now=now)
        if channel.startswith(GROUP_PREFIX):
            in_group = await self._store.scan(ScanQuery(
                tenant=tenant, channel=channel, limit=quotas.FACTS_PER_GROUP * 4))
            victims += quotas.over_quota(in_group, limit=quotas.FACTS_PER_GROUP, now=now)
        await self._delete(victims, action="evicted", reason="over quota")

    async def _delete(self, victims: list[Memory], *, action: str, reason: str) -> None:
        """Delete memories per owner, one audited change set each (no tombstone: an
        evicted or expired memory may be learned again if it is said again)."""
        by_owner: dict[tuple[str, str], list[Memory]] = {}
        for memory in {m.id: m for m in victims}.values():
            if memory.user_id is not None:
                by_owner.setdefault((memory.tenant, memory.user_id), []).append(memory)
        now = self._clock()
        for (tenant, user), memories in by_owner.items():
            await self._store.apply(ChangeSet(
                tenant=tenant, user_id=user, batch_key=f"{action}:{new_id()}",
                deletes=tuple(m.id for m in memories),
                audit=tuple(AuditEvent(tenant=tenant, user_id=user, action=action,  # type: ignore[arg-type]
                                       actor="auto", at=now, memory_id=m.id, reason=reason)
                            for m in memories),
            ))
            self._count(action, "memories")

    async def _embed_facts(
        self, job_id: str, batch: Batch, owner: str, facts: list[CandidateFact],
        related: list[Memory],
    ) -> tuple[dict[str, Vector] | None, list[Memory]]:
        """Vectors of the facts and of related memories that lack one (``None`` when there
        is no embedder or it failed), and the memories to dedup against: ``related`` (with
        the vectors filled in) plus each fact's nearest stored memories by vector."""
        if self._vectors is None or not facts:
            return None, list(related)
        model = self._vectors.embedder.model

        def current(m: Memory) -> bool:
            return m.embedding is not None and m.embedding_model == model

        vectors = await self._vectors.embed(
            [f.content for f in facts] + [m.content for m in related if not current(m)],
            tenant=batch.tenant, user=owner, source="learn", job_id=job_id,
        )
        if vectors is None:
            return None, list(related)
        existing = [m if current(m) or m.content not in vectors
                    else m.with_changes(embedding=vectors[m.content], embedding_model=model)
                    for m in related]
        seen = {m.id for m in existing}
        found = await asyncio.gather(*(
            self._store.search(SearchQuery(
                tenant=batch.tenant, user=owner, terms=(), embedding=vectors[f.content],
                limit=VECTOR_NEIGHBOURS, include_shared=False, embedding_model=model,
            )) for f in facts
        ))
        for candidates in found:
            for c in candidates:
                if c.memory.id not in seen and (c.vector_score or 0.0) >= \
                        self._settings.dedup_similarity:
                    seen.add(c.memory.id)
                    existing.append(c.memory)
        return vectors, existing

    async def _apply(self, batch: Batch, changes: ChangeSet) -> None:
        applied = await self._store.apply(changes)
        self._scores.pop(batch.key, None)
        if not applied:
            log.info("learning_batch_not_applied", batch=batch.key,
                     reason="applied before, or memory cleared since")
        await self.queue.drop_batch(batch.key)

    @staticmethod
    def _event(batch: Batch, action: str, reason: str, at: datetime,
               detail: dict[str, object] | None = None, *,
               owner: str | None = None) -> AuditEvent:
        return AuditEvent(
            tenant=batch.tenant, user_id=owner or batch.user,
            action=action,  # type: ignore[arg-type]
            actor="auto", at=at, conversation_id=batch.conversation, reason=reason,
            detail={"batch": batch.key, **(detail or {})},
        )

    async def _tenant_setup(self, batch: Batch) -> tuple[LearningSettings,
                                                        LearningModel] | None:
        """The tenant's learning settings and learning model for ``batch``; ``None`` (the
        batch dropped, audited) when the tenant switched learning off. Raises
        :class:`BudgetSpent` when its learning budget is spent (the job waits)."""
        config = await self._config(batch.tenant)
        if not Switches(tenant=config.enabled).tenant_learns:
            await self._store.audit([self._event(batch, "skipped", "learning switched off "
                                                 "for the tenant", self._clock())])
            await self.queue.drop_batch(batch.key)
            self._count("learn_outcome", "skipped_tenant_off")
            return None
        if self._budgets is not None:
            await self._budgets.check(batch.tenant, config.budget)
        model = self.model if config.model == self._settings.model else \
            self.model.with_model(config.model)
        return config, model

    async def _config(self, tenant: str) -> LearningSettings:
        """The tenant's learning settings (config + run-time overrides, issue 13)."""
        if self._tenants is None:
            return self._settings
        return (await self._tenants.get(tenant)).learning

    async def _budget_spent(self, tenant: str,
                            config: LearningSettings | None = None) -> bool:
        """Whether the tenant's learning budget is spent now (also sets its gauges)."""
        config = config or await self._config(tenant)
        budget = config.budget
        if self._budgets is None or (budget.tokens_per_day is None
                                     and budget.tokens_per_month is None):
            if self._metrics is not None:  # a cap removed while paused: not paused now
                self._metrics.learning_budget_paused.labels(tenant=tenant).set(0)
            return False
        state = await self._budgets.state(tenant, budget)
        if self._metrics is not None:
            self._metrics.learning_budget_paused.labels(tenant=tenant).set(int(state.spent))
            spent = self._metrics.learning_budget_spent_tokens
            spent.labels(tenant=tenant, period="day").set(state.spent_today)
            spent.labels(tenant=tenant, period="month").set(state.spent_this_month)
        return state.spent

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


def _clean_profile(update: ProfileUpdate | None, scrubber: Scrubber) -> ProfileUpdate | None:
    """Profile strings pass the same directive and PII checks as facts."""
    if update is None:
        return None

    def ok(text: str | None) -> bool:
        return bool(text) and not is_directive(text or "") and \
            not contains_pii(scrubber, text or "")

    return ProfileUpdate(
        style=update.style if ok(update.style) else None,
        impression=update.impression if ok(update.impression) else None,
        traits=tuple(t for t in update.traits if ok(t)),
        topics=tuple(t for t in update.topics if ok(t)),
    )


def _profile_of(name: str | None, profiles: Sequence[tuple[str, ProfileUpdate]]
                ) -> ProfileUpdate | None:
    """A group participant's profile update: the one answered under their name (the first,
    should the model name them twice); ``None`` when there is none."""
    return next((update for speaker, update in profiles if _same_name(speaker, name)), None)


def _same_name(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and normalize(a) == normalize(b)


def _owner_of(speaker: str | None, owners: dict[str | None, str]) -> str | None:
    """The user a fact's speaker names, when that name is one resolved participant."""
    if not speaker:
        return None
    for name, owner in owners.items():
        if _same_name(name, speaker):
            return owner
    return None
