"""HTTP helpers for routes: disconnect-aware awaiting and the OpenAI error response.

No ``BaseHTTPMiddleware`` anywhere: it hides ``http.disconnect`` from handlers (case B07).
Routes race upstream work against the client's disconnect with :func:`until_disconnected`;
once a stream has started, Starlette's ``StreamingResponse`` watches for the disconnect
and cancels the body generator, whose ``finally`` closes the upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from proxy.errors import InvalidRequestError, ProxyError, error_body

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that went away


class ClientDisconnectedError(Exception):
    """The client closed the connection before the reply was ready."""


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise
    :class:`ClientDisconnectedError`. Cancellation of the caller cancels ``work`` too."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        await _reap(watcher)
        return task.result()
    await _reap(task)
    raise ClientDisconnectedError


async def _reap(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait for it, without swallowing a cancellation of our own."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # the work's own failure no longer matters: nobody waits for it
        return


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing more than ``limit`` bytes with 413 before reading them all
    (Content-Length when sent, else counted while streaming in)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"The request body is larger than {limit} bytes (server.max_request_bytes).",
        code="request_too_large", status_code=413,
    )


def error_response(error: ProxyError, headers: Mapping[str, str] | None = None) -> Response:
    """The OpenAI error envelope with the error's status and headers (e.g. Retry-After)."""
    merged = {**error.headers, **(headers or {})}
    return Response(error_body(error), status_code=error.status_code,
                    media_type="application/json", headers=merged)
