"""Every client, pool, store and queue the app uses, opened and closed in one place.

:func:`open_resources` is an async context manager: it opens what the settings ask for and
closes all of it in reverse order. Tests build :class:`Resources` themselves (with fakes)
and hand them to :func:`proxy.app.create_app`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from proxy.auth import KeyRing
from proxy.learning.model import LearningModel
from proxy.learning.pii import Scrubber
from proxy.learning.queue import LearningQueue
from proxy.learning.sink import LearningSink, NullSink, QueueSink
from proxy.learning.sqlite_queue import SqliteLearningQueue
from proxy.learning.worker import Worker
from proxy.ledger import Ledger, SqliteLedger, UsageWriter
from proxy.memory.records import utcnow
from proxy.memory.service import MemoryService
from proxy.memory.sqlite_store import SqliteMemoryStore
from proxy.memory.store import MemoryStore, StoreUnavailableError
from proxy.metrics import Metrics
from proxy.models import ModelRegistry
from proxy.settings import Settings
from proxy.sqlite import SqliteDatabase
from proxy.tokens import TokenCounter
from proxy.upstream.base import Upstream
from proxy.upstream.dispatch import Dispatcher
from proxy.upstream.litellm_adapter import LiteLLMUpstream
from proxy.upstream.relay import RelayUpstream

log = structlog.get_logger("proxy.resources")


@dataclass
class Resources:
    """Typed state handed to every handler (``request.app.state.resources``)."""

    settings: Settings
    registry: ModelRegistry
    keyring: KeyRing
    counter: TokenCounter
    store: MemoryStore
    ledger: Ledger
    upstream: Upstream
    memory: MemoryService
    metrics: Metrics
    scrubber: Scrubber
    queue: LearningQueue | None = None
    sink: LearningSink = field(default_factory=NullSink)
    worker: Worker | None = None
    usage: UsageWriter = field(init=False)
    clock: Callable[[], datetime] = utcnow

    def __post_init__(self) -> None:
        self.usage = UsageWriter(self.ledger)

    @property
    def learning_enabled(self) -> bool:
        return self.settings.learning.enabled and self.queue is not None


def build_resources(
    settings: Settings,
    *,
    store: MemoryStore,
    ledger: Ledger,
    upstream: Upstream,
    queue: LearningQueue | None,
    registry: ModelRegistry | None = None,
    metrics: Metrics | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> Resources:
    """Wire services on top of opened backends (shared by :func:`open_resources` and tests).
    """
    registry = registry or ModelRegistry(settings)
    metrics = metrics or Metrics()
    counter = TokenCounter()
    learning = settings.learning
    scrubber = Scrubber(
        kinds=frozenset(learning.pii_kinds) if learning.pii_kinds is not None else None,
        extra_patterns=learning.pii_patterns,
    )
    memory = MemoryService(store=store, settings=settings.memory, counter=counter, clock=clock)
    sink: LearningSink = NullSink()
    worker = None
    if learning.enabled and queue is not None:
        sink = QueueSink(queue, scrubber, max_messages=learning.max_messages_per_exchange,
                         metrics=metrics)
        model = LearningModel(upstream=upstream, registry=registry, ledger=ledger,
                              counter=counter, model=learning.model, clock=clock)
        worker = Worker(queue=queue, store=store, model=model, scrubber=scrubber,
                        settings=learning, metrics=metrics, clock=clock)
    return Resources(
        settings=settings, registry=registry, keyring=KeyRing(settings.auth), counter=counter,
        store=store, ledger=ledger, upstream=upstream, memory=memory, metrics=metrics,
        scrubber=scrubber, queue=queue, sink=sink, worker=worker, clock=clock,
    )


@contextlib.asynccontextmanager
async def open_resources(
    settings: Settings, *, upstream: Upstream | None = None
) -> AsyncIterator[Resources]:
    """Open the configured backends and the upstream client; close them on exit.

    ``storage.backend: sqlite`` — memories, ledgers and the learning queue in one file.
    ``storage.backend: redis`` — one ``redis.asyncio`` client for memories
    (:class:`~proxy.memory.redis_store.RedisMemoryStore`) and ledgers
    (:class:`~proxy.ledger_redis.RedisLedger`); the learning queue stays SQLite, in
    ``storage.queue_path`` next to ``storage.path``, until a Redis Streams queue replaces
    it — so with Redis, each gateway process still learns from its own local queue. The
    search index is created or migrated here; when Redis is down at startup the gateway
    starts anyway (memory degraded, ``/readyz`` says so) and the index is set up on first
    use.
    """
    async with contextlib.AsyncExitStack() as stack:
        storage = settings.storage
        store: MemoryStore
        ledger: Ledger
        if storage.backend == "redis":
            from proxy.ledger_redis import RedisLedger
            from proxy.memory.redis_store import RedisMemoryStore
            from proxy.redis_client import connect

            assert storage.url is not None  # StorageSettings guarantees it
            client = await stack.enter_async_context(connect(storage.url.get_secret_value()))
            redis_store = RedisMemoryStore(client, key_prefix=storage.key_prefix,
                                           vector_dim=storage.vector_dim)
            try:
                await redis_store.prepare()
            except StoreUnavailableError as exc:
                log.warning("redis_unavailable_at_startup", error=str(exc))
            store, ledger = redis_store, RedisLedger(client, key_prefix=storage.key_prefix)
            db = await stack.enter_async_context(SqliteDatabase(storage.queue_path))
        else:
            db = await stack.enter_async_context(SqliteDatabase(storage.path))
            store, ledger = SqliteMemoryStore(db), SqliteLedger(db)
        if upstream is None:
            upstream = Dispatcher(RelayUpstream(settings.upstream),
                                  LiteLLMUpstream(settings.upstream))
        stack.push_async_callback(upstream.aclose)
        yield build_resources(
            settings, store=store, ledger=ledger, upstream=upstream,
            queue=SqliteLearningQueue(db),
        )
