"""Graceful shutdown: what a process does between SIGTERM and its exit.

On SIGTERM the server (:class:`proxy.cli.GatewayServer`) stops accepting connections and
calls :meth:`Drain.begin`: ``/readyz`` answers 503 ``draining`` (load balancers stop sending),
the in-process learning worker is told to stop (it releases the job it holds at once, see
:meth:`proxy.learning.worker.Worker.run`), and in-flight requests go on. Streams still open
``server.shutdown_grace_seconds`` later are ended by the gateway itself with an SSE error
event (code ``server_shutting_down``) instead of being cut mid-frame, so a client can tell
a shutdown from a network failure and retry; uvicorn's own hard limit is the grace plus
:data:`HARD_STOP_MARGIN_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import anyio
import structlog

from proxy.errors import ProxyError

log = structlog.get_logger("proxy.shutdown")
# Seconds between the end of the grace (streams told to end) and uvicorn cancelling
# whatever is still running: the time to write the error event and close the upstream.
HARD_STOP_MARGIN_SECONDS = 5.0
DEFAULT_GRACE_SECONDS = 30.0


class ShuttingDownError(ProxyError):
    """The gateway is shutting down; the request may be retried on another instance."""

    status_code = 503
    error_type = "service_unavailable"
    default_code = "server_shutting_down"


class Drain:
    """Shutdown state of one process. ``grace_seconds``: how long in-flight streams may go
    on after :meth:`begin` (``server.shutdown_grace_seconds``)."""

    def __init__(self, grace_seconds: float = DEFAULT_GRACE_SECONDS) -> None:
        self.grace_seconds = grace_seconds
        self.draining = False
        self.expired = False
        self._scopes: set[anyio.CancelScope] = set()
        self._on_begin: list[Callable[[], None]] = []

    def on_begin(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (no arguments, on the event loop) when draining begins — at
        once if it already has."""
        if self.draining:
            callback()
        else:
            self._on_begin.append(callback)

    def begin(self) -> None:
        """Start draining (idempotent; called on the event loop): run the ``on_begin``
        callbacks and end open streams after the grace."""
        if self.draining:
            return
        self.draining = True
        log.info("shutdown_draining", grace_seconds=self.grace_seconds,
                 open_streams=len(self._scopes))
        callbacks, self._on_begin = self._on_begin, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("shutdown_callback_failed")
        asyncio.get_running_loop().call_later(self.grace_seconds, self.expire)

    def expire(self) -> None:
        """The grace is over: every wait inside :meth:`guard` is cancelled, and later ones
        are refused."""
        self.expired = True
        if self._scopes:
            log.warning("shutdown_grace_expired", ending_streams=len(self._scopes))
        for scope in list(self._scopes):
            scope.cancel()

    @contextlib.contextmanager
    def guard(self) -> Iterator[anyio.CancelScope]:
        """A cancel scope around one wait of a stream (for the next upstream chunk): it is
        cancelled when the grace expires — check ``scope.cancelled_caught`` after the
        block. Never yield to the client inside it."""
        scope = anyio.CancelScope()
        if self.expired:
            scope.cancel()
        with scope:
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)
