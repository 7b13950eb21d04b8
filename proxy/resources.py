"""Every client, pool, store and queue the app uses, opened and closed in one place.

:func:`open_resources` is an async context manager: it opens what the settings ask for and
closes all of it in reverse order. Tests build :class:`Resources` themselves (with fakes)
and hand them to :func:`proxy.app.create_app`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import structlog

from proxy.auth import KeyRing
from proxy.conversations import ConversationChains
from proxy.learning.fingerprints import (
    UNKEYED,
    Fingerprinter,
    key_file_for,
    load_or_create_key,
)
from proxy.learning.model import LearningModel, check_window
from proxy.learning.privacy import Scrubbers
from proxy.learning.queue import LearningQueue
from proxy.learning.sink import LearningSink, NullSink, QueueSink
from proxy.learning.worker import Worker
from proxy.ledger import Ledger, UsageWriter
from proxy.loop_lag import LoopLag
from proxy.memory.embed import Embedder
from proxy.memory.embedders import build_embedder
from proxy.memory.records import utcnow
from proxy.memory.service import MemoryService
from proxy.memory.store import MemoryStore, StoreUnavailableError
from proxy.metrics import Metrics
from proxy.models import ModelRegistry
from proxy.observed import count_store_errors
from proxy.settings import ConfigError, Settings
from proxy.shutdown import Drain
from proxy.tenants import TenantSettings
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
    scrubbers: Scrubbers
    queue: LearningQueue | None = None
    sink: LearningSink = field(default_factory=NullSink)
    worker: Worker | None = None
    embedder: Embedder | None = None  # None: keyword-only recall (memory.embedder none)
    # The in-process learning worker's task while the app runs it (embedded mode with
    # server.run_worker); None when no worker runs here. /readyz reports it once done.
    worker_task: asyncio.Task[None] | None = None
    usage: UsageWriter = field(init=False)
    clock: Callable[[], datetime] = utcnow
    # Derived conversation ids per chat history (proxy/conversations.py).
    chains: ConversationChains = field(default_factory=ConversationChains)
    # Run-time settings per tenant (built from settings and store when not given).
    tenant_settings: TenantSettings | None = None
    # Graceful shutdown state (proxy/shutdown.py); the app replaces it with its own.
    drain: Drain = field(init=False)

    def __post_init__(self) -> None:
        dropped = self.metrics.learning_events.labels("spool_dropped", "usage")
        self.usage = UsageWriter(self.ledger, on_drop=dropped.inc)
        self.drain = Drain(self.settings.server.shutdown_grace_seconds)
        if self.tenant_settings is None:
            self.tenant_settings = TenantSettings(self.settings, self.store)

    @property
    def tenants(self) -> TenantSettings:
        """Effective settings per tenant (config + admin overrides)."""
        assert self.tenant_settings is not None
        return self.tenant_settings

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
    embedder: Embedder | None = None,
    fingerprints: Fingerprinter | None = None,
) -> Resources:
    """Wire services on top of opened backends (shared by :func:`open_resources` and tests).
    ``fingerprints``: the message fingerprint keys (default: ``learning.fingerprint_key``
    when set, else unkeyed — :func:`open_resources` always passes keys)."""
    registry = registry or ModelRegistry(settings)
    metrics = metrics or Metrics(tenant_labels=settings.metrics.tenant_labels)
    counter = TokenCounter()
    learning = settings.learning
    try:
        scrubbers = Scrubbers(learning.pii)
    except ValueError as exc:
        raise ConfigError(f"learning.pii: {exc}") from exc
    tenants = TenantSettings(settings, store)
    memory = MemoryService(store=store, settings=settings.memory, counter=counter, clock=clock,
                           embedder=embedder, tenants=tenants,
                           loop_lag=LoopLag(on_lag=metrics.event_loop_lag.inc))
    sink: LearningSink = NullSink()
    worker = None
    if learning.enabled and queue is not None:
        check_window(learning, registry, counter)
        sink = QueueSink(queue, scrubbers, max_messages=learning.max_messages_per_exchange,
                         metrics=metrics,
                         fingerprints=fingerprints or configured_fingerprints(settings))
        model = LearningModel(upstream=upstream, registry=registry, ledger=ledger,
                              counter=counter, model=learning.model, clock=clock,
                              metrics=metrics)
        worker = Worker(queue=queue, store=store, model=model, scrubbers=scrubbers,
                        settings=learning, metrics=metrics, clock=clock, embedder=embedder,
                        ledger=ledger, tenants=tenants)
    return Resources(
        settings=settings, registry=registry, keyring=KeyRing(settings.auth), counter=counter,
        store=store, ledger=ledger, upstream=upstream, memory=memory, metrics=metrics,
        scrubbers=scrubbers, queue=queue, sink=sink, worker=worker, clock=clock,
        embedder=embedder, tenant_settings=tenants,
    )


def configured_fingerprints(settings: Settings, *, key_file: Path | None = None
                            ) -> Fingerprinter:
    """The fingerprint keys of the settings (docs/design.md#erasure):
    ``learning.fingerprint_key`` (and ``fingerprint_previous_keys``); unset, the key in
    ``key_file`` (created when missing), else unkeyed. Raises :class:`ConfigError` when the
    key file cannot be read or written."""
    learning = settings.learning
    previous = [k.get_secret_value().encode() for k in learning.fingerprint_previous_keys]
    if learning.fingerprint_key is not None:
        return Fingerprinter(learning.fingerprint_key.get_secret_value().encode(), previous)
    if key_file is None:
        return UNKEYED
    try:
        return Fingerprinter(load_or_create_key(key_file), previous)
    except OSError as exc:
        raise ConfigError(f"learning.fingerprint_key is unset and the generated key file "
                          f"{key_file} cannot be used ({exc})") from exc


def preflight(settings: Settings) -> None:
    """The configured backend's check before a server starts, so that what would fail
    inside it with a stack trace is a startup message instead: with ``storage.backend:
    sqlite`` the database file must be creatable (with Redis no local file is used, and an
    unreachable Redis degrades memory at run time rather than stopping startup), and with
    learning on, every model learning may call must have room for a transcript
    (:func:`~proxy.learning.model.check_window`). Raises :class:`ConfigError` naming the
    setting."""
    check_window(settings.learning, ModelRegistry(settings), TokenCounter())
    if settings.storage.backend != "sqlite":
        if settings.learning.enabled and settings.learning.fingerprint_key is None:
            raise ConfigError(
                "learning.fingerprint_key: required with storage.backend redis and learning "
                "on — a deployment secret every gateway and worker shares (os.environ/NAME, "
                "e.g. from openssl rand -hex 32), never stored in Redis beside the "
                "fingerprints it keys")
        return
    from proxy.backends.sqlite.database import preflight as sqlite_preflight

    path = settings.storage.path
    try:
        sqlite_preflight(path)
    except Exception as exc:  # OSError or sqlite3.Error: the reason goes into the message
        raise ConfigError(f"storage.path: cannot open the database file {path} ({exc})") \
            from exc


@contextlib.asynccontextmanager
async def open_resources(
    settings: Settings, *, upstream: Upstream | None = None, embedder: Embedder | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> AsyncIterator[Resources]:
    """Open the configured backends, the upstream client and the embedder (loading a local
    model; :class:`~proxy.settings.ConfigError` on a dimension mismatch); close them on
    exit. ``embedder`` replaces the configured one and is not started or closed here;
    ``clock`` (tests) is the time every record and budget period is stamped with.

    ``storage.backend: sqlite`` — memories, ledgers and the learning queue in one file.
    ``storage.backend: redis`` — one ``redis.asyncio`` client for memories
    (:class:`~proxy.backends.redis.store.RedisMemoryStore`), ledgers
    (:class:`~proxy.backends.redis.ledger.RedisLedger`) and the learning queue
    (:class:`~proxy.backends.redis.queue.RedisLearningQueue`), so every gateway and
    worker process pointed at that Redis shares one queue; no local file is used. The
    search index is created or migrated here; when Redis is down at startup the gateway
    starts anyway (memory degraded, ``/readyz`` says so) and the index is set up on first
    use.
    """
    metrics = Metrics(tenant_labels=settings.metrics.tenant_labels)
    async with contextlib.AsyncExitStack() as stack:
        if embedder is None:
            configured = build_embedder(settings.memory.embedder)
            if configured is not None:
                stack.push_async_callback(configured.aclose)
                await configured.start()
            embedder = configured
        storage = settings.storage
        store: MemoryStore
        ledger: Ledger
        queue: LearningQueue
        if storage.backend == "redis":
            from proxy.backends.redis.client import connect
            from proxy.backends.redis.ledger import RedisLedger
            from proxy.backends.redis.queue import RedisLearningQueue
            from proxy.backends.redis.store import RedisMemoryStore

            assert storage.url is not None  # StorageSettings guarantees it
            vector_dim = storage.vector_dim
            if embedder is not None:
                if vector_dim is not None and vector_dim != embedder.dimension:
                    raise ConfigError(
                        f"storage.vector_dim is {vector_dim} but the embedder "
                        f"({embedder.model}) makes {embedder.dimension}-dimensional vectors; "
                        "leave storage.vector_dim unset to follow the embedder")
                vector_dim = embedder.dimension
            client = await stack.enter_async_context(connect(
                storage.url.get_secret_value(), max_connections=storage.redis_max_connections,
                pool_wait_seconds=settings.memory.recall_timeout_ms / 2000,
                on_exhausted=metrics.store_pool_exhausted.inc))
            redis_store = RedisMemoryStore(client, key_prefix=storage.key_prefix,
                                           vector_dim=vector_dim,
                                           purge_seconds=storage.erasure_purge_seconds)
            try:
                await redis_store.prepare()
            except StoreUnavailableError as exc:
                log.warning("redis_unavailable_at_startup", error=str(exc))
            store, ledger = redis_store, RedisLedger(client, key_prefix=storage.key_prefix)
            queue = RedisLearningQueue(client, key_prefix=storage.key_prefix)
        else:
            from proxy.backends.sqlite.database import SqliteDatabase
            from proxy.backends.sqlite.ledger import SqliteLedger
            from proxy.backends.sqlite.queue import SqliteLearningQueue
            from proxy.backends.sqlite.store import SqliteMemoryStore

            db = await stack.enter_async_context(SqliteDatabase(storage.path))
            store = SqliteMemoryStore(db, purge_seconds=storage.erasure_purge_seconds)
            ledger, queue = SqliteLedger(db), SqliteLearningQueue(db)
        if upstream is None:
            upstream = Dispatcher(RelayUpstream(settings.upstream),
                                  LiteLLMUpstream(settings.upstream))
        stack.push_async_callback(upstream.aclose)
        yield build_resources(
            settings, store=count_store_errors(store, metrics, "store"),
            ledger=count_store_errors(ledger, metrics, "ledger"), upstream=upstream,
            queue=count_store_errors(queue, metrics, "queue"), embedder=embedder,
            metrics=metrics, clock=clock, fingerprints=_backend_fingerprints(settings),
        )


def _backend_fingerprints(settings: Settings) -> Fingerprinter:
    """The fingerprint keys of an opened backend: SQLite falls back to the key file next
    to its database; Redis without a key (refused by :func:`preflight`) is unkeyed."""
    learning, storage = settings.learning, settings.storage
    if storage.backend == "redis":
        if learning.enabled and learning.fingerprint_key is None:
            log.warning("fingerprint_key_missing", backend="redis")
        return configured_fingerprints(settings)
    return configured_fingerprints(
        settings, key_file=key_file_for(storage.path) if learning.enabled else None)
