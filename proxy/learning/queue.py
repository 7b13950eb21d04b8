"""The learning queue and the per-conversation message buffer (docs/design.md#batching,
docs/design.md#reliability).

Three job kinds flow through one durable queue:

- ``exchange`` — a completed turn from the gateway. The worker drops messages whose
  fingerprint the user has already seen, buffers the rest, and when a conversation has
  ``batch_messages`` new user messages it seals them into a batch and enqueues ``learn``
  — in the same transaction (SQLite), or through an outbox that survives a crash between
  the two (Redis, where the job may live in another Cluster slot; see
  :mod:`proxy.backends.redis.queue`).
- ``flush`` — seal whatever a conversation has buffered (idle timeout or explicit flush).
- ``learn`` — score, extract and consolidate one sealed batch.

Delivery is at-least-once: a claimed job carries a lease; a worker that dies loses it and
the job becomes claimable again when the lease runs out. Effects are idempotent (batch keys
in the store, fingerprints in the buffer). A job that keeps failing is moved to the dead
letter list with its last error after ``max_attempts``. A queue stores a job's payload as
opaque bytes; what each kind's payload holds is :mod:`proxy.learning.jobs`.

Backends: :class:`~proxy.backends.sqlite.queue.SqliteLearningQueue` (the embedded file) and
:class:`~proxy.backends.redis.queue.RedisLearningQueue` (Redis Streams, shared by every
gateway and worker process); ``tests/learning/test_queue_contract.py`` holds both to the
same behaviour.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from proxy.learning.exchange import Exchange, TranscriptMessage
from proxy.memory.text import normalize

JobKind = Literal["exchange", "flush", "learn"]
JobState = Literal["ready", "delayed", "leased", "dead"]
JOB_KINDS: tuple[JobKind, ...] = ("exchange", "flush", "learn")
JOB_STATES: tuple[JobState, ...] = ("ready", "delayed", "leased", "dead")
# Claimed only when no job of another kind is ready: maintenance's idle flushes never
# hold up the turns (exchange) and batches (learn) that a backlog is made of.
LAST_CLAIMED: JobKind = "flush"


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    kind: JobKind
    payload: bytes
    attempts: int  # deliveries so far, including this one


class NewJob(NamedTuple):
    """A job to enqueue. ``tenant`` is the tenant whose data the job reads and writes:
    the admin API lists, requeues and drops a dead job only for an admin key of that
    tenant. ``None`` only for jobs of no tenant (none are made today)."""

    kind: JobKind
    id: str
    payload: bytes
    tenant: str | None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: str
    kind: JobKind
    attempts: int
    last_error: str
    failed_at: float
    # The job's tenant; ``None`` for jobs dead-lettered before jobs carried one (listed
    # to no tenant's admin: the operator requeues or drops them with the CLI).
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """Sealed messages of one conversation, learned together."""

    key: str  # idempotency key for the store (batch id)
    tenant: str
    user: str
    conversation: str
    channel: str
    model: str
    messages: tuple[TranscriptMessage, ...]
    oldest_at: float
    newest_at: float

    @property
    def user_messages(self) -> tuple[TranscriptMessage, ...]:
        return tuple(m for m in self.messages if m.role == "user")


@dataclass(frozen=True, slots=True)
class QueueDepth:
    ready: int
    delayed: int
    leased: int
    dead: int
    buffered_messages: int


def kind_counts() -> dict[tuple[JobKind, JobState], int]:
    """Every (kind, state) pair at zero: the shape :meth:`LearningQueue.depth_by_kind`
    fills in."""
    return {(kind, state): 0 for kind in JOB_KINDS for state in JOB_STATES}


class LearningQueue(Protocol):
    """Durable queue + conversation buffer. Every method is safe to call from several
    worker processes at once."""

    async def enqueue(self, kind: JobKind, job_id: str, payload: bytes, *,
                      tenant: str | None) -> None:
        """Add a job of ``tenant``; a job id already present is ignored (idempotent
        producers)."""
        ...

    async def enqueue_many(self, jobs: list[NewJob]) -> None:
        """Several jobs at once (one transaction where the backend has them)."""
        ...

    async def claim(self, worker: str, *, lease_seconds: float) -> Job | None:
        """The oldest ready job, leased to ``worker``; ``None`` when nothing is ready.
        A job of kind :data:`LAST_CLAIMED` (``flush``) is claimed only when no job of
        another kind is ready (exchange and learn jobs, oldest first, before any flush);
        a job whose lease ran out is taken over first, whatever its kind."""
        ...

    async def ack(self, job: Job) -> None: ...

    async def retry(self, job: Job, *, error: str, delay_seconds: float) -> None: ...

    async def bury(self, job: Job, *, error: str) -> None:
        """Move to the dead letter list."""
        ...

    async def buffer(
        self, exchange: Exchange, *, batch_size: int, now: float
    ) -> str | None:
        """Buffer the unseen messages of ``exchange``; when the conversation now holds
        ``batch_size`` user messages, seal a batch and enqueue its ``learn`` job. Returns
        the batch key or ``None``.

        Unseen: a message whose per-user fingerprint was never recorded (resent history is
        never learned twice); its ``request`` key, if any, is recorded with it. The
        request's ``new`` user message is buffered even when its text was seen — a repeat
        is evidence — unless its ``request`` key was recorded within
        :data:`~proxy.learning.exchange.RETRY_WINDOW_SECONDS` (a retried request, or a
        later request that carried it as history first); its fingerprint is recorded as
        seen either way."""
        ...

    async def mark_seen(self, exchange: Exchange, *, now: float) -> None:
        """Record the messages' fingerprints without buffering them (learning is off for
        the user: these messages are never learned, not even when resent later)."""
        ...

    async def seal(
        self, tenant: str, user: str, conversation: str, *, now: float
    ) -> str | None:
        """Seal whatever is buffered for the conversation (flush)."""
        ...

    async def buffered_conversations(self, tenant: str, user: str) -> list[str]:
        """Conversations of the user with unsealed buffered messages."""
        ...

    async def load_batch(self, key: str) -> Batch | None: ...

    async def drop_batch(self, key: str) -> None:
        """Delete a learned (or discarded) batch's raw text."""
        ...

    async def idle_conversations(self, *, idle_before: float) -> list[tuple[str, str, str]]:
        """(tenant, user, conversation) with unsealed messages, last one before the time."""
        ...

    async def expire(self, *, buffered_before: float, seen_before: float) -> int:
        """Delete raw buffered text older than the buffer TTL and old fingerprints."""
        ...

    async def depth(self) -> QueueDepth: ...

    async def depth_by_kind(self) -> dict[tuple[JobKind, JobState], int]:
        """Jobs per (kind, state), every pair present (zero when none). States as in
        :meth:`depth`: ``ready`` includes delayed jobs already due. The gauge
        ``memory_proxy_learning_queue_jobs{kind,state}`` reads it."""
        ...

    async def dead_letters(self, *, limit: int = 100,
                           tenant: str | None = None) -> list[DeadLetter]:
        """Dead jobs, newest first, at most ``limit``. With ``tenant``: only that
        tenant's (jobs without a tenant are never listed to a tenant); without: all of them
        (the operator's CLI)."""
        ...

    async def requeue(self, job_id: str, *, tenant: str | None = None) -> bool:
        """Move a dead job back to ready with a fresh attempt count. With ``tenant``, only
        a job of that tenant. ``False`` when there is no such dead job."""
        ...

    async def drop(self, job_id: str, *, tenant: str | None = None) -> bool:
        """Delete a dead job for good (the admin gave up on it). With ``tenant``, only a
        job of that tenant. ``False`` when there is no such dead job."""
        ...

    async def forget_user(self, tenant: str, user: str) -> None:
        """Drop buffered text of a user whose memory was cleared (seen fingerprints stay,
        so resent history is not learned again)."""
        ...

    # learning budgets ------------------------------------------------------------------
    async def postpone(self, job: Job, *, reason: str, delay_seconds: float) -> None:
        """Like :meth:`retry`, but this delivery does not count as an attempt: the job
        waits ``delay_seconds`` (a spent learning budget) and can never be dead-lettered
        for it. ``reason`` is kept as the job's last error."""
        ...

    async def resume_postponed(self, tenant: str) -> int:
        """Make every job of ``tenant`` that :meth:`postpone` put off due now (its budget
        was lifted or raised: docs/design.md#learning-budgets). Jobs waiting for a retry's
        back-off keep their time, other tenants' jobs are untouched. Returns how many."""
        ...

    async def postponed_tenants(self) -> list[str]:
        """The tenants with jobs that :meth:`postpone` put off and no :meth:`resume_postponed`
        made due since, sorted — what a worker that did not postpone them (another process,
        or one restarted since) reads to resume them when their budget is lifted
        (:meth:`proxy.learning.runner.Runner.adopt_postponed`). One small read: nothing but
        the postponed jobs (SQLite) or one set of tenants (Redis) is looked at. A tenant
        may still be named after its postponed jobs ran on their own (Redis: the set is
        kept by postpone and resume only); :meth:`resume_postponed` of it then returns 0
        and drops it."""
        ...

    # erasure ---------------------------------------------------------------------------
    async def erase_user(self, tenant: str, user: str, *, names: Sequence[str]) -> int:
        """Forget everything the queue holds of the user's words (``DELETE /v1/me``,
        docs/design.md#erasure): their seen fingerprints, their own buffered and sealed
        messages, their lines in the tenant's group buffers and sealed group batches (a
        user line the user's own request brought, or one under one of ``names``, the
        display names bound to them: :class:`SpokenBy`), and every queued job that names
        them, in any state — exchanges they own or spoke in a group, their flushes
        (``flush:<tenant>:<user>:…``), the ``learn`` jobs of their own batches: pending
        work for an erased user has no reason to run, and its id or payload would keep
        their id (:func:`proxy.learning.jobs.names_user`). Other users' jobs are
        untouched. Returns the group lines removed."""
        ...

    async def scrub_user(self, tenant: str, user: str) -> int:
        """Blank the text (and images) of every queued exchange job of the user — ready,
        delayed, leased or dead-lettered, the user's own or one they spoke in a group —
        keeping the jobs and their message fingerprints, so the queue's bookkeeping is
        unchanged and no transcript of the user stays (erasure deletes those jobs
        instead: :meth:`erase_user`). Returns the jobs rewritten. See
        :func:`proxy.learning.jobs.blank_exchange`."""
        ...


    # Graceful shutdown and operations -----------------------------------------------------
    async def release(self, job: Job) -> None:
        """Give a leased ``job`` back at once, as if this delivery never happened: it is
        ready for the next claim (no waiting for the lease to run out) and the attempt
        count this delivery added is taken back. A worker that is told to stop calls it for
        the job it holds. A job not leased (acknowledged, retried, buried) is left as is."""
        ...

    async def oldest_ready_age(self) -> float | None:
        """Seconds since the oldest job waiting for a worker became claimable (ready now,
        including delayed jobs already due), by the backend's clock; ``None`` when no job
        waits. Leased, future-delayed and dead jobs are not counted. The metric
        ``memory_proxy_learning_oldest_job_age_seconds`` and the ``queue_backlog`` alert
        read it."""
        ...


class SpokenBy:
    """Whether a buffered group line is the erased ``user``'s: a user line whose recorded
    speaker is them (their request's own new message, :func:`line_speaker`) or whose
    display name is one of ``names`` (compared normalised, as group attribution does)."""

    def __init__(self, user: str, names: Sequence[str]) -> None:
        self._user = user
        self._names = {normalize(n) for n in names if n}

    def __call__(self, role: str, name: str | None, speaker: str | None) -> bool:
        if role != "user":
            return False
        return speaker == self._user or (name is not None and normalize(name) in self._names)


def line_speaker(exchange: Exchange, message: TranscriptMessage) -> str | None:
    """The user a buffered line is recorded as said by: in a group exchange, the
    requester for the request's own new message; ``None`` otherwise (a private line is
    its user's by its buffer; other group lines are attributed by display name)."""
    return exchange.speaker if exchange.group is not None and message.new else None


def batch_key(fingerprints: list[str], conversation: str) -> str:
    """Deterministic batch id from its messages: the same messages → the same key
    (``b_`` + 32 hex digits of SHA-256 over the conversation id and the fingerprints)."""
    digest = hashlib.sha256(("\x1f".join([conversation, *fingerprints])).encode()).hexdigest()
    return "b_" + digest[:32]


def batch_channel(channels: Sequence[str]) -> str:
    """The channel of a batch from the channel recorded with each of its messages
    (``private`` or ``group:<group id>``): theirs when they all agree, else ``private`` —
    a batch is a group's only when every line of it was said in that group."""
    first = channels[0] if channels else "private"
    return first if all(c == first for c in channels) else "private"


def batch_sizes(exchange_channel: str, sizes: dict[str, int]) -> int:
    return sizes.get(exchange_channel, sizes.get("private", 5))


__all__: Sequence[str] = (
    "JOB_KINDS", "JOB_STATES", "LAST_CLAIMED", "Batch", "DeadLetter", "Job", "JobKind",
    "JobState", "LearningQueue", "NewJob", "QueueDepth", "SpokenBy", "batch_channel",
    "batch_key", "batch_sizes", "kind_counts", "line_speaker",
)
