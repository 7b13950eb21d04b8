"""The one way the gateway builds a Redis client, and what every Redis user checks.

:func:`connect` returns a ``redis.asyncio.Redis`` that speaks RESP2 and returns bytes:
RedisVL parses RESP2 search replies only, and the stores decode values themselves
(embeddings are binary). The caller owns the client and closes it (``async with``); the
lifespan does this in :func:`proxy.resources.open_resources`.

**The pool blocks, briefly.** A command that finds every connection in use waits for one
(:class:`BoundedPool`, redis-py's ``BlockingConnectionPool``) for at most the pool wait —
the resources give half the recall deadline, so a request that waits still has time to
recall. Only a wait that runs out fails, with :class:`PoolExhaustedError`: the store is
busy, not down, and the pool counts it (``on_exhausted``) so that it is measured and
alerted on apart from an outage.

**A stopped Redis fails fast.** redis-py's default retries a failed connection ten times
with a backoff growing to 1 s — about 5 s before a command gives up, so a write route
answered 503 only after that. The client here retries :data:`CONNECTION_RETRIES` times
with a backoff of at most :data:`RETRY_BACKOFF_CAP_SECONDS` (enough for a connection the
server closed while it sat in the pool), then the command fails and the caller answers
``store_unavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, WatchError

from proxy.memory.store import StoreBusyError, StoreUnavailableError

# Bounds on one command; the hot path has its own, shorter deadline (memory.recall_timeout_ms).
SOCKET_TIMEOUT_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 2.0
# Pool size per process when the caller gives none (storage.redis_max_connections): the
# hot path holds one connection per request at a time, so this many chats run without
# waiting for one.
MAX_CONNECTIONS = 64
# Seconds a command waits for a free connection when the caller gives no wait: half the
# shipped recall deadline (memory.recall_timeout_ms, 150 ms).
POOL_WAIT_SECONDS = 0.075
# Optimistic transactions retry this often before giving up; each retry means another
# writer changed a watched key of the same user in the same few milliseconds.
MAX_WATCH_RETRIES = 16
# Tries again of a command whose connection failed, and the longest pause between them
# (seconds): a stale pooled connection is replaced at once; a stopped Redis costs a
# command about 0.1 s, not redis-py's default of ~5 s (module docstring).
CONNECTION_RETRIES = 2
RETRY_BACKOFF_BASE_SECONDS = 0.01
RETRY_BACKOFF_CAP_SECONDS = 0.05

T = TypeVar("T")


class PoolExhaustedError(RedisConnectionError):
    """Every connection of the pool stayed in use for the whole pool wait: Redis is busy
    (or this process runs more concurrent commands than its pool holds), not down."""


class BoundedPool(BlockingConnectionPool):
    """``BlockingConnectionPool`` whose timed-out wait raises :class:`PoolExhaustedError`
    and calls ``on_exhausted`` (no argument; e.g. a metric's ``inc``) first.
    ``exhausted`` counts those waits since the pool was built."""

    def __init__(self, *, on_exhausted: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_exhausted = on_exhausted
        self.exhausted = 0

    async def get_connection(
            self, command_name: Any = None, *keys: Any, **options: Any
    ) -> AbstractConnection:
        del command_name, keys, options  # deprecated by redis-py, which passes none
        try:
            return await super().get_connection()  # type: ignore[no-untyped-call,no-any-return]
        except RedisConnectionError as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise
            self.exhausted += 1
            if self.on_exhausted is not None:
                self.on_exhausted()
            raise PoolExhaustedError(
                f"no Redis connection free within {self.timeout} s "
                f"({self.max_connections} in use); raise storage.redis_max_connections "
                "if this lasts") from exc


class OneAtATime:
    """Per-key turns: :meth:`turn` lets one holder of a key run at a time, so the reads
    a request starts at once (profile, searches, resident memories; the key is the
    request's :data:`~proxy.memory.store.READ_TURN` token) hold one pool connection
    between them instead of one each, while other requests run beside them. A key's lock
    lives only while someone holds or awaits it; ``None`` takes no turn."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[Hashable, asyncio.Lock] = \
            weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def turn(self, key: Hashable | None) -> AsyncIterator[None]:
        if key is None:  # a read that belongs to no turn
            yield
            return
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        async with lock:
            yield


def connect(url: str, *, max_connections: int = MAX_CONNECTIONS,
            pool_wait_seconds: float = POOL_WAIT_SECONDS,
            on_exhausted: Callable[[], None] | None = None) -> Redis:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``unix://``), RESP2, bytes, on
    a :class:`BoundedPool` of ``max_connections`` where a command waits up to
    ``pool_wait_seconds`` for a free connection (module docstring).

    No I/O happens until the first command. ``url`` options override the defaults here,
    so a URL with ``protocol=3`` or ``decode_responses=true`` is refused by
    :func:`require_resp2_bytes` (and ``protocol`` already by the settings).
    """
    pool = BoundedPool.from_url(
        url, protocol=2, decode_responses=False, socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, max_connections=max_connections,
        timeout=pool_wait_seconds, on_exhausted=on_exhausted,
        retry=Retry(ExponentialWithJitterBackoff(cap=RETRY_BACKOFF_CAP_SECONDS,
                                                 base=RETRY_BACKOFF_BASE_SECONDS),
                    CONNECTION_RETRIES),
    )
    client = Redis.from_pool(pool)
    require_resp2_bytes(client)
    return client


def require_resp2_bytes(client: Redis) -> None:
    """Raise ``ValueError`` unless ``client`` speaks RESP2 and returns bytes."""
    options = client.connection_pool.connection_kwargs
    if str(options.get("protocol")) != "2":
        raise ValueError("the Redis client must use RESP2 (protocol=2); build it with "
                         "proxy.backends.redis.client.connect")
    if options.get("decode_responses"):
        raise ValueError("the Redis client must return bytes (decode_responses=False)")


@contextlib.contextmanager
def unavailable_on_redis_error(operation: str,
                               also: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Translate ``redis`` errors (and those of the classes in ``also``) raised inside the
    block into :class:`~proxy.memory.store.StoreUnavailableError` naming ``operation``;
    :class:`~proxy.memory.store.StoreBusyError` for a pool wait that ran out, also when
    another error wraps it (RedisVL wraps redis errors)."""
    caught: tuple[type[BaseException], ...] = (RedisError, *also)
    try:
        yield
    except caught as exc:
        exhausted = pool_exhausted(exc)
        if exhausted is not None:
            raise StoreBusyError(f"redis {operation}: {exhausted}") from exc
        raise StoreUnavailableError(f"redis {operation} failed: {exc}") from exc


def pool_exhausted(exc: BaseException | None) -> PoolExhaustedError | None:
    """The :class:`PoolExhaustedError` ``exc`` is or wraps."""
    while exc is not None:
        if isinstance(exc, PoolExhaustedError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.asynccontextmanager
async def within(seconds: float, operation: str) -> AsyncIterator[None]:
    """Run the block under a deadline of ``seconds``; past it
    :class:`~proxy.memory.store.StoreUnavailableError` naming ``operation`` (a Redis that
    stopped answering costs the caller that long, not the socket timeout)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as exc:
        raise StoreUnavailableError(f"redis {operation}: no reply within {seconds} s") from exc


async def transact(client: Redis, watch: Sequence[str],
                   body: Callable[[Pipeline], Awaitable[T]]) -> T:
    """Optimistic transaction: ``body`` gets a pipeline already watching ``watch``; it
    reads (immediate mode), calls :func:`multi`, queues writes and ``execute()``s. When a
    watched key changed meanwhile ``EXEC`` aborts and ``body`` runs again, up to
    :data:`MAX_WATCH_RETRIES` times; then :class:`StoreUnavailableError`."""
    for _ in range(MAX_WATCH_RETRIES):
        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(*watch)
                return await body(pipe)
            except WatchError:
                continue
    raise StoreUnavailableError(f"redis: gave up after {MAX_WATCH_RETRIES} conflicting "
                                "concurrent writes; retry later")


def multi(pipe: Pipeline) -> None:
    """Switch a watching pipeline from immediate reads to queued writes (``MULTI``)."""
    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
