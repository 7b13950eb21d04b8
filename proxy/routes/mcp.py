"""``/mcp``: the MCP server (streamable HTTP) for agents that manage memory themselves.

Injection stays the primary path on every protocol; the tools
(:mod:`proxy.routes.mcp_tools`: ``search_memories``, ``add_memory``, ``update_memory``,
``delete_memory``, ``get_profile``) serve agents that decide what to keep. Authentication
is the chat API's — ``Authorization: Bearer <gateway key>``, no OAuth — checked here, so a
missing or unknown key is a 401 (OpenAI's error shape, ``WWW-Authenticate: Bearer``)
before any MCP message is read.

The ``mcp`` SDK takes ~1.5 s to import (a quiet core; 3.5 s on a busy one) and ~28 MB: it
is imported in a thread once the app has started, not on the way to the first chat reply.
Until it is ready ``/mcp`` waits up to :data:`READY_TIMEOUT_SECONDS`, then answers 503; if
it cannot load, 503 with the reason logged (``mcp_unavailable``) — chat is never affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import Any

import structlog
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from proxy.errors import ProxyError
from proxy.http import error_response
from proxy.resources import Resources

log = structlog.get_logger("proxy.mcp")
READY_TIMEOUT_SECONDS = 30.0  # longest wait for the SDK's import on a request to /mcp
# The session manager's time to end its sessions at shutdown, then again once cancelled.
STOP_SECONDS = 5.0


class McpEndpoint:
    """The ASGI endpoint at ``/mcp``; :meth:`running` belongs in the app's lifespan."""

    def __init__(self) -> None:
        self._sessions: Any = None  # the SDK's StreamableHTTPSessionManager, once running
        self._ready = asyncio.Event()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Load the SDK and run its session manager in the background until the app stops."""
        stop = asyncio.Event()
        task = asyncio.create_task(self._serve(stop), name="mcp-sessions")
        try:
            yield
        finally:
            stop.set()
            _, running = await asyncio.wait({task}, timeout=STOP_SECONDS)
            if running:  # a session the SDK does not end: cancelled, still bounded
                log.warning("mcp_stop_timed_out", seconds=STOP_SECONDS)
                task.cancel()
                await asyncio.wait({task}, timeout=STOP_SECONDS)

    async def _serve(self, stop: asyncio.Event) -> None:
        try:
            tools = await asyncio.to_thread(importlib.import_module, "proxy.routes.mcp_tools")
            sessions = tools.session_manager()
            async with sessions.run():
                self._sessions = sessions
                self._ready.set()
                await stop.wait()
        except Exception:
            log.exception("mcp_unavailable")
        finally:
            self._sessions = None
            self._ready.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        try:
            res: Resources = request.app.state.resources
            res.keyring.authenticate(request.headers)
        except ProxyError as exc:
            await error_response(exc, headers={"WWW-Authenticate": "Bearer"}
                                 if exc.status_code == 401 else None)(scope, receive, send)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                await self._ready.wait()
        if self._sessions is None:
            unavailable = ProxyError("The MCP server is not available (see the gateway's log).",
                                     status_code=503, error_type="service_unavailable",
                                     code="mcp_unavailable")
            await error_response(unavailable)(scope, receive, send)
            return
        await self._sessions.handle_request(scope, receive, send)
