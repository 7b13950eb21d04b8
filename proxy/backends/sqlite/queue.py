"""Embedded :class:`~proxy.learning.queue.LearningQueue` in the SQLite file.

Every state change is one SQLite transaction on the writer connection, so several worker
processes sharing the file (``memory-proxy worker`` next to ``serve``) never claim the same
job twice or seal the same message into two batches. Every ``sqlite3`` error (a file locked
by another process past
:data:`~proxy.backends.sqlite.database.BUSY_TIMEOUT_SECONDS`, a full disk, I/O errors)
surfaces as :class:`~proxy.memory.store.StoreUnavailableError`, as from the memory store:
the job is retried and the worker carries on.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import orjson

from proxy.backends.sqlite.database import SqliteDatabase
from proxy.learning.exchange import RETRY_WINDOW_SECONDS, Exchange, TranscriptMessage
from proxy.learning.jobs import blank_exchange, learn_payload, names_user
from proxy.learning.queue import (
    LAST_CLAIMED,
    Batch,
    DeadLetter,
    Job,
    JobKind,
    JobState,
    NewJob,
    QueueDepth,
    SpokenBy,
    batch_channel,
    batch_key,
    kind_counts,
    line_speaker,
)
from proxy.memory.store import StoreUnavailableError

T = TypeVar("T")
_MAX_ERROR_CHARS = 2000


def _seal(
    conn: sqlite3.Connection, tenant: str, user: str, conversation: str, now: float
) -> str | None:
    rows = conn.execute(
        "SELECT id, fingerprint FROM buffered_messages WHERE tenant = ? AND user_id = ? AND "
        "conversation_id = ? AND batch_key IS NULL ORDER BY id",
        (tenant, user, conversation),
    ).fetchall()
    if not rows:
        return None
    key = batch_key([r[1] for r in rows], conversation)
    conn.executemany("UPDATE buffered_messages SET batch_key = ? WHERE id = ?",
                     [(key, r[0]) for r in rows])
    conn.execute(
        "INSERT OR IGNORE INTO jobs (id, kind, payload, status, attempts, available_at, "
        "created_at, updated_at, tenant) VALUES (?, 'learn', ?, 'ready', 0, ?, ?, ?, ?)",
        ("learn:" + key, learn_payload(key), now, now, now, tenant),
    )
    return key


def _seen_alias(conn: sqlite3.Connection, exchange: Exchange,
                message: TranscriptMessage) -> bool:
    """Whether the user has seen the message under one of its aliases (a fingerprint from
    before a key rotation or before keying: proxy.learning.fingerprints)."""
    if not message.aliases:
        return False
    return conn.execute(
        "SELECT 1 FROM seen_messages WHERE tenant = ? AND user_id = ? AND fingerprint IN "
        f"({', '.join('?' * len(message.aliases))}) LIMIT 1",
        (exchange.tenant, exchange.user, *message.aliases)).fetchone() is not None


class SqliteLearningQueue:
    def __init__(self, db: SqliteDatabase) -> None:
        self._db = db

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.read(fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite learning queue read failed: {exc}") from exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._db.write(fn)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"sqlite learning queue write failed: {exc}") from exc

    async def enqueue(self, kind: JobKind, job_id: str, payload: bytes, *,
                      tenant: str | None) -> None:
        await self.enqueue_many([NewJob(kind, job_id, payload, tenant)])

    async def enqueue_many(self, jobs: list[NewJob]) -> None:
        """Several jobs in one transaction (the gateway's writer batches its exchanges)."""
        if not jobs:
            return
        now = time.time()
        await self._write(lambda c: c.executemany(
            "INSERT OR IGNORE INTO jobs (id, kind, payload, status, attempts, available_at, "
            "created_at, updated_at, tenant) VALUES (?, ?, ?, 'ready', 0, ?, ?, ?, ?)",
            [(job_id, kind, payload, now, now, now, tenant)
             for kind, job_id, payload, tenant in jobs],
        ))

    async def claim(self, worker: str, *, lease_seconds: float) -> Job | None:
        """A job whose lease ran out first, then the oldest ready job not a flush, then the
        oldest ready flush (:meth:`LearningQueue.claim`)."""
        now = time.time()

        def run(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(
                "SELECT id, kind, payload, attempts FROM jobs WHERE "
                "status = 'leased' AND lease_until <= ? ORDER BY lease_until LIMIT 1",
                (now,),
            ).fetchone() or conn.execute(
                "SELECT id, kind, payload, attempts FROM jobs WHERE "
                "status = 'ready' AND available_at <= ? "
                "ORDER BY kind = ?, available_at, created_at LIMIT 1",
                (now, LAST_CLAIMED),
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE jobs SET status = 'leased', leased_by = ?, lease_until = ?, "
                "attempts = attempts + 1, updated_at = ? WHERE id = ?",
                (worker, now + lease_seconds, now, row[0]),
            )
            return Job(id=row[0], kind=row[1], payload=bytes(row[2]), attempts=row[3] + 1)

        result: Job | None = await self._write(run)
        return result

    async def ack(self, job: Job) -> None:
        await self._write(lambda c: c.execute("DELETE FROM jobs WHERE id = ?", (job.id,)))

    async def retry(self, job: Job, *, error: str, delay_seconds: float) -> None:
        now = time.time()
        await self._write(lambda c: c.execute(
            "UPDATE jobs SET status = 'ready', leased_by = NULL, lease_until = NULL, "
            "available_at = ?, last_error = ?, updated_at = ?, postponed = 0 WHERE id = ?",
            (now + delay_seconds, error[:_MAX_ERROR_CHARS], now, job.id),
        ))

    async def bury(self, job: Job, *, error: str) -> None:
        now = time.time()
        await self._write(lambda c: c.execute(
            "UPDATE jobs SET status = 'dead', leased_by = NULL, lease_until = NULL, "
            "last_error = ?, updated_at = ? WHERE id = ?",
            (error[:_MAX_ERROR_CHARS], now, job.id),
        ))

    async def buffer(self, exchange: Exchange, *, batch_size: int, now: float) -> str | None:
        def run(conn: sqlite3.Connection) -> str | None:
            fresh: list[TranscriptMessage] = []
            for message in exchange.messages:
                if message.new and message.request is not None:
                    # The request's new user message: new unless this same request was
                    # seen within the retry window; its text is marked seen either way, so
                    # it is skipped when resent as history.
                    last = conn.execute(
                        "SELECT seen_at FROM seen_messages WHERE tenant = ? AND user_id = ? "
                        "AND fingerprint = ?", (exchange.tenant, exchange.user, message.request),
                    ).fetchone()
                    if last is not None and last[0] > now - RETRY_WINDOW_SECONDS:
                        continue
                    conn.execute(
                        "INSERT INTO seen_messages (tenant, user_id, fingerprint, seen_at) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT (tenant, user_id, fingerprint) "
                        "DO UPDATE SET seen_at = excluded.seen_at",
                        (exchange.tenant, exchange.user, message.request, now),
                    )
                    conn.execute(
                        "INSERT OR IGNORE INTO seen_messages (tenant, user_id, fingerprint, "
                        "seen_at) VALUES (?, ?, ?, ?)",
                        (exchange.tenant, exchange.user, message.fingerprint, now),
                    )
                    fresh.append(message)
                    continue
                inserted = conn.execute(
                    "INSERT OR IGNORE INTO seen_messages (tenant, user_id, fingerprint, "
                    "seen_at) VALUES (?, ?, ?, ?)",
                    (exchange.tenant, exchange.user, message.fingerprint, now),
                )
                if inserted.rowcount and not _seen_alias(conn, exchange, message):
                    fresh.append(message)
                    if message.request is not None:
                        # history learned before the request that carried it new: that
                        # request, arriving later, is then a retry
                        conn.execute(
                            "INSERT OR IGNORE INTO seen_messages (tenant, user_id, "
                            "fingerprint, seen_at) VALUES (?, ?, ?, ?)",
                            (exchange.tenant, exchange.user, message.request, now),
                        )
            if not fresh:
                return None
            channel = exchange.channel if exchange.group is None else f"group:{exchange.group}"
            conn.executemany(
                "INSERT INTO buffered_messages (tenant, user_id, conversation_id, channel, "
                "fingerprint, role, name, content, model, at, images, speaker) VALUES (?, ?, "
                "?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(exchange.tenant, exchange.user, exchange.conversation, channel,
                  m.fingerprint, m.role, m.name, m.text, exchange.model, exchange.at,
                  orjson.dumps(list(m.images)).decode(), line_speaker(exchange, m))
                 for m in fresh],
            )
            pending = conn.execute(
                "SELECT count(*) FROM buffered_messages WHERE tenant = ? AND user_id = ? AND "
                "conversation_id = ? AND batch_key IS NULL AND role = 'user'",
                (exchange.tenant, exchange.user, exchange.conversation),
            ).fetchone()[0]
            if pending < batch_size:
                return None
            return _seal(conn, exchange.tenant, exchange.user, exchange.conversation, now)

        result: str | None = await self._write(run)
        return result

    async def mark_seen(self, exchange: Exchange, *, now: float) -> None:
        await self._write(lambda c: c.executemany(
            "INSERT OR IGNORE INTO seen_messages (tenant, user_id, fingerprint, seen_at) "
            "VALUES (?, ?, ?, ?)",
            [(exchange.tenant, exchange.user, m.fingerprint, now) for m in exchange.messages],
        ))

    async def seal(self, tenant: str, user: str, conversation: str, *, now: float) -> str | None:
        result: str | None = await self._write(
            lambda c: _seal(c, tenant, user, conversation, now)
        )
        return result

    async def buffered_conversations(self, tenant: str, user: str) -> list[str]:
        rows = await self._read(lambda c: c.execute(
            "SELECT DISTINCT conversation_id FROM buffered_messages WHERE tenant = ? AND "
            "user_id = ? AND batch_key IS NULL", (tenant, user),
        ).fetchall())
        return [r[0] for r in rows]

    async def load_batch(self, key: str) -> Batch | None:
        def run(conn: sqlite3.Connection) -> Batch | None:
            rows = conn.execute(
                "SELECT tenant, user_id, conversation_id, channel, fingerprint, role, name, "
                "content, model, at, images FROM buffered_messages WHERE batch_key = ? "
                "ORDER BY id",
                (key,),
            ).fetchall()
            if not rows:
                return None
            first = rows[0]
            return Batch(
                key=key, tenant=first[0], user=first[1], conversation=first[2],
                channel=batch_channel([r[3] for r in rows]), model=rows[-1][8],
                messages=tuple(TranscriptMessage(role=r[5], text=r[7], fingerprint=r[4],
                                                 name=r[6], images=tuple(orjson.loads(r[10])))
                               for r in rows),
                oldest_at=min(r[9] for r in rows), newest_at=max(r[9] for r in rows),
            )

        result: Batch | None = await self._read(run)
        return result

    async def drop_batch(self, key: str) -> None:
        await self._write(lambda c: c.execute(
            "DELETE FROM buffered_messages WHERE batch_key = ?", (key,)
        ))

    async def idle_conversations(self, *, idle_before: float) -> list[tuple[str, str, str]]:
        def run(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
            rows = conn.execute(
                "SELECT tenant, user_id, conversation_id FROM buffered_messages "
                "WHERE batch_key IS NULL GROUP BY tenant, user_id, conversation_id "
                "HAVING max(at) < ? AND sum(role = 'user') > 0",
                (idle_before,),
            ).fetchall()
            return [(r[0], r[1], r[2]) for r in rows]

        result: list[tuple[str, str, str]] = await self._read(run)
        return result

    async def expire(self, *, buffered_before: float, seen_before: float) -> int:
        def run(conn: sqlite3.Connection) -> int:
            removed = conn.execute(
                "DELETE FROM buffered_messages WHERE at < ? AND batch_key IS NULL",
                (buffered_before,),
            ).rowcount
            conn.execute("DELETE FROM seen_messages WHERE seen_at < ?", (seen_before,))
            return int(removed)

        result: int = await self._write(run)
        return result

    async def depth(self) -> QueueDepth:
        now = time.time()

        def run(conn: sqlite3.Connection) -> QueueDepth:
            counts = {"ready": 0, "delayed": 0, "leased": 0, "dead": 0}
            for status, delayed, n in conn.execute(
                "SELECT status, available_at > ?, count(*) FROM jobs GROUP BY 1, 2", (now,)
            ):
                key = "delayed" if status == "ready" and delayed else status
                counts[key] = counts.get(key, 0) + n
            buffered = conn.execute(
                "SELECT count(*) FROM buffered_messages WHERE batch_key IS NULL"
            ).fetchone()[0]
            return QueueDepth(counts["ready"], counts["delayed"], counts["leased"],
                              counts["dead"], buffered)

        result: QueueDepth = await self._read(run)
        return result

    async def depth_by_kind(self) -> dict[tuple[JobKind, JobState], int]:
        now = time.time()

        def run(conn: sqlite3.Connection) -> dict[tuple[JobKind, JobState], int]:
            counts = kind_counts()
            for kind, status, delayed, n in conn.execute(
                "SELECT kind, status, available_at > ?, count(*) FROM jobs GROUP BY 1, 2, 3",
                (now,),
            ):
                key = (kind, "delayed" if status == "ready" and delayed else status)
                if key in counts:
                    counts[key] += n
            return counts

        result: dict[tuple[JobKind, JobState], int] = await self._read(run)
        return result

    async def dead_letters(self, *, limit: int = 100,
                           tenant: str | None = None) -> list[DeadLetter]:
        if limit <= 0:
            return []
        scope, args = ("AND tenant = ? ", (tenant,)) if tenant is not None else ("", ())

        def run(conn: sqlite3.Connection) -> list[DeadLetter]:
            rows = conn.execute(
                "SELECT id, kind, attempts, last_error, updated_at, tenant FROM jobs "
                f"WHERE status = 'dead' {scope}ORDER BY updated_at DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
            return [DeadLetter(r[0], r[1], r[2], r[3] or "", r[4], r[5]) for r in rows]

        result: list[DeadLetter] = await self._read(run)
        return result

    async def requeue(self, job_id: str, *, tenant: str | None = None) -> bool:
        now = time.time()
        scope, args = ("AND tenant = ?", (tenant,)) if tenant is not None else ("", ())
        result: bool = await self._write(lambda c: c.execute(
            "UPDATE jobs SET status = 'ready', attempts = 0, available_at = ?, updated_at = ? "
            f"WHERE id = ? AND status = 'dead' {scope}",
            (now, now, job_id, *args),
        ).rowcount > 0)
        return result

    async def drop(self, job_id: str, *, tenant: str | None = None) -> bool:
        scope, args = ("AND tenant = ?", (tenant,)) if tenant is not None else ("", ())
        result: bool = await self._write(lambda c: c.execute(
            f"DELETE FROM jobs WHERE id = ? AND status = 'dead' {scope}", (job_id, *args),
        ).rowcount > 0)
        return result

    async def forget_user(self, tenant: str, user: str) -> None:
        await self._write(lambda c: c.execute(
            "DELETE FROM buffered_messages WHERE tenant = ? AND user_id = ?", (tenant, user)
        ))

    # erasure ---------------------------------------------------------------------------
    async def erase_user(self, tenant: str, user: str, *, names: Sequence[str]) -> int:
        """:meth:`~proxy.learning.queue.LearningQueue.erase_user`, one transaction: the
        user's jobs go first (a ``learn`` job by its batch key among the user's sealed
        messages), then their messages and fingerprints, then their group lines."""
        spoken = SpokenBy(user, names)

        def run(conn: sqlite3.Connection) -> int:
            owner = (tenant, user)
            learn = [(f"learn:{r[0]}",) for r in conn.execute(
                "SELECT DISTINCT batch_key FROM buffered_messages WHERE tenant = ? AND "
                "user_id = ? AND batch_key IS NOT NULL", owner)]
            jobs = conn.execute("SELECT id, kind, payload FROM jobs WHERE kind IN "
                                "('exchange', 'flush')").fetchall()
            conn.executemany("DELETE FROM jobs WHERE id = ?", [
                *learn, *((job_id,) for job_id, kind, payload in jobs
                          if names_user(kind, payload, tenant, user))])
            conn.execute("DELETE FROM buffered_messages WHERE tenant = ? AND user_id = ?",
                         owner)
            conn.execute("DELETE FROM seen_messages WHERE tenant = ? AND user_id = ?", owner)
            rows = conn.execute(
                "SELECT id, role, name, speaker FROM buffered_messages WHERE tenant = ? AND "
                "user_id >= 'group:' AND user_id < 'group;' AND role = 'user' AND "
                "(name IS NOT NULL OR speaker = ?)", owner).fetchall()
            doomed = [(r[0],) for r in rows if spoken(r[1], r[2], r[3])]
            conn.executemany("DELETE FROM buffered_messages WHERE id = ?", doomed)
            return len(doomed)

        result: int = await self._write(run)
        return result

    async def scrub_user(self, tenant: str, user: str) -> int:
        def run(conn: sqlite3.Connection) -> int:
            rewritten = 0
            for job_id, payload in conn.execute(
                    "SELECT id, payload FROM jobs WHERE kind = 'exchange'").fetchall():
                blank = blank_exchange(payload, tenant, user)
                if blank is not None:
                    conn.execute("UPDATE jobs SET payload = ? WHERE id = ?", (blank, job_id))
                    rewritten += 1
            return rewritten

        return await self._write(run)

    # learning budgets --------------------------------------------------------------------
    async def postpone(self, job: Job, *, reason: str, delay_seconds: float) -> None:
        now = time.time()
        await self._write(lambda c: c.execute(
            "UPDATE jobs SET status = 'ready', leased_by = NULL, lease_until = NULL, "
            "attempts = max(attempts - 1, 0), available_at = ?, last_error = ?, "
            "updated_at = ?, postponed = 1 WHERE id = ?",
            (now + delay_seconds, reason[:_MAX_ERROR_CHARS], now, job.id),
        ))

    async def resume_postponed(self, tenant: str) -> int:
        now = time.time()
        cursor = await self._write(lambda c: c.execute(
            "UPDATE jobs INDEXED BY jobs_postponed SET available_at = ?, updated_at = ?, "
            "postponed = 0 WHERE tenant = ? AND status = 'ready' AND postponed = 1",
            (now, now, tenant)))
        return int(cursor.rowcount)

    async def postponed_tenants(self) -> list[str]:
        """From the partial index ``jobs_postponed`` (migration 18; named, as the planner
        would otherwise walk every ready job by ``jobs_dead``): only postponed ready jobs
        are read."""
        rows = await self._read(lambda c: c.execute(
            "SELECT DISTINCT tenant FROM jobs INDEXED BY jobs_postponed WHERE postponed = 1 "
            "AND status = 'ready' AND tenant IS NOT NULL").fetchall())
        return sorted(str(r[0]) for r in rows)

    async def release(self, job: Job) -> None:
        """Only this delivery is released: a job whose lease ran out and that another
        worker claimed since (its attempt count grew) is left to that worker."""
        now = time.time()
        await self._write(lambda c: c.execute(
            "UPDATE jobs SET status = 'ready', leased_by = NULL, lease_until = NULL, "
            "attempts = max(attempts - 1, 0), available_at = ?, updated_at = ? "
            "WHERE id = ? AND status = 'leased' AND attempts = ?",
            (now, now, job.id, job.attempts),
        ))

    async def oldest_ready_age(self) -> float | None:
        now = time.time()

        def run(conn: sqlite3.Connection) -> float | None:
            oldest = conn.execute(
                "SELECT min(available_at) FROM jobs WHERE status = 'ready' AND available_at <= ?",
                (now,),
            ).fetchone()[0]
            return None if oldest is None else max(0.0, now - float(oldest))

        result: float | None = await self._read(run)
        return result
