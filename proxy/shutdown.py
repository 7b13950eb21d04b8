"""Graceful shutdown: what a process does between SIGTERM and its exit.

On SIGTERM the server (:class:`proxy.server.GatewayServer`) stops accepting connections and
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


@dataclass(slots=True, eq=False)
class StreamWatch:
    """One open stream, as :class:`Drain` sees it: its task, and whether it is waiting for
    the upstream right now (``waiting``, set around each wait for the next chunk)."""

    task: asyncio.Task[Any] | None
    waiting: bool = False
    interrupted: bool = False  # set by Drain.expire when it cancelled the wait


class Drain:
    """Shutdown state of one process. ``grace_seconds``: how long in-flight streams may go
    on after :meth:`begin` (``server.shutdown_grace_seconds``).

    Streams register with :meth:`watch` (once per stream, not per chunk: a stream costs
    two attribute writes per chunk). When the grace expires, streams waiting for the
    upstream have that wait cancelled (``interrupted``); the others see ``expired`` before
    their next wait. Either way they end with an error event of their own."""

    def __init__(self, grace_seconds: float = DEFAULT_GRACE_SECONDS) -> None:
        self.grace_seconds = grace_seconds
        self.draining = False
        self.expired = False
        self._streams: set[StreamWatch] = set()
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
                 open_streams=len(self._streams))
        callbacks, self._on_begin = self._on_begin, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("shutdown_callback_failed")
        asyncio.get_running_loop().call_later(self.grace_seconds, self.expire)

    def expire(self) -> None:
        """The grace is over: cancel the upstream waits of open streams; later waits are
        refused (``expired``)."""
        self.expired = True
        if self._streams:
            log.warning("shutdown_grace_expired", ending_streams=len(self._streams))
        for stream in list(self._streams):
            if stream.waiting and stream.task is not None and not stream.interrupted:
                stream.interrupted = True
                stream.task.cancel()

    def watch(self) -> StreamWatch:
        """Register the current task's stream; :meth:`unwatch` it when the stream ends."""
        stream = StreamWatch(asyncio.current_task())
        self._streams.add(stream)
        return stream

    def unwatch(self, stream: StreamWatch) -> None:
        self._streams.discard(stream)
