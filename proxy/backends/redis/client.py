"""The one way the gateway builds a Redis client, and what every Redis user checks.

:func:`connect` returns a ``redis.asyncio.Redis`` that speaks RESP2 and returns bytes:
RedisVL parses RESP2 search replies only, and the stores decode values themselves
(embeddings are binary). The caller owns the client and closes it (``async with``); the
lifespan does this in :func:`proxy.resources.open_resources`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, WatchError

from proxy.memory.store import StoreUnavailableError

# Bounds on one command; the hot path has its own, shorter deadline (memory.recall_timeout_ms).
SOCKET_TIMEOUT_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 2.0
# Pool size per process: recall runs 3 commands at once per request; learning a few more.
MAX_CONNECTIONS = 64
# Optimistic transactions retry this often before giving up; each retry means another
# writer changed a watched key of the same user in the same few milliseconds.
MAX_WATCH_RETRIES = 16

T = TypeVar("T")


def connect(url: str) -> Redis:
    """A client for ``url`` (``redis://``, ``rediss://`` or ``unix://``), RESP2, bytes.

    No I/O happens until the first command. ``url`` options override the defaults here,
    so a URL with ``protocol=3`` or ``decode_responses=true`` is refused by
    :func:`require_resp2_bytes` (and ``protocol`` already by the settings).
    """
    client = Redis.from_url(
        url, protocol=2, decode_responses=False, socket_timeout=SOCKET_TIMEOUT_SECONDS,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, max_connections=MAX_CONNECTIONS,
    )
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
def unavailable_on_redis_error(operation: str) -> Iterator[None]:
    """Translate ``redis`` errors raised inside the block into
    :class:`~proxy.memory.store.StoreUnavailableError` naming ``operation``."""
    try:
        yield
    except RedisError as exc:
        raise StoreUnavailableError(f"redis {operation} failed: {exc}") from exc


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
