"""The job runner: claim, lease, retry with back-off, dead letter, and maintenance.

A claimed job carries a lease (``learning.lease_seconds``); a worker that dies leaves its
job leased and the lease runs out into a redelivery. A failed job — an upstream error,
unparseable output, a store outage, anything — is retried with exponential back-off
(honouring Retry-After) and dead-lettered after ``learning.max_attempts``; a job held up by
a spent learning budget is postponed instead, never dead-lettered, and made due again as
soon as a runner — in any process, whichever postponed it — sees the tenant's budget lifted
or raised (:meth:`Runner.resume_lifted`, :meth:`Runner.adopt_postponed`: within the
tenant-settings refresh). Maintenance (every
``learning.maintenance_interval_seconds``) seals idle conversations, expires raw text past
its TTL and sweeps retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

import structlog

from proxy.errors import MemoryProxyError, RateLimitError
from proxy.learning.budget import BudgetSpent
from proxy.learning.events import Counter
from proxy.learning.evictions import Evictions
from proxy.learning.jobs import Flush, flush_job
from proxy.learning.queue import Job, JobKind, LearningQueue
from proxy.learning.tenancy import TenantLearning
from proxy.memory.store import StoreUnavailableError
from proxy.settings import LearningBudget, LearningSettings

log = structlog.get_logger("proxy.learning")
MAX_BACKOFF_SECONDS = 300.0
# Longest wait of the run loop between attempts while the queue or store keeps failing
# (the first failure waits one poll interval, each further one twice the last): a locked
# SQLite file or a Redis restart is noticed within a minute of its end.
MAX_ERROR_PAUSE_SECONDS = 60.0
# A job postponed by a spent learning budget is looked at again after at most this long,
# else when the period ends. A budget lifted or raised meanwhile resumes it within the
# tenant-settings refresh in every process (Runner.resume_lifted for the tenants a runner
# postponed or adopted, Runner.adopt_postponed for those another process, or this one
# before a restart, postponed); this bound is the fallback when the queue cannot be read
# then, and re-checks a budget the ledger alone frees (its period over).
BUDGET_RECHECK_SECONDS = 300.0

Handler = Callable[[Job], Awaitable[None]]


def backoff(attempt: int, *, base: float, retry_after: float | None = None) -> float:
    """Seconds before the next attempt: Retry-After when the upstream gave one, else
    ``base × 2^(attempt-1)`` with ±20 % jitter, capped at 5 minutes."""
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, MAX_BACKOFF_SECONDS)
    delay = base * (2 ** max(0, attempt - 1))
    jitter: float = random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not cryptography
    return float(min(delay * jitter, MAX_BACKOFF_SECONDS))


class Runner:
    """Runs the jobs of ``queue`` through ``handlers`` (one per job kind)."""

    def __init__(self, *, queue: LearningQueue, settings: LearningSettings,
                 handlers: Mapping[JobKind, Handler], tenancy: TenantLearning,
                 evictions: Evictions, clock: Callable[[], datetime], count: Counter,
                 worker_id: str) -> None:
        self.queue = queue
        self._settings = settings
        self._handlers = handlers
        self._tenancy = tenancy
        self._evictions = evictions
        self._clock = clock
        self._count = count
        self.worker_id = worker_id
        self._last_maintenance = 0.0
        # Tenants whose jobs this runner postponed, or found postponed in the queue while
        # their budget was spent (adopt_postponed) → the budget in force then.
        self._postponed: dict[str, LearningBudget] = {}
        # When adopt_postponed last read the queue (the tenancy's monotonic seconds).
        self._adopted_at: float | None = None

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
                if self._postponed:
                    await self.resume_lifted()
                await self.adopt_postponed()
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
        """Process ready jobs until none is left (tests, flush endpoint) — first those a
        lifted budget makes due (:meth:`resume_lifted`, :meth:`adopt_postponed`). Returns
        the count."""
        if self._postponed:
            await self.resume_lifted()
        await self.adopt_postponed()
        done = 0
        while done < max_jobs and await self.run_once():
            done += 1
        return done

    async def process(self, job: Job) -> None:
        """Run the job's handler; acknowledge it, postpone it (budget spent) or fail it."""
        handler = self._handlers[job.kind]
        try:
            await handler(job)
        except asyncio.CancelledError:
            raise
        except BudgetSpent as spent:  # waits for the next period, never dead-lettered
            delay = max(1.0, min(BUDGET_RECHECK_SECONDS,
                                 (spent.resumes_at - self._clock()).total_seconds()))
            await self.queue.postpone(job, reason=str(spent), delay_seconds=delay)
            self._postponed[spent.tenant] = (await self._tenancy.config(spent.tenant)).budget
            self._count("budget_postponed", job.kind)
            log.info("learning_budget_spent", job=job.id, tenant=spent.tenant,
                     resumes_at=spent.resumes_at.isoformat(), recheck_s=round(delay))
        except Exception as exc:  # every failure is retried, then dead-lettered
            await self._failed(job, exc)
        else:
            await self.queue.ack(job)
            self._count("job_done", job.kind)

    async def resume_lifted(self) -> int:
        """Make due now the jobs this runner postponed (or adopted: :meth:`adopt_postponed`)
        for a tenant whose budget has since changed and is no longer spent (lifted, or
        raised above what was spent: docs/design.md#learning-budgets). The budget is the
        tenant's settings as this process has them — refreshed every few seconds, so a
        change made anywhere resumes the jobs within that refresh. A budget changed but
        still spent is remembered as the new one. Without a change nothing is read but the
        settings cache. Returns the jobs resumed."""
        resumed = 0
        for tenant, budget in list(self._postponed.items()):
            config = await self._tenancy.config(tenant)
            if config.budget == budget:
                continue
            if await self._tenancy.budget_spent(tenant, config):
                self._postponed[tenant] = config.budget
                continue
            count = await self.queue.resume_postponed(tenant)
            del self._postponed[tenant]
            resumed += count
            log.info("learning_budget_resumed", tenant=tenant, jobs=count)
        return resumed

    async def adopt_postponed(self) -> int:
        """Take up the tenants with postponed jobs that this runner does not track — jobs
        postponed by another process, or by this worker before it restarted — so that
        lifting their budget resumes them here within the settings refresh
        (docs/design.md#learning-budgets). At most once per tenant-settings refresh
        interval (:attr:`TenantLearning.refresh_seconds`, on its clock) the queue is read
        (:meth:`LearningQueue.postponed_tenants`: one small read, of nothing while no job
        is postponed); each new tenant whose budget is not spent now has its jobs resumed
        at once, one whose budget is spent is tracked with that budget, so that
        :meth:`resume_lifted` resumes them when it changes. Returns the jobs resumed."""
        now = self._tenancy.monotonic()
        if self._adopted_at is not None and \
                now - self._adopted_at < self._tenancy.refresh_seconds:
            return 0
        self._adopted_at = now
        resumed = 0
        for tenant in await self.queue.postponed_tenants():
            if tenant in self._postponed:
                continue
            config = await self._tenancy.config(tenant)
            if await self._tenancy.budget_spent(tenant, config):
                self._postponed[tenant] = config.budget
                continue
            count = await self.queue.resume_postponed(tenant)
            resumed += count
            if count:
                log.info("learning_budget_resumed", tenant=tenant, jobs=count, adopted=True)
        return resumed

    async def _failed(self, job: Job, exc: Exception) -> None:
        """Retry ``job`` after its back-off, or bury it after its last attempt. An error
        whose class says so (:attr:`MemoryProxyError.log_traceback`; any foreign one) is
        logged with its traceback."""
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
        """Seal idle conversations and expire raw text past its TTL.

        Each idle conversation gets one ``flush`` job whose id names only the conversation
        (:func:`~proxy.learning.jobs.flush_job`): while it waits — however many periods the
        worker is behind — enqueueing it again is a no-op, so the backlog grows by at most
        one job per conversation, and the queue claims it only after every ready
        ``exchange`` and ``learn`` job (:meth:`LearningQueue.claim`)."""
        now = time.time()
        self._last_maintenance = now
        idle = await self.queue.idle_conversations(
            idle_before=now - self._settings.idle_flush_seconds
        )
        expiring = await self.queue.idle_conversations(
            idle_before=now - self._settings.buffer_ttl_seconds)
        for tenant, _user, _conversation in expiring:
            if await self._tenancy.budget_spent(tenant):
                self._count("budget_expired", "conversation")
        for tenant, user, conversation in idle:
            job = flush_job(Flush(tenant, user, conversation))
            await self.queue.enqueue(job.kind, job.id, job.payload, tenant=job.tenant)
        await self.queue.expire(
            buffered_before=now - self._settings.buffer_ttl_seconds,
            seen_before=now - self._settings.seen_message_ttl_days * 86400,
        )
        await self.sweep_retention()

    async def sweep_retention(self, *, limit: int = 500) -> int:
        """Purge memories past retention that were never used
        (:meth:`Evictions.sweep_retention`). Returns how many went."""
        return await self._evictions.sweep_retention(limit=limit)
