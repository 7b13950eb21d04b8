"""One structured access-log line per HTTP request, and the per-route HTTP metrics.

:class:`AccessLogMiddleware` is plain ASGI (no ``BaseHTTPMiddleware``: it would hide
``http.disconnect`` from handlers, and a client that went away must cancel the upstream call
— docs/design.md#streaming). It gives every request an id — the client's
``X-Request-Id`` when it is a plausible id (1–128 of ``A-Za-z0-9._:-``), else 32 hex
digits — returned in ``x-request-id`` unless the upstream's id is forwarded there already,
and when the response ends (a stream: its last byte) it

- counts ``memory_proxy_http_requests_total{route, method, status}`` and observes
  ``memory_proxy_http_request_seconds{route}`` (``route`` is the route template, e.g.
  ``/v1/memories/{memory_id}``, or ``unmatched``);
- logs ``http_request`` with ``request_id``, ``method``, ``route``, ``status``,
  ``duration_ms`` and what the handler filled in its :class:`AccessRecord` (chat:
  ``tenant``, ``user``, ``model``, ``stream``, ``memory`` status, ``injected`` count,
  ``ttft_ms``, stream ``outcome``). ``user`` follows ``server.access_log_user``: by default
  a hash (16 hex digits of SHA-256 over tenant and user id), never the id itself. No
  message, memory or key text is ever logged. Probes and scrapes (``/healthz``, ``/readyz``,
  ``/metrics``) log at debug level.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import uuid
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

import structlog
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.logs import json_line
from proxy.settings import ServerSettings

log = structlog.get_logger("proxy.access")
_stdlib_log = logging.getLogger("proxy.access")
SCOPE_KEY = "memory_proxy.access"
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(slots=True)
class AccessRecord:
    """What a handler tells the access log about its request (all optional)."""

    request_id: str
    tenant: str | None = None
    user: str | None = None
    model: str | None = None
    stream: bool | None = None
    memory: str | None = None
    injected: int | None = None
    ttft_ms: float | None = None
    outcome: str | None = None  # streams: ok | error | aborted


_RECORD_FIELDS = tuple(f.name for f in dataclass_fields(AccessRecord))


def access_record(request: Request) -> AccessRecord | None:
    """The request's record, when the middleware runs (``None`` in bare-app tests)."""
    record: AccessRecord | None = request.scope.get(SCOPE_KEY)
    return record


def user_field(tenant: str, user: str | None, mode: str) -> str | None:
    """The ``user`` value of the log line for ``server.access_log_user`` = ``mode``."""
    if user is None or mode == "off":
        return None
    if mode == "plain":
        return user
    return hashlib.sha256(f"{tenant}\x1f{user}".encode()).hexdigest()[:16]


class AccessLogMiddleware:
    """See the module docstring. ``settings``: ``server`` (``access_log``,
    ``access_log_user``). Metrics come from the app's resources once its lifespan ran."""

    def __init__(self, app: ASGIApp, *, settings: ServerSettings) -> None:
        self.app = app
        self._settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        given = _header(scope, b"x-request-id")
        record = AccessRecord(given if given and _REQUEST_ID.match(given)
                              else uuid.uuid4().hex)
        scope[SCOPE_KEY] = record
        status = 500  # an exception before the response started

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    headers.append((b"x-request-id", record.request_id.encode()))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self._finish(scope, record, status, time.perf_counter() - started)

    def _finish(self, scope: Scope, record: AccessRecord, status: int,
                seconds: float) -> None:
        route_obj = scope.get("route")
        route = getattr(route_obj, "path", None) or "unmatched"
        resources = getattr(getattr(scope.get("app"), "state", None), "resources", None)
        if resources is not None:
            metrics = resources.metrics
            metrics.http_requests.labels(route, scope["method"], str(status)).inc()
            metrics.http_request_seconds.labels(route).observe(seconds)
        if not self._settings.access_log:
            return
        fields: dict[str, Any] = {}
        for name in _RECORD_FIELDS:  # dataclasses.asdict costs ~15× this (deep copies)
            value = getattr(record, name)
            if value is not None:
                fields[name] = value
        fields["user"] = user_field(record.tenant or "", record.user,
                                    self._settings.access_log_user)
        if fields["user"] is None:
            del fields["user"]
        fields = {"method": scope["method"], "route": route, "status": status,
                  "duration_ms": round(seconds * 1000, 2), **fields}
        level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
        if not json_line(_stdlib_log, "http_request", fields, level=level):
            (log.debug if level == logging.DEBUG else log.info)("http_request", **fields)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            try:
                return str(value.decode("latin-1"))
            except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
                return None
    return None
