"""The ``exchange`` and ``flush`` jobs: turns into the conversation buffer, and sealing.

``exchange`` → the turn's unseen messages are buffered, and the conversation's batch is
sealed (a ``learn`` job enqueued) once it holds the channel's ``batch_messages``; a turn
that may not be learned (:mod:`proxy.learning.policy`) is only marked seen, so it is never
learned, not even when resent. ``flush`` → seal what a conversation (or every
conversation of the user) has buffered. While the tenant's learning budget is spent,
nothing is sealed: messages stay buffered (under the buffer TTL) until the period ends.
"""

from __future__ import annotations

import time

from proxy.learning.events import Counter
from proxy.learning.jobs import Flush, read_exchange
from proxy.learning.policy import Switches
from proxy.learning.queue import Job, LearningQueue, batch_sizes
from proxy.learning.tenancy import TenantLearning
from proxy.memory.store import MemoryStore

# Sealing waits while a budget is spent: messages stay buffered (under the buffer TTL).
NEVER_SEAL = 1 << 30


class Buffering:
    """Handlers of the ``exchange`` and ``flush`` jobs."""

    def __init__(self, *, queue: LearningQueue, store: MemoryStore,
                 tenancy: TenantLearning, count: Counter) -> None:
        self.queue = queue
        self._store = store
        self._tenancy = tenancy
        self._count = count

    async def exchange(self, job: Job) -> None:
        exchange = read_exchange(job.payload)
        config = await self._tenancy.config(exchange.tenant)
        if not Switches(tenant=config.enabled).tenant_learns:  # switched off (run-time)
            await self.queue.mark_seen(exchange, now=time.time())
            self._count("exchange_skipped", "tenant_learning_off")
            return
        prefs = await self._store.get_user_settings(exchange.tenant, exchange.user)
        batch_size = batch_sizes(exchange.channel, dict(config.batch_messages))
        if await self._tenancy.budget_spent(exchange.tenant, config):
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

    async def flush(self, job: Job) -> None:
        """Seal one conversation, or every buffered conversation of the user when the
        payload names none (explicit flush)."""
        flush = Flush.from_bytes(job.payload)
        tenant, user, conversation = flush.tenant, flush.user, flush.conversation
        if await self._tenancy.budget_spent(tenant):
            self._count("flush_skipped", "budget_spent")
            return  # the messages stay buffered (under the buffer TTL) until the period ends
        targets = [conversation] if conversation else \
            await self.queue.buffered_conversations(tenant, user)
        for target in targets:
            await self.queue.seal(tenant, user, target, now=time.time())
