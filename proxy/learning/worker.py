"""The learning worker: claims jobs, learns from batches, never blocks chat.

``exchange`` → buffer unseen messages (and seal a batch when full); ``flush`` → seal what a
conversation holds; ``learn`` → gates → score → extract → filter → consolidate → apply.
:class:`Worker` wires the parts, each in a module of its own:

- :mod:`~proxy.learning.runner` — claim, lease, retry, back-off, dead letter, maintenance;
- :mod:`~proxy.learning.buffering` — the ``exchange`` and ``flush`` jobs;
- :mod:`~proxy.learning.pipeline` — the ``learn`` job, stage by stage;
- :mod:`~proxy.learning.calls` — the scoring and extraction calls;
- :mod:`~proxy.learning.owners` — whose memory a batch teaches (private or group);
- :mod:`~proxy.learning.evictions` — quotas and the retention sweep;
- :mod:`~proxy.learning.tenancy` — a tenant's settings, learning model, prompts and budget.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import datetime

from proxy.learning.buffering import Buffering
from proxy.learning.calls import ModelCalls
from proxy.learning.events import Counter
from proxy.learning.evictions import Evictions
from proxy.learning.model import LearningModel
from proxy.learning.pipeline import Pipeline
from proxy.learning.privacy import Scrubbers
from proxy.learning.queue import LearningQueue
from proxy.learning.runner import Runner
from proxy.learning.tenancy import TenantLearning
from proxy.ledger import Ledger
from proxy.memory.embed import Embedder
from proxy.memory.records import utcnow
from proxy.memory.store import MemoryStore
from proxy.memory.vectors import MemoryVectors
from proxy.metrics import Metrics
from proxy.settings import LearningSettings
from proxy.tenants import TenantSettings


class Worker(Runner):
    """The runner with the worker's handlers: one per job kind."""

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
        ``tenants``: run-time settings per tenant, else ``settings`` for all; with a
        ``ledger``, ``learning.budget`` is enforced per tenant."""
        self.model = model
        count = Counter(metrics)
        tenancy = TenantLearning(settings=settings, store=store, model=model,
                                 tenants=tenants, ledger=ledger, clock=clock,
                                 metrics=metrics)
        evictions = Evictions(store=store, settings=settings, tenants=tenants, clock=clock,
                              count=count)
        vectors = None if embedder is None or ledger is None else \
            MemoryVectors(embedder, ledger=ledger, clock=clock, metrics=metrics)
        calls = ModelCalls(store=store, tenancy=tenancy, base_model=model, count=count)
        self._buffering = Buffering(queue=queue, store=store, tenancy=tenancy, count=count)
        self._pipeline = Pipeline(queue=queue, store=store, tenancy=tenancy, calls=calls,
                                  evictions=evictions, scrubbers=scrubbers, vectors=vectors,
                                  count=count, clock=clock)
        super().__init__(
            queue=queue, settings=settings, tenancy=tenancy, evictions=evictions,
            clock=clock, count=count,
            handlers={"exchange": self._buffering.exchange, "flush": self._buffering.flush,
                      "learn": self._pipeline.learn},
            worker_id=worker_id or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}",
        )

    @property
    def queue(self) -> LearningQueue:
        """The queue every part of the worker uses (replaceable: tests wrap it)."""
        return self._queue

    @queue.setter
    def queue(self, queue: LearningQueue) -> None:
        self._queue = queue
        self._buffering.queue = queue
        self._pipeline.queue = queue
